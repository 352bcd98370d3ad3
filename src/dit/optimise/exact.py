"""The exact optimiser: Chapter 4's partition problem with HiGHS (MILPs), for every policy and objective.

**SJF, total_delay** (one MILP, tight). Request ``i`` holds the edge stages ``k > p_i``; write ``c_k`` for
the number of requests holding stage ``k`` and ``e_k`` for its edge time. SJF serves the requests in
ascending workload, so every pair adds the smaller workload to the larger one's wait:
``sum_i R_i = sum_i W_i + sum_{i<j} min(W_i, W_j)``. Since the workloads are suffix sums of one sequence,
``min(W_i, W_j)`` is the sum of ``e_k`` over the stages both hold, and

    sum_i D_i = sum_i (L_i(p_i) + T_i(p_i)) + sum_k e_k * c_k * (c_k + 1) / 2

(ties in SJF's order do not change the sum). ``c_k (c_k + 1) / 2`` is convex in the integer ``c_k``: its
secants between consecutive integers bound it from below, exactly at the integers. The variables are
one binary per device and partition point (its feasible range) and two per stage: ``n * (N + 1) + 2N``,
25 devices by 20 stages in a fraction of a second, where exhaustive would need ``21^25`` vectors.

**Every policy** (the general form). Both policies reduce to (:class:`dit.analysis.delay.Tables`)
``D_i = LT_i[p_i] + W[p_i] + sum_{j<i} F[p_i, p_j] + sum_{j>i} G[p_i, p_j]``. With the binaries
``x[i, a]`` (device i at point a, one per device), the pair terms are products ``x[i, a] * x[j, b]``:
one continuous ``y_ij[a, b]`` in [0, 1] per pair of devices ``i < j`` and pair of points stands for it,
with the rows ``sum_b y_ij[a, b] = x[i, a]`` and ``sum_a y_ij[a, b] = x[j, b]`` (at integer ``x`` they
force ``y`` to the product: the reformulation-linearisation of quadratic semi-assignment, whose
relaxation is tighter than big-M rows; docs/optimisers.md has the figures). ``D_i`` is then linear and
exact, for any objective:
``n (N + 1)`` binaries and ``n (n - 1) / 2 (N + 1)^2`` continuous variables.

- ``total_delay``, ``energy``: one MILP, ``min sum_i D_i`` or ``min sum_i E_i``.
- ``edp = E * D`` (a product, not linear): over the finite set of vectors, ``E * D`` is quasi-concave on
  the positive quadrant, so its minimum is at an extreme point of the convex hull of the ``(E, D)`` pairs,
  and (``E * D`` growing in both) at one on its lower-left boundary: a minimiser of ``E + lambda * D`` for
  some ``lambda >= 0``. Those points are found exactly by dichotomic search: the two lexicographic
  extremes (min E then D, min D then E), then between two found points A, B the weighted MILP with
  ``lambda = (E_B - E_A) / (D_A - D_B)``; a point strictly below the segment splits it, else no
  extreme point lies between. The answer is the found point of least ``E * D``.
- ``variance`` (convex quadratic in the ``D_i``): outer approximation. ``min t`` subject to tangent cuts
  ``t >= f(D0) + grad f(D0) . (D - D0)`` at the vectors found so far (valid: ``f`` is convex, so ``t`` is
  a lower bound of the optimum); each solve's vector adds its cut; it stops when the bound reaches the
  best vector's variance, or when the solver returns a vector already cut (its bound is then its own
  variance). Finite: a vector, once cut, cannot come back below its value.

``vectors_evaluated`` is the number of MILPs solved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from dit.analysis.delay import (
    NS_PER_S,
    build_energy_tables,
    build_tables,
    energy_j,
    local_ns,
    transmission_ns,
)
from dit.optimise import OptimiseError, Problem, SearchResult

if TYPE_CHECKING:
    from dit.optimise.milp import Milp

NS_PER_MS = 1e6  # the MILPs work in ms: HiGHS's tolerances suit values near 1, not 1e9 ns
REL_TOL: Final = 1e-9  # two objective values this close (relative) are one
MAX_SOLVES: Final = 2000  # edp's and variance's sequences of MILPs stop here, saying so


def exact(problem: Problem) -> SearchResult:
    """The optimum of ``problem`` (any policy, any objective); see the module docstring."""
    try:
        from dit.optimise.milp import Milp, MilpError
    except ImportError as exc:
        raise OptimiseError(f"exact needs HiGHS (pip install 'dit[sim]'): {exc}") from None
    try:
        if problem.policy == "SJF" and problem.objective == "total_delay":
            return _sjf_total_delay(problem, Milp())
        if problem.objective in ("total_delay", "energy"):
            f = _Formulation.build(problem, Milp())
            f.set_cost(f.energy if problem.objective == "energy" else f.delay)
            vector = f.solve()
            return SearchResult(vector, problem.evaluate(vector), 1)
        if problem.objective == "edp":
            return _edp(problem, _Formulation.build(problem, Milp()))
        return _variance(problem, _Formulation.build(problem, Milp()))
    except MilpError as exc:
        raise OptimiseError(f"exact: {exc}") from None


Linear = dict[int, float]  # variable -> coefficient (a linear expression without constant)


def _add(into: Linear, terms: Mapping[int, float], scale: float = 1.0) -> None:
    for k, v in terms.items():
        into[k] = into.get(k, 0.0) + scale * v


@dataclass
class _Formulation:
    """The general MILP: the binaries ``x``, each device's delay ``D_i`` (ms) and energy ``E_i`` (J) as
    linear expressions over them and the pair variables ``y``."""

    problem: Problem
    milp: Milp
    x: list[list[int]]
    delays: list[Linear]
    energies: list[Linear] = field(default_factory=list)

    @classmethod
    def build(cls, problem: Problem, milp: Milp) -> _Formulation:
        model = problem.model
        tables = build_tables(model, problem.policy)
        bounds = problem.bounds
        x = [[milp.binary() for _ in range(b + 1)] for b in bounds]
        for row in x:
            milp.row(dict.fromkeys(row, 1.0), lower=1.0, upper=1.0)
        delays: list[Linear] = [
            {x_ia: (tables.lt[i, a] + tables.w[a]) / NS_PER_MS for a, x_ia in enumerate(row)}
            for i, row in enumerate(x)
        ]
        for i, row in enumerate(x):
            for j in range(i + 1, len(x)):
                other = x[j]
                # y[a][b] = x[i, a] * x[j, b]: its row sums are x[i, a], its column sums x[j, b]
                y = [[milp.var(upper=1.0) for _ in other] for _ in row]
                for a, x_ia in enumerate(row):
                    milp.row({x_ia: -1.0, **dict.fromkeys(y[a], 1.0)}, lower=0.0, upper=0.0)
                for b, x_jb in enumerate(other):
                    milp.row({x_jb: -1.0, **{y[a][b]: 1.0 for a in range(len(row))}}, lower=0.0, upper=0.0)
                for a in range(len(row)):
                    for b in range(len(other)):
                        # j is behind i in device order (G), i is ahead of j (F)
                        if tables.g[a, b] > 0:
                            delays[i][y[a][b]] = tables.g[a, b] / NS_PER_MS
                        if tables.f[b, a] > 0:
                            delays[j][y[a][b]] = tables.f[b, a] / NS_PER_MS
        f = cls(problem, milp, x, delays)
        if model.power is not None:
            energy = build_energy_tables(model)
            for i, row in enumerate(x):
                e: Linear = {}
                _add(e, delays[i], energy.idle[i] * NS_PER_MS)  # idle is J per ns; D is in ms
                _add(e, {x_ia: energy.extra[i, a] for a, x_ia in enumerate(row)})
                f.energies.append(e)
        return f

    @property
    def delay(self) -> Linear:
        """sum_i D_i (ms)."""
        total: Linear = {}
        for d in self.delays:
            _add(total, d)
        return total

    @property
    def energy(self) -> Linear:
        """sum_i E_i (J)."""
        total: Linear = {}
        for e in self.energies:
            _add(total, e)
        return total

    def set_cost(self, terms: Mapping[int, float]) -> None:
        self.milp.cost = [0.0] * len(self.milp.cost)
        for k, v in terms.items():
            self.milp.cost[k] = v

    def solve(self) -> tuple[int, ...]:
        """The vector of the optimum under the current cost and rows."""
        _, values = self.milp.solve()
        return tuple(max(range(len(row)), key=lambda a: values[row[a]]) for row in self.x)


def _sjf_total_delay(problem: Problem, m: Milp) -> SearchResult:
    model = problem.model
    n, stages = len(model.devices), model.num_stages
    x: list[list[int]] = []
    for i, bound in enumerate(problem.bounds):
        x.append(
            [
                m.binary((local_ns(model, i, p) + transmission_ns(model, i, p)) / NS_PER_MS)
                for p in range(bound + 1)
            ]
        )
        m.row(dict.fromkeys(x[i], 1.0), lower=1.0, upper=1.0)
    for k in range(1, stages + 1):
        e_ms = model.edge_stage_ns[k - 1] / NS_PER_MS
        count = m.var(upper=float(n))
        m.row(
            {count: 1.0, **{x[i][p]: -1.0 for i in range(n) for p in range(min(k, len(x[i])))}},
            lower=0.0,
            upper=0.0,
        )
        if e_ms <= 0:
            continue
        total = m.var(cost=1.0)
        for a in range(n):  # secant of c (c + 1) / 2 between a and a + 1: slope a + 1
            m.row({total: 1.0, count: -e_ms * (a + 1)}, lower=e_ms * (a * (a + 1) / 2 - (a + 1) * a))
    _, values = m.solve()
    vector = tuple(max(range(len(row)), key=lambda p: values[row[p]]) for row in x)
    return SearchResult(vector, problem.evaluate(vector), 1)


def _energy_delay(problem: Problem, vector: tuple[int, ...]) -> tuple[float, float]:
    """(E in J, total delay in s) of ``vector``, from the reference evaluation."""
    breakdown = problem.breakdown(vector)
    return float(sum(energy_j(problem.model, breakdown))), float(sum(breakdown.delay_ns)) / NS_PER_S


def _edp(problem: Problem, f: _Formulation) -> SearchResult:
    """Dichotomic search over the supported points of (E, D); the one of least E * D."""
    energy, delay_ms = f.energy, f.delay
    delay_s = {k: v / 1e3 for k, v in delay_ms.items()}  # D in s, as edp is J*s
    solves = 0

    def lexicographic(first: Linear, second: Linear) -> tuple[int, ...]:
        """min ``first``, then min ``second`` with ``first`` at its minimum."""
        nonlocal solves
        f.set_cost(first)
        best, _ = f.milp.solve()
        f.milp.row(first, upper=best + REL_TOL * abs(best) + 1e-12)
        f.set_cost(second)
        vector = f.solve()
        f.milp.rows.pop()
        solves += 2
        return vector

    low_e = lexicographic(energy, delay_s)
    low_d = lexicographic(delay_s, energy)
    points = {v: _energy_delay(problem, v) for v in (low_e, low_d)}
    pending = [(low_e, low_d)] if points[low_e][1] > points[low_d][1] else []
    while pending:
        if solves >= MAX_SOLVES:
            raise OptimiseError(f"exact (edp): no proof of optimality after {MAX_SOLVES} MILPs")
        a, b = pending.pop()
        (ea, da), (eb, db) = points[a], points[b]
        weight = (eb - ea) / (da - db)  # > 0: a has the lower energy, b the lower delay
        cost = dict(energy)
        _add(cost, delay_s, weight)
        f.set_cost(cost)
        c = f.solve()
        solves += 1
        if c in points:
            continue
        points[c] = ec, dc = _energy_delay(problem, c)
        line = ea + weight * da
        if ec + weight * dc < line - REL_TOL * abs(line) and dc < da and ec < eb:
            pending += [(a, c), (c, b)]
    best = min(points, key=lambda v: (points[v][0] * points[v][1], v))
    return SearchResult(best, problem.evaluate(best), solves)


def _variance(problem: Problem, f: _Formulation) -> SearchResult:
    """Outer approximation of the convex variance by tangent cuts, until the bound meets the best value."""
    n = len(f.delays)
    t = f.milp.var(lower=0.0)
    f.set_cost({t: 1.0})
    cut: set[tuple[int, ...]] = set()
    best: tuple[float, tuple[int, ...]] | None = None

    def add_cut(vector: tuple[int, ...]) -> float:
        """Cut at ``vector``; its variance in ms^2."""
        d0 = [d / NS_PER_MS for d in problem.breakdown(vector).delay_ns]
        mean = sum(d0) / n
        value = sum((d - mean) ** 2 for d in d0) / n
        # t >= f(D0) + g . (D - D0) = g . D - f(D0), since g . D0 = 2 f(D0); g_i = 2 (D0_i - mean) / n
        row: Linear = {t: 1.0}
        for i, d in enumerate(f.delays):
            _add(row, d, -2 * (d0[i] - mean) / n)
        f.milp.row(row, lower=-value)
        cut.add(vector)
        return value

    start = problem.independent_start()
    best = (add_cut(start), start)
    for solves in range(1, MAX_SOLVES + 1):
        bound, values = f.milp.solve()
        vector = tuple(max(range(len(row)), key=lambda a: values[row[a]]) for row in f.x)
        # the bound reached the best value; or a vector already cut came back, whose bound is then its
        # own value (the cut is tight there), which is not below the best
        if vector in cut or bound >= best[0] - REL_TOL * best[0] - 1e-12:
            return SearchResult(best[1], problem.evaluate(best[1]), solves)
        value = add_cut(vector)
        if value < best[0]:
            best = (value, vector)
    raise OptimiseError(f"exact (variance): no proof of optimality after {MAX_SOLVES} MILPs")


__all__ = ["exact"]
