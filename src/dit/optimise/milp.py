"""A small builder over HiGHS (highspy's column/row interface): binaries, continuous variables, rows.

Built on the low-level calls (``addCol``, ``addRow``, ``changeColIntegrality``), which every highspy
release since 1.5 has, rather than the expression layer, whose spelling changed between releases.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

import highspy
import numpy as np

INF = math.inf


def _quiet_highs() -> highspy.Highs:
    """A solver without HiGHS's banner: its constructor prints it on the process's stdout before any
    option can be set, which would corrupt ``dit optimise --json``."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            return highspy.Highs()  # type: ignore[no-untyped-call]  # highspy ships no annotations for it
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class MilpError(RuntimeError):
    """HiGHS found no optimal solution (infeasible, or out of time): the message says which."""


@dataclass
class Milp:
    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[float, float, dict[int, float]]] = field(default_factory=list)

    def var(self, cost: float = 0.0, lower: float = 0.0, upper: float = INF, *, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.cost) - 1

    def binary(self, cost: float = 0.0) -> int:
        return self.var(cost, 0.0, 1.0, integer=True)

    def row(self, terms: Mapping[int, float], lower: float = -INF, upper: float = INF) -> None:
        self.rows.append((lower, upper, {k: v for k, v in terms.items() if v != 0}))

    def solve(self, time_limit_s: float = 60.0) -> tuple[float, list[float]]:
        """The optimum (objective, values); :class:`MilpError` when HiGHS does not prove one in time."""
        h = _quiet_highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("log_to_console", False)
        h.setOptionValue("time_limit", float(time_limit_s))
        h.setOptionValue("mip_rel_gap", 0.0)  # exact: the heuristics' gaps are measured against it
        h.setOptionValue("mip_abs_gap", 0.0)
        h.setOptionValue("threads", 1)
        inf = highspy.kHighsInf
        empty_i, empty_v = np.array([], dtype=np.int32), np.array([], dtype=np.float64)
        for c, lo, up in zip(self.cost, self.lower, self.upper, strict=True):
            h.addCol(c, lo, inf if up == INF else up, 0, empty_i, empty_v)
        for i, is_int in enumerate(self.integer):
            if is_int:
                h.changeColIntegrality(i, highspy.HighsVarType.kInteger)
        for lo, up, terms in self.rows:
            idx = np.fromiter(terms, dtype=np.int32, count=len(terms))
            val = np.fromiter(terms.values(), dtype=np.float64, count=len(terms))
            h.addRow(-inf if lo == -INF else lo, inf if up == INF else up, len(terms), idx, val)
        h.run()
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kSolveError:
            # seen with HiGHS 1.16 on a few of exact's variance models (presolve's numerics): solved
            # without presolve, the same model is proved optimal
            h.setOptionValue("presolve", "off")
            h.clearSolver()
            h.run()
            status = h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise MilpError(f"HiGHS: {h.modelStatusToString(status)}")
        return float(h.getInfo().objective_function_value), list(h.getSolution().col_value)
