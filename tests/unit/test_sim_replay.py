"""dit.sim.replay: a run directory the simulator itself wrote is replayed exactly, with its per-call cost
recovered; a directory without HeadSplit results is refused saying what it lacks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")

from dit.sim._headsplit import WorkerSpec, place
from dit.sim.engine import Device, SimConfig, SimError, simulate
from dit.sim.replay import fitted_call_s, format_replay, replay
from tests.sim_fixtures import MODEL, write_run


def test_a_run_the_simulator_made_replays_exactly_with_its_call_cost_recovered(tmp_path: Path) -> None:
    r = replay(write_run(tmp_path, 0.003))
    assert fitted_call_s(r.config) == pytest.approx(0.003, rel=1e-3)  # token times are whole ns
    assert r.mape_percent == pytest.approx(0.0, abs=0.01)
    assert r.simulated_tokens_per_s == pytest.approx(r.measured_tokens_per_s, rel=1e-4)
    assert "MAPE 0.0 %" in format_replay(r).splitlines()


def test_token_to_token_noise_shows_in_the_mape(tmp_path: Path) -> None:
    r = replay(write_run(tmp_path, 0.003, jitter=0.1))
    assert r.mape_percent == pytest.approx(10.0, abs=1.0)


def test_calibrating_on_another_run_predicts_without_fitting_the_replayed_one(tmp_path: Path) -> None:
    other = write_run(tmp_path / "a", 0.003)
    target = write_run(tmp_path / "b", 0.006)
    r = replay(target, calibration=other)
    assert fitted_call_s(r.config) == pytest.approx(0.003, rel=1e-3)  # token times are whole ns
    assert r.mape_percent > 10  # the replayed run's own calls cost twice as much


def test_a_directory_without_headsplit_results_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(SimError, match=r"no raw/<controller>/<controller>_headsplit.json"):
        replay(tmp_path)


def test_the_engine_is_linear_in_the_call_cost() -> None:
    """fit_call_s relies on it: two simulations give the line."""
    devices = [Device("w", 1e10, 10**10, 0.001, 1e8)]
    placement = place(MODEL, [WorkerSpec("w", 10**10, 1e10, 10**6)], "greedy", context_tokens=8)
    base = SimConfig(MODEL, devices, placement, tokens=2)
    t = [
        simulate(replace(base, devices=[replace(devices[0], call_overhead_s=c)])).token_s[1]
        for c in (0, 1, 2)
    ]
    assert t[2] - t[1] == pytest.approx(t[1] - t[0])
