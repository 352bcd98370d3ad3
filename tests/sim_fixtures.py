"""Run directories for the simulator's tests: a HeadSplit results file whose token times the simulator
itself made (so a replay of it is exact), no run needed. Needs the sim extra (SimPy)."""

from __future__ import annotations

import json
from pathlib import Path

from dit.sim._headsplit import PRESETS, WorkerSpec, place
from dit.sim.engine import Device, SimConfig, simulate

MODEL = PRESETS["gpt2-tiny"]


def write_run(tmp_path: Path, call_s: float, *, jitter: float = 0.0) -> Path:
    """A HeadSplit results file whose token times are the simulator's at ``call_s`` per call."""
    devices = [
        Device("worker1", 4e10, 10**10, 0.002, 125e6, call_s),
        Device("worker2", 2e10, 10**10, 0.004, 125e6, call_s),
    ]
    specs = [WorkerSpec(d.name, d.memory_bytes, d.flops_per_s, round(d.rtt_s * 1e9)) for d in devices]
    placement = place(MODEL, specs, "roundrobin", context_tokens=64)
    # as a replay simulates a HeadSplit run: the controller's RPCs, worker to worker through the controller
    sim = simulate(
        SimConfig(MODEL, devices, placement, tokens=6, prompt_tokens=10, control="rpc", worker_rtt="sum")
    )
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
        "end_ns": sum(token_ns) + round(sum(sim.between_s) * 1e9),  # and the memory samples between tokens
    }  # fmt: skip
    raw = tmp_path / "run" / "raw" / "edge"
    raw.mkdir(parents=True)
    (raw / "edge_headsplit.json").write_text(json.dumps(doc), encoding="utf-8")
    return tmp_path / "run"
