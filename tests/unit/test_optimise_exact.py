"""dit.optimise.exact: equal to exhaustive on random small instances, never worse than greedy or trend,
the optimum of an instance built to have it, 25 devices where exhaustive cannot run, and a clear refusal
of what it does not solve."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("highspy", reason="the sim extra (HiGHS) is not installed")

from dit.analysis.delay import DelayModel, synthetic_model
from dit.optimise import OptimiseError, Problem
from dit.optimise.exact import exact
from dit.optimise.exhaustive import exhaustive
from dit.optimise.greedy import greedy
from dit.optimise.registry import available, load
from dit.optimise.trend import trend

MS = 1e6


@pytest.mark.parametrize("seed", range(8))
def test_exact_equals_exhaustive_and_beats_no_heuristic_on_random_small_instances(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    bounds = tuple(int(b) for b in rng.integers(2, 7, size=n))
    problem = Problem(synthetic_model(rng, n, 6, bounds), "SJF", "total_delay")
    best = exact(problem)
    assert best.objective_value == pytest.approx(exhaustive(problem).objective_value, rel=1e-9)
    for search in (greedy, trend):
        assert best.objective_value <= search(problem).objective_value * (1 + 1e-12)


def test_an_instance_built_with_its_optimum_gets_it() -> None:
    # device a: free local stages, so all local (p = 4, nothing sent) is best; device b: local stages cost
    # 1 s each and the link is free, so sending the input (p = 0) is best; alone at the edge, b pays 4 ms
    stages = 4
    model = DelayModel(
        devices=("a", "b"),
        edge_stage_ns=(1 * MS,) * stages,
        cum_latency_ns=((0.0,) * (stages + 1), tuple(1000 * MS * p for p in range(stages + 1))),
        cut_bytes=((1e6,) * (stages + 1), (0.0,) * (stages + 1)),
        rate_bps=(1e6, 1e12),
        rtt_ns=(0.0, 0.0),
    )
    result = exact(Problem(model, "SJF", "total_delay"))
    assert result.vector == (4, 0) and result.objective_value == pytest.approx(4 * MS)


def test_twenty_five_devices_where_exhaustive_refuses() -> None:
    rng = np.random.default_rng(25)
    problem = Problem(synthetic_model(rng, 25, 12, (12,) * 25), "SJF", "total_delay")
    best = exact(problem)
    assert best.objective_value <= greedy(problem).objective_value * (1 + 1e-12)
    assert best.objective_value <= trend(problem).objective_value * (1 + 1e-12)


def test_rr_is_refused_naming_what_exact_solves() -> None:
    problem = Problem(synthetic_model(np.random.default_rng(0), 2, 3, (3, 3)), "RR", "total_delay")
    with pytest.raises(OptimiseError, match="exact solves total_delay under SJF"):
        exact(problem)


def test_exact_is_registered_as_an_optimiser() -> None:
    assert "exact" in available() and load("exact") is exact


def test_the_solver_prints_nothing_on_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    """HiGHS's constructor prints a banner on fd 1; ``dit optimise --json`` must stay JSON."""
    exact(Problem(synthetic_model(np.random.default_rng(3), 2, 3, (3, 3)), "SJF", "total_delay"))
    assert capfd.readouterr().out == ""
