"""Run directories for the simulator's tests: a HeadSplit results file whose token times the simulator
itself made (so a replay of it is exact), no run needed. Needs the sim extra (SimPy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dit.sim.engine import Device, SimConfig, SimResult, simulate
from dit.sim.placement_model import PRESETS, place
from headsplit.config import ModelConfig
from headsplit.placement import WorkerSpec

MODEL = PRESETS["gpt2-tiny"]
# two layers of four heads (two KV heads): small enough to compute a token's time by hand
HAND4 = ModelConfig(
    "hand4",
    "llama",
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    hidden=16,
    ffn_hidden=32,
    vocab=16,
    max_positions=64,
)


def write_run(tmp_path: Path, call_s: float, *, jitter: float = 0.0, control: str = "rpc") -> Path:
    """A HeadSplit results file whose token times are the simulator's at ``call_s`` per call, driven by
    ``control`` (recorded in the file when dataflow: a file of before the field was rpc's)."""
    devices = [
        Device("worker1", 4e10, 10**10, 0.002, 125e6, call_s),
        Device("worker2", 2e10, 10**10, 0.004, 125e6, call_s),
    ]
    specs = [WorkerSpec(d.name, d.memory_bytes, d.flops_per_s, round(d.rtt_s * 1e9)) for d in devices]
    placement = place(MODEL, specs, "roundrobin", context_tokens=64)
    # as a replay simulates a HeadSplit run: the controller's RPCs, worker to worker through the controller
    sim = simulate(
        SimConfig(MODEL, devices, placement, tokens=6, prompt_tokens=10, control=control, worker_rtt="sum")
    )
    token_ns = [round(s * 1e9 * (1 + (jitter if i % 2 else -jitter))) for i, s in enumerate(sim.token_s)]
    tokens = [{"index": i, "total_ns": ns} for i, ns in enumerate(token_ns)]
    run = _write_results(
        tmp_path, devices, {"units": {u.key(): w for u, w in placement.items()}}, tokens, sim
    )
    if control != "rpc":
        file = run / "raw" / "edge" / "edge_headsplit.json"
        file.write_text(json.dumps({**json.loads(file.read_text(encoding="utf-8")), "control": control}))
    return run


def _write_results(
    tmp_path: Path,
    devices: list[Device],
    placement: dict[str, Any],
    tokens: list[dict[str, Any]],
    sim: SimResult,
) -> Path:
    """``run/raw/edge/edge_headsplit.json`` of a simulated run: its workers, placement and token times."""
    doc = {
        "model": {"preset": "gpt2-tiny"},
        "speculation": False,
        "workers": [
            {"name": d.name, "host": f"device{i + 1}", "rtt_ns": [round(d.rtt_s * 1e9)] * 3,
             "flops_per_s": d.flops_per_s, "memory_bytes": d.memory_bytes}
            for i, d in enumerate(devices)
        ],
        "placement": placement,
        "prompt_tokens": 10,
        "tokens": tokens,
        "start_ns": 0,
        # and the memory samples between tokens
        "end_ns": sum(t["total_ns"] for t in tokens) + round(sum(sim.between_s) * 1e9),
    }  # fmt: skip
    raw = tmp_path / "run" / "raw" / "edge"
    raw.mkdir(parents=True)
    (raw / "edge_headsplit.json").write_text(json.dumps(doc), encoding="utf-8")
    return tmp_path / "run"


# two local devices at 20 % and 80 % of a CPU, as local mode's cpu_share applies them (CFS quota, period)
QUOTAS = {"device1": (1000, 5000), "device2": (1600, 2000)}
CPU_RATES = (2e7, 1e8, 4e8)  # head, proj, ffn: FLOPs per CPU-second, the same code on either device


def write_quota_run(tmp_path: Path, strategy: str, call_s: float = 0.001) -> Path:
    """A local run of two workers under CPU quotas (``metadata.json``'s ``cpu_share`` conditions) whose
    token and stage times the simulator made from one CPU-time rate per kind (:data:`CPU_RATES`) and
    ``call_s`` of CPU per call, each device through its quota; ``strategy`` places the units."""
    devices = [
        Device(
            f"worker{i + 1}",
            1e10,
            10**10,
            0.0005,
            1e9,
            call_s,
            CPU_RATES,
            cpu_quota_s=quota / 1e6,
            cpu_period_s=period / 1e6,
        )
        for i, (quota, period) in enumerate(QUOTAS.values())
    ]
    # the placement as if device2 were four times device1 (its share)
    specs = [WorkerSpec(d.name, d.memory_bytes, 1e9 * (1 + 3 * i), 500_000) for i, d in enumerate(devices)]
    placement = place(MODEL, specs, strategy, context_tokens=64)  # type: ignore[arg-type]
    sim = simulate(
        SimConfig(MODEL, devices, placement, tokens=6, prompt_tokens=10, control="rpc", worker_rtt="sum")
    )
    tokens = [
        {"index": i, "total_ns": round(s * 1e9), "attention_ns": round(h * 1e9), "reexec_ns": 0,
         "speculative_ns": 0, "projection_ns": round(p * 1e9), "ffn_ns": round(f * 1e9), "speculated": []}
        for i, (s, (h, p, f)) in enumerate(zip(sim.token_s, sim.stage_s, strict=True))
    ]  # fmt: skip
    units = {u.key(): w for u, w in placement.items()}
    run = _write_results(
        tmp_path, devices, {"units": units, "costs": {"source": "micro-benchmark"}}, tokens, sim
    )
    conditions = {
        host: {"cpu_share": {"cgroup_cpu_quota_us": q, "cgroup_cpu_period_us": p}}
        for host, (q, p) in QUOTAS.items()
    }
    (run / "metadata.json").write_text(json.dumps({"conditions": conditions}), encoding="utf-8")
    return run
