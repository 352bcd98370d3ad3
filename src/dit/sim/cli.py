"""What ``dit simulate`` prints for a simulation file (the replay's table is :func:`dit.sim.replay.format_replay`)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from dit.sim.engine import SimResult, simulate
from dit.sim.galaxy import simulate_galaxy
from dit.sim.spec import load


def run_file(path: Path, strategy: str | None = None) -> tuple[SimResult, float]:
    """Simulate the YAML file ``path`` (``strategy`` overrides its placement); the result and its wall time (s)."""
    config = load(path, strategy)
    t0 = time.perf_counter()
    result = simulate_galaxy(config) if config.partitioning == "galaxy" else simulate(config)
    return result, time.perf_counter() - t0


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
