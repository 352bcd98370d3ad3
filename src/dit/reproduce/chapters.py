"""What each chapter runs: scenario variants at a size (``quick`` or ``full``).

``quick`` finishes within minutes on a 2-core machine in local mode or on the emulated rack: Chapter 4
with AlexNet's fake stand-in (its 11 stages and cut sizes, the model the quickstart runs), one profiling
pass, five partition points and one load process per loaded device. ``full`` is the shipped scenario as
the article ran it (``scenarios/ch4_validation.yaml``: AlexNet itself, five repetitions, 50 inference
rounds per point), meant for the real rack.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from dit.paths import content_root
from dit.scenario import Scenario, expand

Size = Literal["quick", "full"]
SIZES: Final = ("quick", "full")
CHAPTERS: Final = ("ch4", "ch5", "ch6")


class ChapterError(Exception):
    """A chapter or size that does not exist, or a shipped scenario that cannot be read."""


@dataclass(frozen=True)
class Plan:
    """A chapter's variants to run, and what was reduced for the size (said in the report)."""

    chapter: str
    size: Size
    variants: tuple[Scenario, ...]
    reductions: tuple[str, ...]
    not_run: tuple[str, ...] = ()  # parts of the chapter this machine cannot measure, and why


def _shipped(name: str) -> dict[str, Any]:
    path = content_root() / "scenarios" / f"{name}.yaml"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ChapterError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ChapterError(f"{path}: not a mapping")
    return doc


def ch4_document(size: Size) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Chapter 4's scenario at ``size`` and the reductions made for it."""
    doc = _shipped("ch4_validation")
    if size == "full":
        return doc, ()
    quick = copy.deepcopy(doc)
    quick["model"] = {"name": "fake", "params": {"profile": "alexnet"}}
    quick["repetitions"] = 1
    inference: Mapping[str, Any] = quick.get("inference") or {}
    quick["inference"] = {**inference, "repetitions": 3}
    load: Mapping[str, Mapping[str, Any]] = quick.get("load") or {}
    quick["load"] = {device: {**block, "processes": 1} for device, block in load.items()}
    reductions = (
        "AlexNet's fake stand-in (its 11 stages and cut sizes, timed by a calibrated busy loop) instead of "
        "AlexNet itself",
        "1 profiling repetition instead of 5; 3 inference rounds per partition point instead of 50",
        "1 load process on each loaded device instead of 1, 2 and 3",
    )
    return quick, reductions


def ch5_document(size: Size) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Chapter 5's decoder profile: TinyLlama generating tokens on one device with the per-head hooks
    (the layers runtime, docs/models.md), whole for ``full``, two of its 22 layers for ``quick``."""
    params: dict[str, Any] = {"prompt_len": 8}
    tokens = 32
    reductions: tuple[str, ...] = ()
    if size == "quick":
        params["num_layers"] = 2
        tokens = 8
        reductions = (
            "TinyLlama with 2 of its 22 decoder layers (per-layer and per-head costs are per layer; the "
            "weights are seeded, not trained: timing does not depend on them)",
            "8 generated tokens instead of 32, 1 repetition",
        )
    doc = {
        "name": "ch5_decoder_profile",
        "description": "Chapter 5: per-head, projection and FFN costs of a decoder layer per token",
        "model": {"name": "tinyllama", "params": params},
        "devices": ["device1"],
        "repetitions": 1 if size == "quick" else 3,
        "warmup": 1,
        "seed": 2024,
        "runtime": {"name": "layers", "tokens": tokens},
        "inference": {"enabled": False},
        "optimisation": {"enabled": False},
        "timing": {"start_lead_s": 5},
    }
    return doc, reductions


def ch6_tolerance_document(size: Size) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Chapter 6's tolerance sweep (greedy + speculation, tau 0 / 0.02 / 0.05 / 0.10) at ``size``."""
    doc = _shipped("ch6_tolerance")
    if size == "full":
        return doc, ()
    quick = copy.deepcopy(doc)
    # The held-out perplexity is a teacher-forced pass over the paragraph, one decode step per position:
    # on the emulated rack about 93 s per variant against 3.5 s for the 16 tokens, and on the reduced
    # model's seeded weights it says nothing of fidelity (the tokens as at tau = 0 still do)
    quick["runtime"] = {**quick["runtime"], "tokens": 16, "perplexity": False}
    # Each variant costs about 40 s on the emulated rack, 25 s of it orchestration: the two ends of the
    # article's values keep the quick size near 10 minutes there (ch6's speculation row is tau 0.05)
    quick["sweep"] = {**quick["sweep"], "values": [0, 0.10]}
    return quick, (
        "the tolerance sweep: tau 0 and 0.10 instead of 0, 0.02, 0.05 and 0.10",
        "the tolerance sweep: 16 tokens instead of 64",
        "the tolerance sweep: no held-out perplexity (a pass over the paragraph costs about 25 times the "
        "16 tokens, and the reduced model's seeded weights give it no meaning; the tokens as at tau = 0 "
        "are the fidelity measured)",
    )


