"""Speedup over ``layerwise`` across the variants of a sweep: ``python -m headsplit.compare RUN_DIR...``.

dit runs each sweep variant into its own run directory and its results parser sees one run at a time
(no hook across variants), so the comparison reads the finished runs: ``metadata.json`` (the sweep
point and the runtime block) and ``aggregate/summary.json`` (``tokens_per_s``). Variants are grouped
by their sweep point without the strategy and speculation (a swept whole ``runtime`` block counts
with those two fields left out, and a block's ``repeat`` kept: a second timing of a configuration is
compared with the layer-wise run of the same repeat); in each group the ``layerwise`` run without
speculation is the baseline and every run's speedup is its tokens/s over the baseline's. The ``network`` column says
what applied each run's added RTT (``metadata.json`` → ``conditions.<device>.netem``): ``netem``,
``userspace`` (the link emulator, where the kernel has no ``sch_netem``), ``recorded`` (logged, not
applied: its RTT column measures no added delay) or ``none``.

Fidelity (issue 32, item 6): every run's generated ids (``aggregate/hs_generated.json``) are compared
with those of an exact run of the same model, prompt and length (no speculation, or tau = 0: the ids
of single-process greedy decoding): the agreement is the share of the exact run's positions where the
ids are equal, with the first position that differs. Beside it, the ``perplexity`` column: the
teacher-forced perplexity of the held-out paragraph under the run's own configuration
(``aggregate/hs_quality.json``, written for a block with ``perplexity: true``; ``-`` without).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headsplit.config import DEFAULT_TAU

BASELINE = "layerwise"
_CHOICE = ("strategy", "speculation")


@dataclass(frozen=True)
class Variant:
    path: Path
    label: str
    strategy: str
    speculation: bool
    others: str  # the sweep point without strategy/speculation, as canonical JSON (the group key)
    tokens_per_s: float | None
    oom_token: int | None
    speedup: float | None = None
    network: str = "none"  # what applied the added RTT: netem, userspace, recorded (several: joined by +)
    ids: tuple[int, ...] | None = None
    exact: bool = False  # no speculation, or tau = 0: greedy decoding's own ids
    fidelity_key: str = ""  # model, prompt, tokens: which runs' ids are comparable
    agreement: float | None = None
    first_difference: int | None = None
    perplexity: float | None = None  # of the held-out paragraph (hs_quality.json), None: not measured
    control: str = "rpc"  # how the run drove its tokens (a run of before the field: rpc)
    repeat: int = 1  # which timing of its configuration (the block's ``repeat``: part of ``others``)
    configuration: str = ""  # ``others`` without any repeat: what a configuration's repeats share


class CompareError(ValueError):
    """A run directory that cannot be compared; the message names the file and the field."""


def _read(path: Path) -> Mapping[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CompareError(f"{path}: cannot be read ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(doc, Mapping):
        raise CompareError(f"{path}: the top level is not a mapping")
    return doc


def _others(point: Iterable[Any], any_repeat: bool = False) -> str:
    """The sweep point without strategy and speculation, as canonical JSON: a first repeat is the run
    without one (layer-wise's repeat 1 is every strategy's baseline); ``any_repeat``: every repeat left
    out (the configuration its repeats share)."""

    def dropped(field: str, value: Any) -> bool:
        return field in _CHOICE or (field == "repeat" and (any_repeat or value == 1))

    kept: list[list[Any]] = []
    for entry in point:
        path, value = entry
        if path.startswith("runtime.") and dropped(path.removeprefix("runtime."), value):
            continue
        if path == "runtime" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if not dropped(k, v)}
        kept.append([path, value])
    return json.dumps(kept, sort_keys=True)


def network_backends(meta: Mapping[str, Any]) -> str:
    """How a run's network conditions were applied, from its ``metadata.json`` (module docstring)."""
    conditions = meta.get("conditions")
    found: set[str] = set()
    for per_host in conditions.values() if isinstance(conditions, Mapping) else ():
        netem = per_host.get("netem") if isinstance(per_host, Mapping) else None
        if not isinstance(netem, Mapping):
            continue
        chosen = str(netem.get("netem_backend") or "netem")
        if chosen != "userspace":  # auto unsettled, or a run from before the backends: netem's tree
            chosen = "recorded" if netem.get("netem_dry_run") else "netem"
        found.add(chosen)
    return "+".join(sorted(found)) or "none"


