"""The energy and EDP objectives: hand-computed cases, the power-model fit, every optimiser, the API."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dit.analysis.delay import (
    DelayModel,
    DelayModelError,
    DevicePower,
    Objective,
    Policy,
    batch_delays,
    batch_objective,
    build_energy_tables,
    build_tables,
    energy_j,
    evaluate,
    objective_of,
    synthetic_model,
)
from dit.analysis.power_model import POWER_MODEL_COLUMNS, fit_power, read_power_models
from dit.optimise import OptimiseError, Problem
from dit.optimise.api import optimise_run
from dit.optimise.exhaustive import decode, exhaustive
from dit.optimise.greedy import greedy
from dit.optimise.trend import trend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000


def hand_model() -> DelayModel:
    """Two devices, two stages; the same numbers as test_optimise's hand table, plus power models."""
    return DelayModel(
        devices=("device1", "device2"),
        edge_stage_ns=(1 * MS, 2 * MS),
        cum_latency_ns=((0.0, 4 * MS, 10 * MS), (0.0, 8 * MS, 20 * MS)),
        cut_bytes=((1000.0, 500.0, 0.0), (1000.0, 500.0, 0.0)),
        rate_bps=(8e6, 8e6),  # 1000 B -> 1 ms, 500 B -> 0.5 ms
        rtt_ns=(0.0, 0.0),
        power=(DevicePower(idle_w=2.0, compute_w=5.0, transmit_w=3.0), DevicePower(1.0, 4.0, 2.0)),
    )


def test_hand_computed_energy_and_edp() -> None:
    model = hand_model()
    # vector (1, 0) under RR: device1 L 4 ms, T 0.5 ms, remote stage (2 ms); device2 L 0, T 1 ms, (1, 2) ms
    b = evaluate(model, (1, 0), "RR")
    # RR rounds: round 1 = device1's stage 2 (2 ms), device2's stage 1 (1 ms); round 2 = device2's stage 2
    assert b.remote_ns == (2 * MS, 5 * MS)
    e1 = 5.0 * 0.004 + 3.0 * 0.0005 + 2.0 * 0.002  # 0.0255 J
    e2 = 4.0 * 0 + 2.0 * 0.001 + 1.0 * 0.005  # 0.007 J
    assert energy_j(model, b) == pytest.approx((e1, e2))
    assert objective_of(model, b, "energy") == pytest.approx(e1 + e2)
    delay_s = (4 + 0.5 + 2 + 0 + 1 + 5) / 1000
    assert objective_of(model, b, "edp") == pytest.approx((e1 + e2) * delay_s)
    # all local (2, 2): no transmission, no waiting, energy = compute power * local time
    b = evaluate(model, (2, 2), "SJF")
    assert objective_of(model, b, "energy") == pytest.approx(5.0 * 0.010 + 4.0 * 0.020)


def test_energy_objectives_need_a_power_model() -> None:
    model = synthetic_model(np.random.default_rng(0), 2, 4)
    with pytest.raises(DelayModelError, match="power model for every device"):
        objective_of(model, evaluate(model, (1, 1), "RR"), "energy")
    with pytest.raises(OptimiseError, match=r"objective edp: .*power model"):
        Problem(model, "RR", "edp")
    with pytest.raises(DelayModelError, match="power has 1 entries for 2 devices"):
        DelayModel(**{**model.__dict__, "power": (DevicePower(1, 2, 3),)})
    with pytest.raises(DelayModelError, match="compute_w must be a finite number >= 0"):
        DevicePower(1.0, -2.0, 1.0)


def powered(rng: np.random.Generator, devices: int, stages: int) -> DelayModel:
    model = synthetic_model(
        rng, devices, stages, bounds=[int(b) for b in rng.integers(1, stages + 1, devices)]
    )
    powers = tuple(
        DevicePower(float(i), float(i + c), float(i + t))
        for i, c, t in zip(
            rng.uniform(1.5, 3.0, devices), rng.uniform(0.5, 4.0, devices), rng.uniform(0.0, 2.0, devices),
            strict=True,
        )
    )  # fmt: skip
    return DelayModel(**{**model.__dict__, "power": powers})


