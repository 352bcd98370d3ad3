"""Errors that name the offending scenario path."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dit.scenario.pathexpr import Segment

_NUM = re.compile(r"(\d+)")


@dataclass(frozen=True)
class FieldError:
    """One problem with a scenario: the dotted ``path`` of the field and a human ``message``.

    ``path`` is ``""`` for problems with the document as a whole (YAML syntax, size).
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def sort_key(error: FieldError) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """Natural order: ``devices[2]`` before ``devices[10]``, then by message."""
    parts = tuple((1, int(p)) if p.isdigit() else (0, p) for p in _NUM.split(error.path) if p)
    return parts, error.message


def sorted_unique(errors: Iterable[FieldError]) -> list[FieldError]:
    return sorted(set(errors), key=sort_key)


#: ``report(parts, message)``: one problem at the field ``parts`` (``["network", "device1", "loss_pct"]``).
Report = Callable[[list[Segment], str], None]
#: ``check_block(block, device, conf, report)``: a condition's checks of one device's entry of its scenario
#: block that the schema cannot express (``dit.conditions``: the ``check_block`` hook).
BlockCheck = Callable[[str, str, Mapping[str, Any], Report], None]


class ScenarioError(Exception):
    """A scenario is invalid; ``errors`` lists every problem found, ``str()`` one per line."""

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors: list[FieldError] = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)
