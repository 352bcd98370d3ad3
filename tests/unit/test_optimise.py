"""greedy, trend and exhaustive on hand-computed instances, plus the exhaustive limit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dit.analysis.delay import DelayModel, Objective, Policy, evaluate, objective_value, synthetic_model
from dit.optimise import CachedObjective, Problem, TooManyVectorsError
from dit.optimise.exhaustive import exhaustive
from dit.optimise.greedy import greedy
from dit.optimise.trend import trend
from tests.unit.test_analysis_delay import MS, small_model

# Every feasible vector of small_model() (device1 0..2, device2 0..1), hand-computed (ms):
#            SJF total  SJF variance  RR total  RR variance
# (0, 0)     31.0       1.0           32.5      3.0625
# (0, 1)     30.2       15.21         31.7      9.9225
# (1, 0)     27.1       0.2025        27.6      0.04
# (1, 1)     26.8       0.09          27.8      0.04
# (2, 0)     23.2       1.96          23.2      1.96
# (2, 1)     22.9       1.5625        22.9      1.5625
TABLE = {
    ("SJF", "total_delay"): [31.0, 30.2, 27.1, 26.8, 23.2, 22.9],
    ("SJF", "variance"): [1.0, 15.21, 0.2025, 0.09, 1.96, 1.5625],
    ("RR", "total_delay"): [32.5, 31.7, 27.6, 27.8, 23.2, 22.9],
    ("RR", "variance"): [3.0625, 9.9225, 0.04, 0.04, 1.96, 1.5625],
}
VECTORS = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
CASES = list(TABLE)


def unit(objective: str) -> float:
    return MS if objective == "total_delay" else MS * MS


@pytest.mark.parametrize(("policy", "objective"), CASES)
def test_hand_table(policy: Policy, objective: Objective) -> None:
    model = small_model()
    for vector, expected in zip(VECTORS, TABLE[(policy, objective)], strict=True):
        value = objective_value(evaluate(model, vector, policy).delay_ns, objective)
        assert value == pytest.approx(expected * unit(objective))


@pytest.mark.parametrize(
    ("policy", "objective", "best"),
    [
        ("SJF", "total_delay", (2, 1)),
        ("SJF", "variance", (1, 1)),
        ("RR", "total_delay", (2, 1)),
        ("RR", "variance", (1, 0)),  # ties with (1, 1) at 0.04 ms^2: the lexicographically first wins
    ],
)
def test_exhaustive_finds_the_hand_optimum(
    policy: Policy, objective: Objective, best: tuple[int, ...]
) -> None:
    result = exhaustive(Problem(small_model(), policy, objective))
    assert result.vector == best
    assert result.vectors_evaluated == 6
    assert result.objective_value == pytest.approx(min(TABLE[(policy, objective)]) * unit(objective))


def test_independent_start() -> None:
    # alone at the server, device1: 16.5 / 13.1 / 10.2 ms at p = 0 / 1 / 2; device2: 11.5 / 11.2 ms
    assert Problem(small_model(), "RR", "total_delay").independent_start() == (2, 1)
    assert Problem(small_model(), "RR", "total_delay", start=(0, 0)).independent_start() == (0, 0)


def test_greedy_walks_the_steepest_moves() -> None:
    # from (0, 0) (31.0): neighbours (1, 0) 27.1 and (0, 1) 30.2 -> (1, 0); then (0, 0) 31.0, (2, 0) 23.2,
    # (1, 1) 26.8 -> (2, 0); then (1, 0), (2, 1) 22.9 -> (2, 1); then (1, 1) 26.8, (2, 0) 23.2: stop.
    result = greedy(Problem(small_model(), "SJF", "total_delay", start=(0, 0)))
    assert result.vector == (2, 1)
    assert result.objective_value == pytest.approx(22.9 * MS)
    assert result.vectors_evaluated == 6


def test_greedy_stops_at_its_start_when_it_is_a_local_optimum() -> None:
    result = greedy(Problem(small_model(), "SJF", "total_delay"))
    assert result.vector == (2, 1)
    assert result.vectors_evaluated == 3  # (2, 1) and its neighbours (1, 1), (2, 0)


def test_greedy_stops_at_a_local_optimum_that_is_not_global() -> None:
    # SJF variance from (0, 0) (1.0): (1, 0) 0.2025 beats (0, 1) 15.21; from (1, 0): (0, 0) 1.0, (2, 0)
    # 1.96, (1, 1) 0.09 -> (1, 1); from (1, 1): (0, 1) 15.21, (2, 1) 1.5625, (1, 0) 0.2025: stop at 0.09,
    # the global optimum here.
    result = greedy(Problem(small_model(), "SJF", "variance", start=(0, 0)))
    assert result.vector == (1, 1)


def test_trend_follows_then_falls_back() -> None:
    # scan at (0, 0): ranking [(device1, +1) 27.1, (device2, +1) 30.2]; follow device1 +1 to (1, 0), (2, 0);
    # (3, 0) is infeasible -> fall back to device2 +1: (2, 1) 22.9; device2 +1 again infeasible, device1 +1
    # infeasible -> rescan at (2, 1): (1, 1) 26.8, (2, 0) 23.2 do not improve: stop.
    result = trend(Problem(small_model(), "SJF", "total_delay", start=(0, 0)))
    assert result.vector == (2, 1)
    assert result.vectors_evaluated == 6


@pytest.mark.parametrize(("policy", "objective"), CASES)
@pytest.mark.parametrize("seed", range(5))
def test_heuristics_return_local_optima_and_exhaustive_the_global_one(
    policy: Policy, objective: Objective, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    devices, stages = int(rng.integers(2, 5)), int(rng.integers(3, 7))
    bounds = tuple(int(b) for b in rng.integers(1, stages + 1, size=devices))
    problem = Problem(synthetic_model(rng, devices, stages, bounds), policy, objective)
    brute = min((problem.evaluate(v), v) for v in itertools.product(*(range(b + 1) for b in bounds)))
    best = exhaustive(problem)
    assert best.objective_value == pytest.approx(brute[0], rel=1e-12)
    assert best.vector == brute[1]  # the lexicographically first of equal values, like min over tuples
    for search in (greedy, trend):
        result = search(problem)
        assert problem.model.is_feasible(result.vector)
        assert result.objective_value == problem.evaluate(result.vector)
        assert result.objective_value >= best.objective_value * (1 - 1e-12)
        for _move, neighbour in problem.neighbours(result.vector):
            assert problem.evaluate(neighbour) >= result.objective_value


def test_exhaustive_refuses_more_than_the_limit_unless_raised() -> None:
    model = synthetic_model(np.random.default_rng(0), 3, 9)  # 10^3 = 1000 vectors
    with pytest.raises(TooManyVectorsError, match=r"1,000 vectors \(10 x 10 x 10 .* limit of 999"):
        exhaustive(Problem(model, "RR", "total_delay", max_vectors=999))
    assert exhaustive(Problem(model, "RR", "total_delay", max_vectors=1000)).vectors_evaluated == 1000


def test_exhaustive_default_limit_is_five_million() -> None:
    # 24^5 = 7,962,624 vectors > 5,000,000: refused before any work
    model = synthetic_model(np.random.default_rng(0), 5, 23)
    with pytest.raises(TooManyVectorsError, match=r"7,962,624 vectors .* limit of 5,000,000"):
        exhaustive(Problem(model, "SJF", "variance"))


def test_neighbours_respect_bounds() -> None:
    problem = Problem(small_model(), "RR", "total_delay")
    assert problem.neighbours((0, 0)) == [((0, 1), (1, 0)), ((1, 1), (0, 1))]
    assert problem.neighbours((2, 1)) == [((0, -1), (1, 1)), ((1, -1), (2, 0))]


def test_cached_objective_counts_distinct_vectors() -> None:
    cached = CachedObjective(Problem(small_model(), "RR", "total_delay"))
    cached((0, 0))
    cached((0, 0))
    cached([1, 0])
    assert cached.evaluated == 2


def downhill_model() -> DelayModel:
    """2 devices, 8 stages: fast local stages, a slow link and a slow edge, so the objective falls with
    every step towards (8, 8) (all local)."""
    stages = 8
    return DelayModel(
        devices=("a", "b"),
        edge_stage_ns=(1 * MS,) * stages,
        cum_latency_ns=(tuple(0.1 * MS * p for p in range(stages + 1)),) * 2,
        cut_bytes=(tuple(float(1000 * (stages + 1 - p)) for p in range(stages + 1)),) * 2,
        rate_bps=(1e6, 2e6),
        rtt_ns=(1 * MS, 1 * MS),
    )


def test_trend_follows_a_direction_with_fewer_evaluations_than_greedy() -> None:
    problem = Problem(downhill_model(), "RR", "total_delay", start=(0, 0))
    g, t = greedy(problem), trend(problem)
    assert g.vector == t.vector == (8, 8)
    # greedy rescans all moves at each of its 16 steps; trend scans once, follows device a's +1 (one
    # evaluation per step), falls back to device b's +1 and scans again only at the end.
    assert t.vectors_evaluated < g.vectors_evaluated


@pytest.mark.parametrize("bounds", [(0,), (0, 0), (3,), (0, 5, 0), (2, 0, 3)])
@pytest.mark.parametrize("policy", ["RR", "SJF"])
def test_degenerate_ranges(bounds: tuple[int, ...], policy: Policy) -> None:
    problem = Problem(
        synthetic_model(np.random.default_rng(1), len(bounds), 5, bounds), policy, "total_delay"
    )
    brute = min((problem.evaluate(v), v) for v in itertools.product(*(range(b + 1) for b in bounds)))
    assert exhaustive(problem).vector == brute[1]
    for search in (greedy, trend):
        vector = search(problem).vector
        assert all(0 <= p <= b for p, b in zip(vector, bounds, strict=True))
