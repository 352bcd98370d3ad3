"""What ``dit simulate`` prints for a simulation file (the replay's table is :func:`dit.sim.replay.format_replay`)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import yaml

from dit.sim.engine import SimConfig, SimError, SimResult, simulate
from dit.sim.galaxy import simulate_galaxy
from dit.sim.output import Simulated
from dit.sim.spec import load


def run_file(path: Path, strategy: str | None = None) -> tuple[SimResult, float]:
    """Simulate the YAML file ``path`` (``strategy`` overrides its placement); the result and its wall time (s)."""
    return run_config(load(path, strategy))


def run_config(config: SimConfig) -> tuple[SimResult, float]:
    """Simulate ``config`` (Galaxy's engine or the head-level one); the result and its wall time (s)."""
    t0 = time.perf_counter()
    result = simulate_galaxy(config) if config.partitioning == "galaxy" else simulate(config)
    return result, time.perf_counter() - t0


def placements_of(path: Path, placements: str | None) -> list[str]:
    """The placements to simulate: ``placements`` (comma-separated) or else the file's own."""
    if placements:
        names = [p.strip() for p in placements.split(",")]
        if any(not n for n in names) or len(set(names)) != len(names):
            raise SimError(f"--placement: {placements!r} is not a comma-separated list of distinct names")
        return names
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        doc = None  # load() says what is wrong with the file
    name = doc.get("placement", "greedy") if isinstance(doc, dict) else "greedy"
    return [str(name)]


def run_placements(path: Path, placements: str | None) -> list[Simulated]:
    """Simulate the file ``path`` under each of ``placements`` (comma-separated; default its own)."""
    configs = [(name, load(path, name)) for name in placements_of(path, placements)]  # all checked first
    return [Simulated(name, config, *run_config(config)) for name, config in configs]


def format_result(result: SimResult, wall_s: float) -> str:
    token_ms = [1e3 * s for s in result.token_s]
    lines = [
        f"tokens {len(token_ms)}, simulated {result.total_s:.2f} s, {result.tokens_per_s:.2f} tokens/s",
        f"token latency mean {statistics.fmean(token_ms):.2f} ms, last {token_ms[-1]:.2f} ms",
    ]
    last = result.memory[-1] if result.memory else {}
    for device, used in last.items():
        lines.append(f"  {device:<12} memory {used / 1e6:10.1f} MB")
    lines.append(
        f"migrations {len(result.migrations)}, {sum(m.bytes for m in result.migrations) / 1e6:.1f} MB"
    )
    if result.oom:
        lines.append(f"out of memory: {result.oom}")
    lines.append(
        f"{result.events} events in {wall_s:.2f} s ({result.events / max(wall_s, 1e-9):,.0f} events/s)"
    )
    return "\n".join(lines)