@pytest.mark.parametrize("objective", ["energy", "edp"])
@pytest.mark.parametrize("policy", ["RR", "SJF"])
@pytest.mark.parametrize("seed", range(6))
def test_exhaustive_energy_search_agrees_with_a_brute_force_loop(
    objective: Objective, policy: Policy, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    model = powered(rng, int(rng.integers(2, 5)), int(rng.integers(2, 6)))
    problem = Problem(model, policy, objective)
    brute = min(
        (objective_of(model, evaluate(model, v, policy), objective), v)
        for v in itertools.product(*(range(b + 1) for b in model.bounds))
    )
    best = exhaustive(problem)
    assert best.objective_value == pytest.approx(brute[0], rel=1e-9)
    assert problem.evaluate(best.vector) == pytest.approx(brute[0], rel=1e-9)
    for search in (greedy, trend):  # local searches: never better than the optimum, a local optimum
        result = search(problem)
        assert result.objective_value >= best.objective_value * (1 - 1e-12)
        for _move, neighbour in problem.neighbours(result.vector):
            assert problem.evaluate(neighbour) >= result.objective_value


def test_batch_energy_objective_matches_the_reference() -> None:
    rng = np.random.default_rng(7)
    model = powered(rng, 3, 5)
    vectors = decode(np.arange(6 * 6 * 6, dtype=np.int64), (5, 5, 5))
    delays = batch_delays(build_tables(model, "SJF"), vectors)
    for objective in ("energy", "edp"):
        got = batch_objective(delays, objective, build_energy_tables(model), vectors)
        want = [objective_of(model, evaluate(model, tuple(v), "SJF"), objective) for v in vectors]
        np.testing.assert_allclose(got, want, rtol=1e-9)


def test_power_fit_recovers_known_powers_and_falls_back_when_transmission_is_invisible() -> None:
    rng = np.random.default_rng(3)
    comp, tx, idle = rng.uniform(0.01, 0.1, 40), rng.uniform(0.001, 0.02, 40), rng.uniform(0.0, 0.05, 40)
    seconds = np.column_stack([comp, tx, idle])
    truth = np.array([5.0, 3.5, 2.0])  # compute, transmit, idle (W)
    energy = seconds @ truth + rng.normal(0, 1e-5, 40)
    fit = fit_power(seconds, energy, requests=40, device="d")
    assert fit is not None and fit.method == "3-term"
    assert (fit.power.compute_w, fit.power.transmit_w, fit.power.idle_w) == pytest.approx(
        tuple(truth), rel=0.02
    )
    # transmissions of zero length: transmit power cannot be told apart; it is taken as the idle power
    seconds[:, 1] = 0.0
    fit = fit_power(seconds, seconds @ truth, requests=40)
    assert fit is not None and fit.method == "transmit=idle"
    assert fit.power.transmit_w == fit.power.idle_w == pytest.approx(2.0)
    assert fit_power(seconds[:1], (seconds @ truth)[:1], requests=1) is None


def test_optimise_run_with_a_power_model(tmp_path: Path) -> None:
    run = tmp_path / "run_small"
    shutil.copytree(FIXTURES / "run_small", run)
    optimise_run(run, None, None, None, None)  # aggregates the fixture first
    (run / "aggregate" / "power_model.csv").write_text(
        ",".join(POWER_MODEL_COLUMNS) + "\n"
        "device1,2.0,5.0,3.0,3-term,10,2,0.001\n"
        "device2,1.0,4.0,2.0,3-term,10,2,0.001\n",
        encoding="utf-8",
    )
    assert read_power_models(run / "aggregate", ["device1", "device2"]) == (
        DevicePower(2.0, 5.0, 3.0),
        DevicePower(1.0, 4.0, 2.0),
    )
    result = optimise_run(run, "exhaustive", "energy", None, None)
    saved = json.loads(result.output_path.read_text())
    assert saved["objective_unit"] == "J"
    assert result.output_path.name == "exhaustive-energy-SJF.json"
    per_device = saved["per_device"]
    expected = [
        (d["L_ns"] * pw[1] + d["T_ns"] * pw[2] + d["R_ns"] * pw[0]) * 1e-9
        for d, pw in zip(per_device, ((2.0, 5.0, 3.0), (1.0, 4.0, 2.0)), strict=True)
    ]
    assert [d["E_j"] for d in per_device] == pytest.approx(expected)
    assert saved["objective_value"] == pytest.approx(sum(expected))
    edp = optimise_run(run, "greedy", "edp", "RR", None)
    assert edp.objective_unit == "J*s"
    # a device without a power model: the energy objectives are refused, naming where the model comes from
    (run / "aggregate" / "power_model.csv").write_text(
        ",".join(POWER_MODEL_COLUMNS) + "\ndevice1,2.0,5.0,3.0,3-term,10,2,0.001\n", encoding="utf-8"
    )
    with pytest.raises(OptimiseError, match=r"power_model\.csv"):
        optimise_run(run, None, "energy", None, None)
