"""dit.sim.replay: a run directory the simulator itself wrote is replayed exactly, with its per-call cost
recovered; a directory without HeadSplit results is refused saying what it lacks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")

from dit.sim._headsplit import PRESETS, WorkerSpec, place
from dit.sim.engine import Device, SimConfig, SimError, simulate
from dit.sim.replay import fitted_call_s, format_replay, replay

MODEL = PRESETS["gpt2-tiny"]


def write_run(tmp_path: Path, call_s: float, *, jitter: float = 0.0) -> Path:
    """A HeadSplit results file whose token times are the simulator's at ``call_s`` per call."""
    devices = [
        Device("worker1", 4e10, 10**10, 0.002, 125e6, call_s),
        Device("worker2", 2e10, 10**10, 0.004, 125e6, call_s),
    ]
    specs = [WorkerSpec(d.name, d.memory_bytes, d.flops_per_s, round(d.rtt_s * 1e9)) for d in devices]
    placement = place(MODEL, specs, "roundrobin", context_tokens=64)
    sim = simulate(SimConfig(MODEL, devices, placement, tokens=6, prompt_tokens=10))
    token_ns = [round(s * 1e9 * (1 + (jitter if i % 2 else -jitter))) for i, s in enumerate(sim.token_s)]
    doc = {
        "model": {"preset": "gpt2-tiny"},
        "speculation": False,
        "workers": [
            {"name": d.name, "host": f"device{i + 1}", "rtt_ns": [round(d.rtt_s * 1e9)] * 3,
             "flops_per_s": d.flops_per_s, "memory_bytes": d.memory_bytes}
            for i, d in enumerate(devices)
        ],
        "placement": {"units": {u.key(): w for u, w in placement.items()}},
        "prompt_tokens": 10,
        "tokens": [{"index": i, "total_ns": ns} for i, ns in enumerate(token_ns)],
        "start_ns": 0,
        "end_ns": sum(token_ns),
    }  # fmt: skip
    raw = tmp_path / "run" / "raw" / "edge"
    raw.mkdir(parents=True)
    (raw / "edge_headsplit.json").write_text(json.dumps(doc), encoding="utf-8")
    return tmp_path / "run"


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
