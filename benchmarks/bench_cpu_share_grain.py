"""How much faster than its share a CPU-quota'd process runs work started after a pause.

    sudo .venv/bin/python benchmarks/bench_cpu_share_grain.py [--share 25] [--work-ms 6 18] [--periods 10000 4000]

A CFS quota lets a process run at full speed until the quota of the current period is spent, then
stops it until the next period. A partition's local part starts after the device idled (it waited for
its start instant, or for the edge's reply), so its first quota is a burst at full speed; the
profile's timing passes run back to back and pay the stops. This benchmark puts itself in a cgroup v1
``cpu`` group with ``--share`` % of one CPU at each period of ``--periods`` (quota = share x period)
on CPU 1, and times a fixed amount of pure-Python work (``--work-ms`` at full speed, calibrated
outside the group) after a 200 ms pause and back to back. Printed per period and amount: the work at
full speed, the two wall times, the uniform time (work / share: a board whose clock is that much
slower), and after-a-pause / uniform (1.0: no burst). Root, cgroup v1 ``cpu`` with CFS bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

GROUP = Path("/sys/fs/cgroup/cpu/dit-bench-grain")
ROOT_PROCS = Path("/sys/fs/cgroup/cpu/cgroup.procs")


def spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def timed(n: int) -> float:
    t0 = time.perf_counter()
    spin(n)
    return time.perf_counter() - t0


def calibrate(work_ms: float) -> tuple[int, float]:
    n = 100_000
    per_iter = min(timed(n) for _ in range(20)) / n
    n = int(work_ms / 1e3 / per_iter)
    return n, min(timed(n) for _ in range(5))


def measure(period_us: int, share_pct: int, n: int, rounds: int) -> tuple[float, float]:
    GROUP.mkdir(exist_ok=True)
    (GROUP / "cpu.cfs_quota_us").write_text("-1")
    (GROUP / "cpu.cfs_period_us").write_text(str(period_us))
    (GROUP / "cpu.cfs_quota_us").write_text(str(period_us * share_pct // 100))
    (GROUP / "cgroup.procs").write_text(str(os.getpid()))
    try:
        after_pause: list[float] = []
        back_to_back: list[float] = []
        for _ in range(rounds):
            time.sleep(0.2)
            after_pause.append(timed(n))
            back_to_back += [timed(n) for _ in range(5)]
    finally:
        ROOT_PROCS.write_text(str(os.getpid()))
        GROUP.rmdir()
    return statistics.mean(after_pause), statistics.mean(back_to_back)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--share", type=int, default=25, help="percent of one CPU")
    ap.add_argument("--work-ms", type=float, nargs="+", default=[6.0, 18.0])
    ap.add_argument("--periods", type=int, nargs="+", default=[10_000, 4_000], help="CFS periods, us")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.work_ms, args.periods, args.rounds = [2.0], [10_000], 2
    if os.geteuid() != 0 or not (ROOT_PROCS.parent / "cpu.cfs_quota_us").exists():
        raise SystemExit("needs root and a cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu")
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    print(f"load average at start: {os.getloadavg()}; share {args.share} % of one CPU")
    print(
        f"{'period ms':>9} {'quota ms':>8} {'work ms':>8} {'after pause':>11} {'back to back':>12} "
        f"{'uniform':>8} {'pause/uniform':>13}"
    )
    for work_ms in args.work_ms:
        n, full = calibrate(work_ms)
        for period in args.periods:
            pause, b2b = measure(period, args.share, n, args.rounds)
            uniform = full * 100 / args.share
            print(
                f"{period / 1e3:>9.1f} {period * args.share / 100 / 1e3:>8.2f} {full * 1e3:>8.2f} "
                f"{pause * 1e3:>11.2f} {b2b * 1e3:>12.2f} {uniform * 1e3:>8.2f} {pause / uniform:>13.2f}",
                flush=True,
            )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
