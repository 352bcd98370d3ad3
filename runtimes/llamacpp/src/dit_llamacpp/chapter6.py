"""llama.cpp's part of ``dit reproduce ch6``: its RPC backend beside HeadSplit's strategies.

The core's chapter asks every runtime what it adds (``chapter_plan`` and ``chapter_sections`` of
:class:`dit_llamacpp.dit_runtime.LlamaCppRpcRuntime`, docs/runtimes.md); this module answers for llama.cpp:
its trained model per weight type over the same added RTTs as HeadSplit's sweep, and their row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from dit import units
from dit.report.section import Section
from dit.reproduce.ch6 import added_rtt_ms, energy_cells, summary_values
from dit.reproduce.context import verdict_table
from dit.runtime_api.chapters import ChapterPlan, ChapterRequest, ChapterRuns, ChapterSections
from dit.units import MISSING
from dit_llamacpp import build

#: Where llama.cpp's row sits among Chapter 6's sections: after HeadSplit's measured token, before its
#: tolerance sweep.
RANK: Final = 40
SCENARIO: Final = "ch6_llamacpp"


def chapter_plan(request: ChapterRequest) -> ChapterPlan | None:
    """Chapter 6's llama.cpp variants over the added RTTs of the sweep planned before (HeadSplit's), or
    why they cannot run here (None for any other chapter)."""
    if request.chapter != "ch6":
        return None
    quants = LLAMACPP_QUANTS["full" if request.size == "full" else "quick"]
    why_not = llamacpp_missing(quants=quants)
    if why_not is not None:
        return ChapterPlan(not_run=(why_not,))
    sweeps = [axis for doc in request.planned for axis in doc.get("sweep") or () if isinstance(axis, Mapping)]
    # every added RTT planned before, once each in their order (HeadSplit's columns span documents)
    columns: list[Any] = []
    for axis in sweeps:
        if axis.get("path") == "network":
            columns += [v for v in axis.get("values") or () if v not in columns]
    network = {"path": "network", "values": columns} if columns else None
    reduction = f"llama.cpp RPC on {LLAMACPP_MODEL} (the runtime has no GGUF of tinyllama-half)"
    return ChapterPlan((ch6_llamacpp_document(request.size, network),), ((RANK, reduction),))


def chapter_sections(runs: ChapterRuns) -> ChapterSections | None:
    """Chapter 6's llama.cpp row (None for any other chapter)."""
    if runs.chapter != "ch6":
        return None
    not_run = next((w for w in runs.not_run if "llama.cpp" in w), None)
    return ChapterSections(((RANK, llamacpp_section(list(runs.finished.get(SCENARIO, ())), not_run)),))


#: llama.cpp's RPC beside HeadSplit (issue 37): the trained model the llamacpp-rpc runtime runs (it has no
#: GGUF of HeadSplit's tinyllama-half), the weight types per size, and where its files are looked for.
LLAMACPP_MODEL: Final = "smollm2-135m"
LLAMACPP_QUANTS: Final = {"quick": ("F32",), "full": ("F32", "Q8_0", "Q4_1")}
LLAMACPP_MODELS_DIR: Final = Path("/var/cache/dit/gguf")
PROMPT: Final = "The capital of France is"  # scenarios/ch6_smollm2.yaml's


def llamacpp_missing(
    models_dir: Path = LLAMACPP_MODELS_DIR, quants: tuple[str, ...] = ("F32",)
) -> str | None:
    """Why llama.cpp's row cannot be measured here (not installed, not built, its GGUF not made), or None."""
    if build.lookup() is None:
        return (
            "llama.cpp RPC: not built here (dit runtimes act llamacpp-rpc build; it builds from the mirror's "
            "llama-cpp-python sdist, docs/llamacpp.md)"
        )
    absent = [q for q in quants if not (models_dir / f"{LLAMACPP_MODEL}-{q}.gguf").is_file()]
    if absent:
        return (
            f"llama.cpp RPC: no {LLAMACPP_MODEL} GGUF ({', '.join(absent)}) in {models_dir} "
            f"(python -m dit_llamacpp.models convert {LLAMACPP_MODEL} {' '.join(absent)} --out {models_dir})"
        )
    return None


