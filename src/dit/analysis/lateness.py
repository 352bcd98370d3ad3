"""Start lateness over several runs (a sweep): per device, the p99 and the maximum.

Every run's ``status.json`` has ``lateness_ns`` (device -> how late its agent began after the common
start instant, ``origin_wall_ns - start_at_ns``). A sweep is several runs, so each device has one
value per run; ``dit show`` of a sweep (or of several runs) prints :func:`lateness_table`.

The p99 is the nearest-rank percentile (the smallest value with at least 99 % of the values at or
below it): with fewer than 100 runs it is the maximum, never an interpolation between runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class Lateness:
    """One device's start lateness over runs, in nanoseconds."""

    device: str
    runs: int
    median_ns: int
    p99_ns: int
    max_ns: int


def percentile_nearest_rank(values: Sequence[_N], pct: float) -> _N:
    """The nearest-rank ``pct`` percentile of ``values`` (not empty; 0 < pct <= 100)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile {pct}: must be in (0, 100]")
    ordered = sorted(values)
    rank = math.ceil(pct / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]


def lateness_over_runs(per_run: Iterable[Mapping[str, int | float]]) -> list[Lateness]:
    """Per device (in first-seen order), its lateness over the runs that have a value for it."""
    values: dict[str, list[int]] = {}
    for lateness in per_run:
        for device, ns in lateness.items():
            values.setdefault(str(device), []).append(int(ns))
    return [
        Lateness(
            device=device,
            runs=len(ns),
            median_ns=percentile_nearest_rank(ns, 50),
            p99_ns=percentile_nearest_rank(ns, 99),
            max_ns=max(ns),
        )
        for device, ns in values.items()
    ]