# The memory pair's emulated pressure: quick, re-placement after token 4 and a static placement's
# out-of-memory after token 10 of 16; full, after tokens 256 and 400 of 512 (the article's static
# placement "ran out of memory beyond roughly 400 tokens"; it gives no token for its re-placements)
MEMORY_PRESSURE: Final = {
    "quick": {"tokens": 16, "replace_at": 4, "full_at": 10},
    "full": {"tokens": 512, "replace_at": 256, "full_at": 400},
}


def ch6_memory_document(size: Size) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Chapter 6's memory pair: greedy with re-placement and the same run with a static placement, one
    worker under emulated memory pressure (``runtime.memory_pressure``, docs/headsplit.md)."""
    sizes = MEMORY_PRESSURE[size]
    model = "tinyllama-half" if size == "quick" else "tinyllama"
    pressure = {"replace_at": sizes["replace_at"], "full_at": sizes["full_at"]}
    block = {"name": "headsplit", "strategy": "greedy", "speculation": False, "model": model,
             "tokens": sizes["tokens"], "memory_pressure": pressure}  # fmt: skip
    doc = {
        "name": "ch6_memory",
        "description": "HeadSplit greedy under memory pressure: re-placement against a static placement",
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": ["device1", "device2", "device3", "device4"],
        "repetitions": 1,
        "seed": 2026,
        "inference": {"enabled": False},
        "runtime": {"name": "headsplit"},
        "sweep": [{"path": "runtime", "values": [block, {**block, "replacement": False}]}],
    }
    if size == "full":
        return doc, ()
    return doc, (
        "memory: tinyllama-half, 16 tokens instead of TinyLlama's 512; the emulated pressure passes the "
        "threshold after token 4 and the limit after token 10 (after 256 and 400 of 512 at full size)",
    )


#: Chapter 6's model in both sizes (issue 47): TinyLlama's own geometry (22 layers, 32 query heads of 64,
#: 4 KV heads, hidden 2048, FFN 5632), seeded weights: the timing is the model's, the tokens are not
#: TinyLlama's. The quick size generates fewer tokens; full the article's 256.
CH6_MODEL: Final = "tinyllama"
CH6_TOKENS: Final = {"quick": 16, "full": 256}
#: Each worker's memory limit: the article's boards had 4 GB; 2 GB holds the layer-wise and greedy
#: placements of TinyLlama on 4 workers (dit validate states each worker's need against it).
CH6_WORKER_MEMORY_MB: Final = 2048


def ch6_document(size: Size, local: bool) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Chapter 6's sweep at ``size``: every strategy on TinyLlama's geometry; the added RTT where it can be
    applied."""
    doc = copy.deepcopy(_shipped("ch6_headsplit"))
    sweep = list(doc["sweep"])
    tokens = CH6_TOKENS[size]
    runtime_axis = {
        **sweep[0],
        "values": [{**v, "model": CH6_MODEL, "tokens": tokens} for v in sweep[0]["values"]],
    }
    network_axis = sweep[1]
    doc["hardware"] = {d: {"memory_limit_mb": CH6_WORKER_MEMORY_MB} for d in doc["devices"]}
    doc["sweep"] = [runtime_axis, network_axis]
    reductions = [
        "TinyLlama's geometry with seeded weights (the article's trained TinyLlama is not carried by the "
        "mirror): the timing is the model's, the tokens are not"
    ]
    if size == "full":
        return doc, tuple(reductions)
    reductions[0] += f"; {tokens} tokens instead of the article's 256"
    if local:
        # In local mode every worker shares this machine's cores (no quota per device): the RTT
        # columns and the strategies' capacities belong on a rack whose quotas fit
        doc["sweep"] = [runtime_axis]
        reductions.append(
            "no added RTT in local mode: the workers share this machine's cores without a quota each, so "
            "the columns would measure the machine, not the boards (run with --where rack for them)"
        )
    else:
        doc["sweep"] = [
            runtime_axis,
            {**network_axis, "values": [network_axis["values"][0], network_axis["values"][2]]},
        ]
        reductions.append(
            "added RTT 0 and 15 ms instead of 0, 5, 15, 25 and 50 ms (per-token time is linear in the added "
            "delay: the overtaking RTT is where the strategies' lines through the two columns cross)"
        )
    return doc, tuple(reductions)


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
    if importlib.util.find_spec("dit_llamacpp") is None:
        return (
            "llama.cpp RPC: the llamacpp-rpc runtime is not installed here (pip install ./runtimes/llamacpp)"
        )
    from dit_llamacpp import build

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


