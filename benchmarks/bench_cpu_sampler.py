"""Cost of the profiler's CPU sampler: the fake model's forward pass with and without sampling.

    .venv/bin/python benchmarks/bench_cpu_sampler.py [--profile alexnet] [--repetitions 30] [--rounds 3]
        [--interval-ms 2]

Profiles the fake model (stdlib BLAKE2b stages, ``dit.device.fakemodel``) alternately with the CPU sampler
off (``cpu_sample_interval_ns=0``) and on, ``--rounds`` times each, and prints the median and minimum
forward-pass time (sum of the stage latencies of one repetition) of each setting and the relative
difference of the medians, with the load average. The sampler wakes every interval while a stage runs,
so its cost is a few microseconds per wake-up plus the GIL hand-over. Target: ≤ 1 % on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from dit.device.fakemodel import build
from dit.device.profiler import profile_model


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="alexnet")
    parser.add_argument("--repetitions", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.profile, args.repetitions, args.rounds = "tiny", 3, 1
    model = build({"name": "fake", "params": {"profile": args.profile}, "seed": 1})
    forwards: dict[int, list[int]] = {0: [], round(args.interval_ms * 1e6): []}
    print(f"load average before: {loadavg()}")
    for round_no in range(args.rounds):
        order = list(forwards) if round_no % 2 == 0 else list(reversed(forwards))  # alternate who goes first
        for interval in order:
            result = profile_model(
                model, repetitions=args.repetitions, warmup=3, cpu_sample_interval_ns=interval
            )
            for rep in range(args.repetitions):
                forwards[interval].append(sum(r.latency_ns for r in result.records if r.rep == rep))
    medians = {}
    for interval, values in forwards.items():
        medians[interval] = statistics.median(values)
        label = "off" if interval == 0 else f"every {interval / 1e6:g} ms"
        print(
            f"sampler {label:>14}: median {medians[interval] / 1e6:8.3f} ms, min {min(values) / 1e6:8.3f} ms"
        )
    off, on = medians.values()
    print(f"overhead of the medians: {100.0 * (on - off) / off:+.2f} %")
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
