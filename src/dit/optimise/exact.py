"""The exact optimiser: Chapter 4's partition problem as a MILP (HiGHS), for any number of devices.

Under SJF the total delay has a closed form that makes the problem a small MILP. Request ``i`` holds
the edge stages ``k > p_i``; write ``c_k`` for the number of requests holding stage ``k`` and ``e_k`` for
its edge time. SJF serves the requests in ascending workload, so every pair adds the smaller workload
to the larger one's wait: ``sum_i R_i = sum_i W_i + sum_{i<j} min(W_i, W_j)``. Since the workloads are
suffix sums of one sequence, ``min(W_i, W_j)`` is the sum of ``e_k`` over the stages both hold, and

    sum_i D_i = sum_i (L_i(p_i) + T_i(p_i)) + sum_k e_k * c_k * (c_k + 1) / 2

(ties in SJF's order do not change the sum). ``c_k (c_k + 1) / 2`` is convex in the integer ``c_k``: its
secants between consecutive integers bound it from below, exactly at the integers. The variables are
one binary per device and partition point (its feasible range) and two per stage: ``n * (N + 1) + 2N``,
25 devices by 20 stages in a fraction of a second, where exhaustive would need ``21^25`` vectors.

Solved: ``total_delay`` under ``SJF``. Not yet: RR (the round-by-round schedule depends on device order)
and the ``variance``, ``energy`` and ``edp`` objectives; asked for those it refuses, naming what it solves.
"""

from __future__ import annotations

from dit.analysis.delay import local_ns, transmission_ns
from dit.optimise import OptimiseError, Problem, SearchResult

NS_PER_MS = 1e6  # the MILP works in ms: HiGHS's tolerances suit values near 1, not 1e9 ns


def exact(problem: Problem) -> SearchResult:
    if problem.objective != "total_delay" or problem.policy != "SJF":
        raise OptimiseError(
            f"exact solves total_delay under SJF; {problem.objective} under {problem.policy} is not "
            "formulated yet: use exhaustive (small instances), greedy or trend"
        )
    try:
        from dit.optimise.milp import Milp, MilpError
    except ImportError as exc:
        raise OptimiseError(f"exact needs HiGHS (pip install 'dit[sim]'): {exc}") from None
    model = problem.model
    n, stages = len(model.devices), model.num_stages
    m = Milp()
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
    try:
        _, values = m.solve()
    except MilpError as exc:
        raise OptimiseError(f"exact: {exc}") from None
    vector = tuple(max(range(len(row)), key=lambda p: values[row[p]]) for row in x)
    return SearchResult(vector, problem.evaluate(vector), 1)