def ch6_llamacpp_document(size: Size, network_axis: Mapping[str, Any] | None) -> dict[str, Any]:
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


def plan(chapter: str, size: Size, local: bool = True) -> Plan:
    """The variants of ``chapter`` at ``size`` (:class:`ChapterError` for an unknown chapter or size);
    ``local``: in local mode (what local mode cannot apply is left out and said)."""
    if size not in SIZES:
        raise ChapterError(f"--size: {size!r} is not one of {', '.join(SIZES)}")
    if chapter not in CHAPTERS:
        raise ChapterError(f"CHAPTER: {chapter!r} is not one of {', '.join(CHAPTERS)}")
    if chapter == "ch4":
        doc, reductions = ch4_document(size)
        return Plan(chapter, size, tuple(expand(doc)), reductions)
    missing = [name for name in ("torch", "headsplit") if importlib.util.find_spec(name) is None]
    if chapter == "ch5":
        missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if chapter == "ch5" and not missing:
        doc, reductions = ch5_document(size)
        return Plan(chapter, size, tuple(expand(doc)), reductions)
    if chapter == "ch6" and not missing:
        doc, reductions = ch6_document(size, local)
        tolerance, tau_reductions = ch6_tolerance_document(size)
        memory, memory_reductions = ch6_memory_document(size)
        variants = (*expand(doc), *expand(tolerance), *expand(memory))
        why_not = llamacpp_missing(quants=LLAMACPP_QUANTS[size])
        if why_not is None:
            network = next((axis for axis in doc["sweep"] if axis.get("path") == "network"), None)
            variants += tuple(expand(ch6_llamacpp_document(size, network)))
            reductions += (f"llama.cpp RPC on {LLAMACPP_MODEL} (the runtime has no GGUF of tinyllama-half)",)
        return Plan(
            chapter,
            size,
            variants,
            (*reductions, *tau_reductions, *memory_reductions),
            () if why_not is None else (why_not,),
        )
    why = (
        f"{'Chapter 5' if chapter == 'ch5' else 'Chapter 6'} measures decoders with PyTorch, and "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed here "
        + (
            "(pip install -e '.[llm]')"
            if chapter == "ch5"
            else "(pip install -e '.[llm]'; pip install ./runtimes/headsplit)"
        )
    )
    return Plan(chapter, size, (), (), (why,))


def default_out(chapter: str) -> Path:
    return Path("reproduce") / chapter
