"""The simulator's speed and the exact placement's time and gaps.

    .venv/bin/python benchmarks/bench_simulator.py [--devices 25] [--tokens 1000] [--smoke]

1. ``dit simulate``'s engine on TinyLlama (22 layers x 32 heads) over ``--devices`` heterogeneous devices
   for ``--tokens`` tokens, each HeadSplit strategy (greedy with re-placement at 85 % of memory): the
   wall time, simulated events per second, the simulated seconds and the migrations (target: 25 devices
   x 1000 tokens in <= 60 s).
2. The exact HeadSplit placement (HiGHS MILP, :mod:`dit.sim.exact_placement`) on ``llama-tiny`` for 3, 4
   and 5 workers over random instances: solver time and the gap of layerwise, roundrobin and greedy to
   the optimum of their own cost model (the article: greedy within 15-20 % of an exact solver).

``--smoke``: 4 devices x 10 tokens and one 3-worker instance (seconds; CI runs it). On a shared machine
read the CPU time: events per CPU-second is the engine's speed, the wall time includes waiting for a core.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from dit.sim.engine import Device, SimConfig, simulate
from dit.sim.exact_placement import gaps
from dit.sim.placement_model import PRESETS, STRATEGIES, PlacementError, place, worker_spec
from dit.sim.spec import worker_specs


def devices(n: int, seed: int) -> list[Device]:
    """The WiOpt study's mix: a fifth fast (20 GFLOP/s, 4 GB), two fifths mid, two fifths slow (1 GB), 1-10 Gbit/s."""
    rng = random.Random(seed)
    kinds = [(20e9, 4000, 10_000), (8e9, 2000, 2500), (2e9, 1000, 1000)]
    out = []
    for i in range(n):
        flops, mb, mbps = kinds[0 if i < n // 5 else 1 if i < 3 * n // 5 else 2]
        out.append(
            Device(
                f"d{i + 1}",
                flops * rng.uniform(0.9, 1.1),
                mb * 10**6,
                rng.uniform(0.2e-3, 1e-3),
                mbps * 1e6 / 8,
            )
        )
    return out


def bench_engine(n_devices: int, tokens: int) -> None:
    model = PRESETS["tinyllama"]
    devs = devices(n_devices, 2026)
    print(f"engine: {model.name}, {n_devices} devices, {tokens} tokens (prompt 8)")
    for strategy in STRATEGIES:
        try:
            placement = place(
                model, worker_specs(devs), strategy, context_tokens=64, bandwidth_bytes_per_s=125e6
            )
        except PlacementError as exc:
            print(f"  {strategy:<10} no placement: {exc}")
            continue
        config = SimConfig(model, devs, placement, tokens, 8, replacement=strategy == "greedy")
        t0, c0 = time.perf_counter(), time.process_time()
        r = simulate(config)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(
            f"  {strategy:<10} wall {wall:7.2f} s  CPU {cpu:7.2f} s  {r.events / max(cpu, 1e-9):9,.0f} events/CPU-s"
            f"  simulated {r.total_s:8.2f} s"
            f"  last token {1e3 * r.token_s[-1]:7.1f} ms  migrations {len(r.migrations)}"
            f"  {'OOM ' + r.oom if r.oom else ''}"
        )


def bench_exact(instances: int, sizes: tuple[int, ...]) -> None:
    model = PRESETS["llama-tiny"]
    print(f"exact placement: {model.name}, {instances} random instance(s) per size, context 64, 100 Mbit/s")
    for n in sizes:
        times: list[float] = []
        found: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        for seed in range(instances):
            rng = random.Random(1000 * n + seed)
            ws = [
                worker_spec(f"worker{i + 1}", 10**9, rng.uniform(1e8, 1e9), rng.randint(1, 20) * 10**6)
                for i in range(n)
            ]
            t0 = time.perf_counter()
            _, gs = gaps(model, ws, context_tokens=64, bandwidth_bytes_per_s=12.5e6)
            times.append(time.perf_counter() - t0)
            for g in gs:
                if g.gap_percent is not None:
                    found[g.strategy].append(g.gap_percent)
        cells = "  ".join(
            f"{s} {statistics.fmean(v):6.1f} % (max {max(v):6.1f})" if v else f"{s} -"
            for s, v in found.items()
        )
        print(f"  {n} workers: solve {statistics.median(times):6.2f} s median  gap mean {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=25)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.devices, args.tokens, args.instances = 4, 10, 1
    print(f"load average {os.getloadavg()[0]:.2f}")
    bench_engine(args.devices, args.tokens)
    bench_exact(args.instances, (3,) if args.smoke else (3, 4, 5))


if __name__ == "__main__":
    main()
