"""dit.optimise.exact: equal to exhaustive on random small instances for every policy and objective, never
worse than greedy or trend, the optimum of an instance built to have it, 25 devices where exhaustive
cannot run."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("highspy", reason="the sim extra (HiGHS) is not installed")

from dit.analysis.delay import OBJECTIVES, POLICIES, DelayModel, DevicePower, synthetic_model
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


def powered(rng: np.random.Generator, devices: int, stages: int, bounds: tuple[int, ...]) -> DelayModel:
    """A synthetic instance with power models (W): idle 1.5-3, computing and transmitting above it."""
    model = synthetic_model(rng, devices, stages, bounds)
    idle = rng.uniform(1.5, 3.0, devices)
    powers = tuple(
        DevicePower(float(i), float(i + c), float(i + t))
        for i, c, t in zip(idle, rng.uniform(0.5, 4.0, devices), rng.uniform(0.0, 2.0, devices), strict=True)
    )
    return DelayModel(**{**model.__dict__, "power": powers})


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_every_policy_and_objective_equals_exhaustive_on_random_small_instances(
    seed: int, policy: str, objective: str
) -> None:
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 5))
    bounds = tuple(int(b) for b in rng.integers(2, 6, size=n))
    problem = Problem(powered(rng, n, 5, bounds), policy, objective)  # type: ignore[arg-type]
    best = exact(problem)
    assert best.objective_value == pytest.approx(exhaustive(problem).objective_value, rel=1e-9)
    assert problem.model.is_feasible(best.vector)
    for search in (greedy, trend):
        assert best.objective_value <= search(problem).objective_value * (1 + 1e-12)


def test_rr_instance_built_with_its_optimum_gets_it() -> None:
    """A local stage costs 1 s and sending is free, so both devices offload everything (p = 0); RR runs
    their two 1 ms edge stages in rounds a1 b1 a2 b2: a finishes at 3 ms, b at 4 ms, 7 ms in total."""
    stages = 2
    model = DelayModel(
        devices=("a", "b"),
        edge_stage_ns=(1 * MS,) * stages,
        cum_latency_ns=((0.0, 1000 * MS, 2000 * MS),) * 2,
        cut_bytes=((0.0,) * (stages + 1),) * 2,
        rate_bps=(1e12, 1e12),
        rtt_ns=(0.0, 0.0),
    )
    result = exact(Problem(model, "RR", "total_delay"))
    assert result.vector == (0, 0) and result.objective_value == pytest.approx(7 * MS)


def test_twelve_devices_under_rr_where_exhaustive_refuses() -> None:
    """Beyond exhaustive (7^12 vectors) under RR: no worse than greedy or trend (0.3 s of CPU)."""
    rng = np.random.default_rng(2025)
    problem = Problem(synthetic_model(rng, 12, 6, (6,) * 12), "RR", "total_delay")
    with pytest.raises(OptimiseError, match="exhaustive search would evaluate"):
        exhaustive(problem)
    best = exact(problem)
    for search in (greedy, trend):
        assert best.objective_value <= search(problem).objective_value * (1 + 1e-12)


def test_a_solver_failure_is_an_optimise_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from dit.optimise import milp

    def fail(self: milp.Milp, time_limit_s: float = 60.0) -> tuple[float, list[float]]:
        raise milp.MilpError("HiGHS: Time limit reached")

    monkeypatch.setattr(milp.Milp, "solve", fail)
    problem = Problem(synthetic_model(np.random.default_rng(0), 2, 3, (3, 3)), "RR", "variance")
    with pytest.raises(OptimiseError, match="exact: HiGHS: Time limit reached"):
        exact(problem)


def test_exact_is_registered_as_an_optimiser() -> None:
    assert "exact" in available() and load("exact") is exact


def test_the_solver_prints_nothing_on_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    """HiGHS's constructor prints a banner on fd 1; ``dit optimise --json`` must stay JSON."""
    exact(Problem(synthetic_model(np.random.default_rng(3), 2, 3, (3, 3)), "SJF", "total_delay"))
    assert capfd.readouterr().out == ""


def test_a_solve_error_is_retried_without_presolve(monkeypatch: pytest.MonkeyPatch) -> None:
    """HiGHS 1.16's presolve ended one of exact's variance models (with big-M rows) in "Solve error";
    without presolve it was proved optimal. dit.optimise.milp retries so."""
    import highspy

    from dit.optimise import milp

    presolve_at_run: list[str] = []

    class FlakyPresolve(highspy.Highs):  # type: ignore[misc]  # highspy ships no annotations
        def run(self) -> object:
            value = self.getOptionValue("presolve")  # (status, value) in highspy 1.16, the value before
            presolve_at_run.append(str(value[1] if isinstance(value, tuple) else value))
            return super().run()

        def getModelStatus(self) -> object:  # HiGHS's name
            if presolve_at_run[-1] != "off":
                return highspy.HighsModelStatus.kSolveError
            return super().getModelStatus()

    monkeypatch.setattr(milp, "_quiet_highs", FlakyPresolve)
    m = milp.Milp()
    x = [m.binary(cost=c) for c in (3.0, 1.0, 2.0)]
    m.row(dict.fromkeys(x, 1.0), lower=1.0, upper=1.0)
    value, values = m.solve()
    assert presolve_at_run[-1] == "off" and len(presolve_at_run) == 2
    assert value == pytest.approx(1.0) and values[1] == pytest.approx(1.0)
