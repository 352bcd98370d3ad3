"""What a chapter of ``dit reproduce`` is: its plan (scenario variants at a size) and its report sections.

A chapter is one module (``dit.reproduce.ch4``, ``ch5``, ``ch6``) that ends with a :class:`Chapter`; the
registry (:mod:`dit.reproduce.chapters`) lists them, and the command and the report ask it by name. A
runtime adds variants and sections to a chapter through its own hooks (``chapter_plan``,
``chapter_sections``, :mod:`dit.runtime_api.chapters`), which :func:`runtimes_plan` and
:func:`runtimes_sections` ask in the registry's order.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from dit.paths import content_root
from dit.report.section import Section
from dit.reproduce.context import Context, verdict_table
from dit.reproduce.execute import VariantOutcome
from dit.runtime_api import registry
from dit.runtime_api.chapters import ChapterRequest, ChapterRuns, chapter_plan_of, chapter_sections_of
from dit.scenario import Scenario, expand
from dit.units import MISSING

Size = Literal["quick", "full"]
SIZES: Final = ("quick", "full")


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


@dataclass(frozen=True)
class AbsentRuntime:
    """A runtime a chapter sets beside its own when installed; when it is not, its row says so."""

    why: str  # the chapter's "not measured here" sentence
    title: str  # its section's title and anchor, and the row's first cell
    anchor: str
    label: str
    rank: int  # where its section sits among the runtimes' (docs/runtimes.md)


@dataclass(frozen=True)
class Finished:
    """A chapter's invocation once its variants ran, as its report sections read it; a section may say
    how the runs' network was applied in ``ctx.network``."""

    ctx: Context
    plan: Plan
    outcomes: Sequence[VariantOutcome]
    out: Path

    def finished_runs(self) -> list[Path]:
        """The run directories of the variants that finished (completed or degraded)."""
        return [
            o.run_dir for o in self.outcomes if o.run_dir is not None and o.state in ("completed", "degraded")
        ]

    def not_measured(self) -> str:
        return "; ".join(self.plan.not_run) or "see the variants above"


@dataclass(frozen=True)
class Chapter:
    """One chapter: its name (``ch4``), the report's title, what it runs at a size (``plan(size, local)``;
    ``local``: in local mode) and the sections its report shows after the overview. ``runtimes``: the
    runtimes it cannot run without; ``absent``: runtimes it sets beside them when installed;
    ``fitting_quotas``: it sets strategies side by side, so on the emulated rack it runs only where the
    devices' quotas fit the CPUs they share (each device's capacity is then its own)."""

    name: str
    title: str
    plan: Callable[[Size, bool], Plan]
    sections: Callable[[Finished], list[Section]]
    runtimes: tuple[str, ...] = ()
    absent: Mapping[str, AbsentRuntime] = field(default_factory=dict)
    fitting_quotas: bool = False


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


def missing_modules(*names: str) -> list[str]:
    """The modules of ``names`` that are not installed here."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def not_installed(chapter: str, size: Size, title: str, missing: Sequence[str], install: str) -> Plan:
    """A decoder chapter's plan when what it measures with is missing: nothing run, and why."""
    why = (
        f"{title} measures decoders with PyTorch, and "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed here ({install})"
    )
    return Plan(chapter, size, (), (), (why,))


def runtimes_plan(chapter: Chapter, size: Size, local: bool) -> Plan:
    """The chapter's variants as its runtimes plan them (every installed runtime asked in the registry's
    order); a runtime the chapter sets beside the others but which is not installed is said, not run."""
    documents: list[Mapping[str, Any]] = []
    reductions: list[tuple[int, str]] = []
    not_run: list[str] = []
    for runtime in registry.installed().values():
        part = chapter_plan_of(runtime, ChapterRequest(chapter.name, size, local, tuple(documents)))
        if part is not None:
            documents += part.documents
            reductions += part.reductions
            not_run += part.not_run
    for name, absent in chapter.absent.items():
        if name not in registry.installed():
            not_run.append(absent.why)
    variants = tuple(v for doc in documents for v in expand(doc))
    ordered = tuple(text for _, text in sorted(reductions, key=lambda ranked: ranked[0]))
    return Plan(chapter.name, size, variants, ordered, tuple(not_run))


@dataclass(frozen=True)
class RuntimeSections:
    """The sections a chapter's runtimes built, in rank order, and how their runs' network was applied."""

    sections: list[Section]
    network: str


def runtimes_sections(runs: ChapterRuns, absent: Mapping[str, AbsentRuntime]) -> RuntimeSections:
    """Every installed runtime's sections of the chapter, and a row saying so for each runtime of
    ``absent`` (set beside the others) that is not installed."""
    ranked: list[tuple[int, Section]] = []
    network = ""
    installed = registry.installed()
    for runtime in installed.values():
        part = chapter_sections_of(runtime, runs)
        if part is None:
            continue
        for rank, section in part.sections:
            if not isinstance(section, Section):
                raise TypeError(f"runtime {runtime.name}: chapter_sections gave {section!r}, not a Section")
            ranked.append((rank, section))
        network = network or (part.network or "")
    for name, missing in absent.items():
        if name not in installed:
            section = Section(missing.title, missing.anchor)
            verdict_table(section, [[missing.label, missing.why, MISSING, MISSING, MISSING]])
            ranked.append((missing.rank, section))
    return RuntimeSections([s for _, s in sorted(ranked, key=lambda item: item[0])], network)
