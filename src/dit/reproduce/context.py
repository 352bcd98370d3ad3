"""What a chapter's numbers were measured on: cores, load, where, size, model, network backend."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from dit.report.section import Section


@dataclass
class Context:
    """The machine and settings a chapter was reproduced with (said above every table)."""

    chapter: str
    size: str
    where: str  # "local mode", "the emulated rack (INVENTORY)", "INVENTORY"
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    load_before: tuple[float, float, float] = field(default_factory=os.getloadavg)
    load_after: tuple[float, float, float] | None = None
    model: str = ""
    network: str = ""
    reductions: Sequence[str] = ()
    run_loads: Sequence[tuple[float, float]] = ()  # (start, end) of every run the tables read
    notes: list[str] = field(default_factory=list)
    shared_machine: bool = True  # every node on this machine's cores (local mode, the emulated rack)

    def finish(self) -> None:
        self.load_after = os.getloadavg()

    def load_text(self) -> str:
        """The load the measurements were taken under: the runs' own (a reused run's as recorded when it
        ran), or, without runs, this invocation's."""
        if self.run_loads:
            values = [v for pair in self.run_loads for v in pair]
            return f"{min(values):.2f} to {max(values):.2f} while the runs ran"
        before = f"{self.load_before[0]:.2f} before"
        return before if self.load_after is None else f"{before}, {self.load_after[0]:.2f} after"


def where_text(ctx: Context) -> str:
    return f"{ctx.where}, {ctx.cores} cores, load average {ctx.load_text()}"


VERDICT_COLUMNS: Final = (
    "quantity",
    "measured here",
    "simulated for the article's rack",
    "the article",
    "reproduces?",
)
"""The columns of every table set beside the article: its sentences wrap (:func:`verdict_table`)."""


def verdict_table(section: Section, rows: Sequence[Sequence[str]], caption: str = "") -> None:
    section.table(caption, VERDICT_COLUMNS, rows)
    section.tables[-1]["wrap"] = True
