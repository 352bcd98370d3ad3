"""The chapters ``dit reproduce`` knows, by name: each is one module ending with its
:class:`~dit.reproduce.chapter.Chapter` (a new chapter is a module and a line in :data:`REGISTRY`).

``quick`` finishes within minutes on a 2-core machine in local mode or on the emulated rack; ``full`` is
the chapter as the article ran it, meant for the real rack (each chapter's module says what it reduces).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from dit.reproduce import ch4, ch5, ch6
from dit.reproduce.chapter import (
    SIZES,
    AbsentRuntime,
    Chapter,
    ChapterError,
    Plan,
    Size,
    shipped_document,
)

__all__ = [
    "ABSENT_RUNTIMES",
    "CHAPTERS",
    "CHAPTER_RUNTIMES",
    "REGISTRY",
    "SIZES",
    "ChapterError",
    "Plan",
    "Size",
    "chapter",
    "default_out",
    "plan",
    "shipped_document",
]

REGISTRY: Final[Mapping[str, Chapter]] = {c.name: c for c in (ch4.CHAPTER, ch5.CHAPTER, ch6.CHAPTER)}
CHAPTERS: Final = tuple(REGISTRY)

#: The runtimes whose variants a chapter measures: without one of them the chapter runs nothing.
CHAPTER_RUNTIMES: Final[Mapping[str, tuple[str, ...]]] = {
    name: c.runtimes for name, c in REGISTRY.items() if c.runtimes
}
#: The runtimes a chapter sets beside its own when installed (Chapter 6: llama.cpp's RPC, issue 37).
ABSENT_RUNTIMES: Final[Mapping[str, Mapping[str, AbsentRuntime]]] = {
    name: c.absent for name, c in REGISTRY.items() if c.absent
}


def chapter(name: str) -> Chapter:
    """The chapter called ``name`` (:class:`ChapterError` naming the known ones otherwise)."""
    found = REGISTRY.get(name)
    if found is None:
        raise ChapterError(f"CHAPTER: {name!r} is not one of {', '.join(CHAPTERS)}")
    return found


def plan(chapter_name: str, size: Size, local: bool = True) -> Plan:
    """The variants of ``chapter_name`` at ``size`` (:class:`ChapterError` for an unknown chapter or
    size); ``local``: in local mode (what local mode cannot apply is left out and said)."""
    if size not in SIZES:
        raise ChapterError(f"--size: {size!r} is not one of {', '.join(SIZES)}")
    return chapter(chapter_name).plan(size, local)


def default_out(chapter_name: str) -> Path:
    return Path("reproduce") / chapter_name
