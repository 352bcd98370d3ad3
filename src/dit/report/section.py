"""A report's section (title, note, tables, figures) and its figures as PNG data URIs: shared by the
run report (:mod:`dit.report.build`), the simulation report (:mod:`dit.report.sim`), comparisons and
``dit reproduce``."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure


@dataclass
class Section:
    """One section of a report: a title, an optional note, tables and figures (in that order)."""

    title: str
    anchor: str
    note: str = ""
    # {"caption", "columns", "rows", "badges": [{"kind", "text", "reason"}]}
    tables: list[dict[str, Any]] = field(default_factory=list)
    figures: list[dict[str, str]] = field(default_factory=list)  # {"caption", "src"}

    def table(self, caption: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        self.tables.append(
            {"caption": caption, "columns": list(columns), "rows": [list(r) for r in rows], "badges": []}
        )

    def figure(self, caption: str, figure: Figure) -> None:
        self.figures.append({"caption": caption, "src": png_data_uri(figure)})


def png_data_uri(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=110)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
