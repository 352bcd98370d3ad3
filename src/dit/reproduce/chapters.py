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
from dit.runtime_api import registry
from dit.runtime_api.chapters import ChapterRequest, chapter_plan_of
from dit.scenario import Scenario, expand

Size = Literal["quick", "full"]
SIZES: Final = ("quick", "full")
CHAPTERS: Final = ("ch4", "ch5", "ch6")


#: The runtimes whose variants a chapter measures: without one of them the chapter runs nothing.
CHAPTER_RUNTIMES: Final[Mapping[str, tuple[str, ...]]] = {"ch6": ("headsplit",)}


@dataclass(frozen=True)
class AbsentRuntime:
    """A runtime a chapter sets beside its own when installed; when it is not, its row says so."""

    why: str  # the chapter's "not measured here" sentence
    title: str  # its section's title and anchor, and the row's first cell
    anchor: str
    label: str
    rank: int  # where its section sits among the runtimes' (docs/runtimes.md)


#: Chapter 6 sets llama.cpp's RPC beside HeadSplit (issue 37).
ABSENT_RUNTIMES: Final[Mapping[str, Mapping[str, AbsentRuntime]]] = {
    "ch6": {
        "llamacpp-rpc": AbsentRuntime(
            "llama.cpp RPC: the llamacpp-rpc runtime is not installed here (pip install ./runtimes/llamacpp)",
            "llama.cpp RPC beside HeadSplit",
            "llamacpp",
            "llama.cpp RPC",
            40,
        )
    }
}


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


def shipped_document(name: str) -> dict[str, Any]:
    """``scenarios/<name>.yaml`` as a mapping (:class:`ChapterError` when it cannot be read)."""
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
    doc = shipped_document("ch4_validation")
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
    if chapter == "ch5":
        missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    else:
        missing = [name for name in ("torch",) if importlib.util.find_spec(name) is None]
        missing += [name for name in CHAPTER_RUNTIMES[chapter] if name not in registry.installed()]
    if chapter == "ch5" and not missing:
        doc, reductions = ch5_document(size)
        return Plan(chapter, size, tuple(expand(doc)), reductions)
    if chapter == "ch6" and not missing:
        return _runtimes_plan(chapter, size, local)
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


def _runtimes_plan(chapter: str, size: Size, local: bool) -> Plan:
    """The chapter's variants as its runtimes plan them (every installed runtime asked in the registry's
    order); a runtime the chapter sets beside the others but which is not installed is said, not run."""
    documents: list[Mapping[str, Any]] = []
    reductions: list[tuple[int, str]] = []
    not_run: list[str] = []
    for runtime in registry.installed().values():
        part = chapter_plan_of(runtime, ChapterRequest(chapter, size, local, tuple(documents)))
        if part is not None:
            documents += part.documents
            reductions += part.reductions
            not_run += part.not_run
    for name, absent in ABSENT_RUNTIMES.get(chapter, {}).items():
        if name not in registry.installed():
            not_run.append(absent.why)
    variants = tuple(v for doc in documents for v in expand(doc))
    ordered = tuple(text for _, text in sorted(reductions, key=lambda ranked: ranked[0]))
    return Plan(chapter, size, variants, ordered, tuple(not_run))


def default_out(chapter: str) -> Path:
    return Path("reproduce") / chapter
