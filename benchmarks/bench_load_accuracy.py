"""Accuracy of the load generator's CPU duty cycle: measured vs target CPU of its core.

    .venv/bin/python benchmarks/bench_load_accuracy.py [--seconds 4] [--core N] [--targets 10 20 ... 80]

For every target the generator's own duty cycle (:class:`dit.device.load.DutyCycle`, 100 ms periods,
busy-spin on ``time.monotonic_ns``) runs pinned to one core (default: the core the generator picks,
the highest allowed one) for ``--seconds``. Printed per target:

- ``process %``: the process's CPU time / wall time (``time.process_time_ns``) — what the generator
  itself consumed, the figure the target is about;
- ``core %``: busy share of the pinned core from ``/proc/stat`` deltas — includes whatever else ran on
  that core (on a shared machine, other people's work), so it is an upper view, not the criterion.

Target: ``process %`` within 2 percentage points of every target 10-80 %. On a loaded machine a spin
phase can be preempted (the wall clock runs on, the process's CPU time does not), which shows up as a
shortfall; the script prints the load average before and after so that can be judged.
"""

from __future__ import annotations

import argparse
import os
import time

from dit.device.load import PERIOD_NS, DutyCycle, pick_core, pin
from dit.device.monitor import read_proc_stat, utilisation_pct


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as fh:
        return " ".join(fh.read().split()[:3])


def measure(target: float, seconds: float, core: int | None) -> tuple[float, float | None]:
    name = f"cpu{core}" if core is not None else "cpu"
    periods = max(1, round(seconds * 1e9 / PERIOD_NS))
    duty = DutyCycle(PERIOD_NS)
    duty.period(0.0)  # align on a period boundary
    stat0 = read_proc_stat()
    cpu0, wall0 = time.process_time_ns(), time.monotonic_ns()
    for _ in range(periods):
        duty.period(target)
    cpu1, wall1 = time.process_time_ns(), time.monotonic_ns()
    stat1 = read_proc_stat()
    process_pct = 100.0 * (cpu1 - cpu0) / (wall1 - wall0)
    core_pct = utilisation_pct(stat0[name], stat1[name]) if name in stat0 else None
    return process_pct, core_pct


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--core", type=int, default=None)
    parser.add_argument("--targets", type=float, nargs="+", default=[10, 20, 30, 40, 50, 60, 70, 80])
    args = parser.parse_args()
    core = pick_core(args.core)
    pin(core)
    print(
        f"core {core}, {args.seconds:g} s per target, load average before: {loadavg()}, cpus {os.cpu_count()}"
    )
    print(f"{'target %':>9} {'process %':>10} {'error pp':>9} {'core %':>8}")
    worst = 0.0
    for target in args.targets:
        process_pct, core_pct = measure(target, args.seconds, core)
        error = process_pct - target
        worst = max(worst, abs(error))
        core_text = f"{core_pct:8.2f}" if core_pct is not None else f"{'-':>8}"
        print(f"{target:9.1f} {process_pct:10.2f} {error:+9.2f} {core_text}")
    verdict = "met" if worst <= 2.0 else "NOT met"
    print(f"worst |error| {worst:.2f} pp (target <= 2 pp: {verdict}); load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