def load_variant(run: Path) -> Variant:
    meta = _read(run / "metadata.json")
    scenario = meta.get("scenario")
    runtime = meta.get("runtime")
    if not isinstance(scenario, Mapping) or not isinstance(runtime, Mapping):
        raise CompareError(f"{run / 'metadata.json'}: scenario or runtime: missing")
    block = runtime.get("block")
    if runtime.get("name") != "headsplit" or not isinstance(block, Mapping):
        raise CompareError(f"{run / 'metadata.json'}: runtime.name: {runtime.get('name')!r} is not headsplit")
    point = scenario.get("sweep_point") or []
    if not isinstance(point, list) or not all(isinstance(p, list) and len(p) == 2 for p in point):
        raise CompareError(f"{run / 'metadata.json'}: scenario.sweep_point: not a list of [path, value]")
    values = {
        v.get("name"): v.get("value")
        for v in _read(run / "aggregate" / "summary.json").get("values", [])
        if isinstance(v, Mapping)
    }
    rate = values.get("tokens_per_s")
    oom = values.get("oom_token")
    ids = None
    gen_file = run / "aggregate" / "hs_generated.json"
    if gen_file.is_file():
        raw = _read(gen_file).get("ids")
        if not isinstance(raw, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
            raise CompareError(f"{gen_file}: ids: not a list of token ids")
        ids = tuple(raw)
    perplexity = None
    quality_file = run / "aggregate" / "hs_quality.json"
    if quality_file.is_file():
        value = _read(quality_file).get("perplexity")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise CompareError(f"{quality_file}: perplexity: {value!r} is not a number")
        perplexity = float(value)
    speculation = bool(block.get("speculation", False))
    key = json.dumps([block.get("model", "gpt2-tiny"), block.get("prompt"), block.get("tokens")])
    return Variant(
        path=run,
        label=str(scenario.get("label", run.name)),
        strategy=str(block.get("strategy", "greedy")),
        speculation=speculation,
        others=_others(point),
        configuration=_others(point, any_repeat=True),
        tokens_per_s=float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else None,
        oom_token=int(oom) if isinstance(oom, int) and not isinstance(oom, bool) else None,
        network=network_backends(meta),
        ids=ids,
        exact=not speculation or float(block.get("tau", DEFAULT_TAU)) == 0.0,
        fidelity_key=key,
        perplexity=perplexity,
        control=str(values.get("control") or block.get("control") or "rpc"),
        repeat=_repeat(block.get("repeat", 1)),
    )


def _repeat(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def run_dirs(paths: Sequence[Path]) -> list[Path]:
    """Run directories (with ``metadata.json``) given directly or found below the given directories."""
    found: list[Path] = []
    for path in paths:
        if (path / "metadata.json").is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p.parent for p in path.glob("**/metadata.json")))
        else:
            raise CompareError(f"{path}: not a directory")
    return list(dict.fromkeys(found))


def compare(variants: Sequence[Variant]) -> list[Variant]:
    """Every variant with its speedup over the ``layerwise`` variant of the same other sweep values."""
    baselines: dict[str, float] = {}
    for v in variants:
        if v.strategy == BASELINE and not v.speculation and v.tokens_per_s and v.oom_token is None:
            baselines.setdefault(v.others, v.tokens_per_s)
    exact: dict[str, tuple[int, ...]] = {}
    for v in variants:
        if v.exact and v.ids is not None and v.oom_token is None:
            exact.setdefault(v.fidelity_key, v.ids)
    out = []
    for v in variants:
        base = baselines.get(v.others)
        speedup = (
            v.tokens_per_s / base if base and v.tokens_per_s is not None and v.oom_token is None else None
        )
        agreement, first = _agreement(exact.get(v.fidelity_key), v.ids)
        out.append(Variant(**{**v.__dict__, "speedup": speedup, "agreement": agreement,
                              "first_difference": first}))  # fmt: skip
    return out


def _agreement(ref: tuple[int, ...] | None, ids: tuple[int, ...] | None) -> tuple[float | None, int | None]:
    """Share of ``ref``'s positions where ``ids`` has the same token, and the first that differs."""
    if not ref or ids is None:
        return None, None
    same = [i < len(ids) and ids[i] == t for i, t in enumerate(ref)]
    return sum(same) / len(ref), next((i for i, ok in enumerate(same) if not ok), None)


def render(rows: Sequence[Variant]) -> str:
    header = (
        "variant",
        "strategy",
        "speculation",
        "control",
        "network",
        "tokens/s",
        "speedup",
        "agreement",
        "perplexity",
    )
    body = [
        (
            r.label,
            r.strategy,
            "yes" if r.speculation else "no",
            r.control,
            r.network,
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.2f}",
            (f"oom at token {r.oom_token}" if r.oom_token is not None else "-")
            if r.speedup is None
            else f"{r.speedup:.2f}x",
            "-" if r.agreement is None else f"{100 * r.agreement:.1f}%",
            "-" if r.perplexity is None else f"{r.perplexity:.3f}",
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in (header, *body)) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)) for row in (header, *body)
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m headsplit.compare",
        description="Speedup of every variant of a HeadSplit sweep over its layerwise variant.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, or directories holding them")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        rows = compare([load_variant(run) for run in run_dirs(args.runs)])
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("error: no run directories found", file=sys.stderr)
        return 2
    if args.json:
        doc = [
            {"run": str(r.path), "label": r.label, "strategy": r.strategy, "speculation": r.speculation,
             "control": r.control, "network": r.network, "tokens_per_s": r.tokens_per_s, "oom_token": r.oom_token,
             "speedup": r.speedup, "agreement": r.agreement, "first_difference": r.first_difference,
             "perplexity": r.perplexity}
            for r in rows
        ]  # fmt: skip
        print(json.dumps(doc, indent=2))
    else:
        print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
