"""``feasibility.csv``: the largest partition point each device can run within its limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

MIB: Final = 1024 * 1024
FEASIBILITY_COLUMNS: Final = (
    "device",
    "max_partition_point",
    "binding_constraint",
    "memory_limit_bytes",
    "peak_mem_bytes_at_max",
    "cpu_budget_pct",
    "peak_cpu_pct_at_max",
)


@dataclass(frozen=True)
class Feasibility:
    """One device's row of feasibility.csv."""

    device: str
    max_partition_point: int
    binding_constraint: str  # memory | cpu | none
    memory_limit_bytes: int | None
    peak_mem_bytes_at_max: int
    cpu_budget_pct: float | None
    peak_cpu_pct_at_max: float


def feasibility(
    device: str, layers: pd.DataFrame, memory_limit_mb: float | None, cpu_budget_pct: float | None
) -> Feasibility:
    """The largest p whose cumulative peaks (max over stages 1..p) fit the device's limits.

    p = 0 (run nothing locally) is always feasible. ``binding_constraint`` is ``none`` when p = N is
    feasible, else the constraint stage max+1 violates (``memory`` when both do).
    """
    body = layers[layers["stage"] >= 1].sort_values("stage")
    mem = np.maximum.accumulate(body["peak_mem_bytes"].to_numpy(dtype=np.float64))
    cpu = np.maximum.accumulate(body["peak_cpu_pct"].to_numpy(dtype=np.float64))
    limit_bytes = None if memory_limit_mb is None else int(memory_limit_mb * MIB)
    mem_ok = np.ones(len(body), dtype=bool) if limit_bytes is None else mem <= limit_bytes
    cpu_ok = np.ones(len(body), dtype=bool) if cpu_budget_pct is None else cpu <= cpu_budget_pct
    fits = mem_ok & cpu_ok
    max_p = int(np.argmin(fits)) if not fits.all() else len(body)
    if max_p == len(body):
        binding = "none"
    elif not mem_ok[max_p]:
        binding = "memory"
    else:
        binding = "cpu"
    return Feasibility(
        device=device,
        max_partition_point=max_p,
        binding_constraint=binding,
        memory_limit_bytes=limit_bytes,
        peak_mem_bytes_at_max=0 if max_p == 0 else int(mem[max_p - 1]),
        cpu_budget_pct=cpu_budget_pct,
        peak_cpu_pct_at_max=0.0 if max_p == 0 else float(cpu[max_p - 1]),
    )
