"""``phases.csv`` and ``phases_summary.csv``: every inference request's phases, and their means."""

from __future__ import annotations

from typing import Final

import pandas as pd

PHASE_COLUMNS: Final = (
    "local_ns",
    "transmission_ns",
    "barrier_ns",
    "queue_ns",
    "remote_ns",
    "return_ns",
    "total_ns",
)
OPTIONAL_SUMMARY_COLUMN: Final = "ack_overlap_ns"
SUMMARY_COLUMNS: Final = (
    "host",
    "round",
    "partition_point",
    "n",
    "request_bytes",
    *PHASE_COLUMNS,
    "max_abs_diff",
)


def phases_summary(phases: pd.DataFrame) -> pd.DataFrame:
    """Means (rounded to integer ns / bytes) per (host, round, partition_point), in order of appearance.

    ``ack_overlap_ns`` (not a phase: the part of the raw transmission taken off as double-counted) is
    averaged too when the raw files have it; ``max_abs_diff`` is the maximum.
    """
    extra = [OPTIONAL_SUMMARY_COLUMN] if OPTIONAL_SUMMARY_COLUMN in phases.columns else []
    columns = [*SUMMARY_COLUMNS[:-1], *extra, SUMMARY_COLUMNS[-1]]
    if phases.empty:
        return pd.DataFrame(columns=columns)
    grouped = phases.groupby(["host", "round", "partition_point"], sort=False)
    means = grouped[["request_bytes", *PHASE_COLUMNS, *extra]].mean().round().astype("int64")
    out = means.copy()
    out.insert(0, "n", grouped.size())
    out["max_abs_diff"] = grouped["max_abs_diff"].max()
    return out.reset_index()[columns]
