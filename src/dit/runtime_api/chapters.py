"""What a runtime adds to ``dit reproduce``'s chapters: its scenario variants and its report sections.

Both hooks are optional methods of a runtime (docs/runtimes.md): ``chapter_plan(request)`` returns the
:class:`ChapterPlan` a runtime adds to a chapter (None: nothing), ``chapter_sections(runs)`` the
:class:`ChapterSections` it builds from the chapter's finished runs. The core asks every installed
runtime, in the registry's order, and imports none of them. A rank orders a chapter's reductions and
sections across runtimes (lower first), so one runtime's section can sit between another's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.runtime_api.interface import Runtime


@dataclass(frozen=True)
class ChapterRequest:
    """A chapter being planned: its name, size (``quick`` or ``full``), whether in local mode, and the
    scenario documents the runtimes asked before this one planned (a runtime set beside another's sweep
    reads that sweep's axes there)."""

    chapter: str
    size: str
    local: bool
    planned: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class ChapterPlan:
    """What one runtime adds to a chapter: scenario documents (the core expands their sweeps), the
    reductions made for the size (ranked), and the parts it cannot measure here, each with why."""

    documents: tuple[Mapping[str, Any], ...] = ()
    reductions: tuple[tuple[int, str], ...] = ()
    not_run: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChapterRuns:
    """A chapter's runs as its report reads them: the finished run directories by scenario name, every
    run directory made (finished or not), where they ran (one sentence), the cores every node shares
    without a quota each (None where the quotas fit) and what the plan could not measure."""

    chapter: str
    finished: Mapping[str, tuple[Path, ...]]
    runs: tuple[Path, ...]
    where: str
    shared_cores: int | None
    not_run: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChapterSections:
    """The report sections one runtime builds (``dit.report.section.Section``), ranked; ``network`` says
    how the runs' network conditions were applied, where the runtime can tell (None: it cannot)."""

    sections: tuple[tuple[int, Any], ...] = ()
    network: str | None = field(default=None)


def chapter_plan_of(runtime: Runtime, request: ChapterRequest) -> ChapterPlan | None:
    """What ``runtime`` adds to the chapter (optional ``chapter_plan``; None without one)."""
    hook = getattr(runtime, "chapter_plan", None)
    found = hook(request) if callable(hook) else None
    if found is not None and not isinstance(found, ChapterPlan):
        raise TypeError(f"runtime {runtime.name}: chapter_plan returned {found!r}, not a ChapterPlan")
    return found


def chapter_sections_of(runtime: Runtime, runs: ChapterRuns) -> ChapterSections | None:
    """The sections ``runtime`` builds for the chapter (optional ``chapter_sections``; None without one)."""
    hook = getattr(runtime, "chapter_sections", None)
    found = hook(runs) if callable(hook) else None
    if found is not None and not isinstance(found, ChapterSections):
        raise TypeError(f"runtime {runtime.name}: chapter_sections returned {found!r}, not ChapterSections")
    return found