def ch6_llamacpp_document(size: str, network_axis: Mapping[str, Any] | None) -> dict[str, Any]:
    """llama.cpp's RPC on HeadSplit's four workers with the controller on the edge server, per weight
    type of ``size``, over the same added RTTs as HeadSplit's sweep (``network_axis``; None: none)."""
    tokens = 16 if size == "quick" else 64
    runtime_axis = {
        "path": "runtime",
        "values": [
            {"name": "llamacpp-rpc", "model": LLAMACPP_MODEL, "quant": q, "tokens": tokens, "prompt": PROMPT}
            for q in LLAMACPP_QUANTS[size]
        ],
    }
    return {
        "name": "ch6_llamacpp",
        "description": f"llama.cpp RPC beside HeadSplit: {LLAMACPP_MODEL}, 4 workers, controller on the edge.",
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": ["device1", "device2", "device3", "device4"],
        "repetitions": 1,
        "seed": 2026,
        "inference": {"enabled": False},
        "runtime": {"name": "llamacpp-rpc"},
        "sweep": [runtime_axis] if network_axis is None else [runtime_axis, dict(network_axis)],
    }


def llamacpp_section(run_dirs: list[Path], not_run: str | None) -> Section:
    """llama.cpp's RPC runs beside HeadSplit's strategies: tokens/s, per-token latency and bytes moved per
    weight type and added RTT; ``not_run`` says why there are none (llama.cpp not built here, ...)."""
    section = Section("llama.cpp RPC beside HeadSplit", "llamacpp")
    rows: list[list[str]] = []
    for run in run_dirs:
        try:
            meta = json.loads((run / "metadata.json").read_text(encoding="utf-8"))
            block = meta["runtime"]["block"]
            point = meta.get("scenario", {}).get("sweep_point") or []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            rows.append([run.name, f"unreadable: {exc}", MISSING, MISSING, MISSING])
            continue
        values = summary_values(run)
        tps, latency = values.get("tokens_per_s"), values.get("token_latency_mean")
        cells = [MISSING if not isinstance(tps, int | float) else f"{tps:.2f} tokens/s"]
        if isinstance(latency, int | float):
            cells.append(f"{latency / 1e6:.1f} ms per token after the first")
        cells.append(_llamacpp_bytes(run, values.get("bytes_per_token")))
        added = added_rtt_ms(json.dumps(point))
        model = block.get("model", "?")
        rows.append(
            [
                f"llama.cpp RPC, {model} {block.get('quant', 'F32')}, +{added:g} ms",
                ", ".join(cells) + energy_cells(run, values),
                MISSING,
                "no figure: the article did not run llama.cpp",
                f"beside HeadSplit, not against it: {model} here, HeadSplit's sweep runs its own model "
                "(the llamacpp-rpc runtime has no GGUF of it)",
            ]
        )
    if not rows:
        rows.append(["llama.cpp RPC", not_run or "no finished run", MISSING, MISSING, MISSING])
    verdict_table(section, rows)
    section.note = (
        "llama.cpp's RPC backend (docs/llamacpp.md) on the same four workers, every layer offloaded over "
        "--rpc, the controller on the edge server; tokens/s counts the prefill as HeadSplit's does. Bytes "
        "moved per token: the TCP payload through the rpc-servers' connections after the weights' upload "
        "(the kernel's per-socket counters, both directions; docs/llamacpp.md, Results), per generated token "
        "as HeadSplit's rows count theirs."
    )
    return section


def _description(run: Path, name: str) -> str:
    """The summary value's description ("" where there is none)."""
    try:
        doc = json.loads((run / "aggregate" / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    for value in doc.get("values", []):
        if isinstance(value, dict) and value.get("name") == name:
            return str(value.get("description") or "")
    return ""


def _llamacpp_bytes(run: Path, moved: Any) -> str:
    """The llama.cpp row's bytes moved per token, or why there is no figure: the run's own reason
    ("... (not measured: <reason>)"), or a run aggregated before the rpc-servers' TCP bytes were counted
    (its figure came from per-process I/O counters, which miss send/recv)."""
    text = _description(run, "bytes_per_token")
    marker = "(not measured: "
    if marker in text:
        return "bytes moved not measured: " + text[text.index(marker) + len(marker) :].removesuffix(")")
    if not isinstance(moved, int | float):
        return "bytes moved not measured"
    if "TCP" not in text:
        return "bytes moved not measured: aggregated before the rpc-servers' TCP bytes were counted"
    return f"{units.size(moved)} moved per token"
