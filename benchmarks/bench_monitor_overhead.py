"""Cost of the 1 Hz monitor: its CPU time over its wall time, as a share of one core.

    .venv/bin/python benchmarks/bench_monitor_overhead.py [--seconds 40] [--interval 1]
        [--sysfs-root DIR] [--vcgencmd-argv /bin/echo throttled=0x0]

Starts the real ``monitor`` device command (``python -m dit.device monitor``) as a subprocess against
a fake Raspberry Pi 4 ``/sys`` (four cores under one cpufreq policy, a thermal zone, the firmware
throttling flags — the reads a Pi's monitor does; or ``--sysfs-root``), waits until it is ready
(interpreter start-up excluded), lets it sample for ``--seconds`` and reads its CPU time from
``/proc/<pid>/stat`` (utime + stime, plus cutime + cstime of the commands it ran, which matters with
``--vcgencmd-argv``, a stand-in for the ``vcgencmd get_throttled`` process a Pi spawns every sample).
Target: at most 0.5 % of one core at 1 Hz.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dit.run.localmode import make_fake_sysfs


def cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    fields = stat[stat.rfind(b")") + 2 :].split()
    return sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--sysfs-root", type=Path, default=None)
    parser.add_argument("--vcgencmd-argv", nargs="+", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.interval = 1.0, 0.2
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="dit-monitor-bench-") as tmp:
        root = Path(tmp)
        sysfs = args.sysfs_root or make_fake_sysfs(root / "sys", "device")
        config: dict[str, object] = {
            "host": "bench",
            "run_id": "bench",
            "results_dir": str(root / "results"),
            "sysfs_root": str(sysfs),
            "interval_s": args.interval,
            "ready_file": str(root / "monitor.ready"),
        }
        if args.vcgencmd_argv:
            config |= {"throttle_source": "vcgencmd", "vcgencmd_argv": args.vcgencmd_argv}
        else:
            config["vcgencmd_argv"] = ["no-vcgencmd-on-this-machine"]
        (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dit.device", "monitor", "--config", str(root / "config.json")],
            start_new_session=True,
        )
        try:
            while not (root / "monitor.ready").exists():
                if proc.poll() is not None:
                    raise SystemExit(f"monitor exited with {proc.returncode}")
                time.sleep(0.05)
            startup = cpu_ticks(proc.pid)
            print(f"load average before: {loadavg()}; start-up cost {startup / hz:.3f} s CPU (excluded)")
            t0, c0 = time.monotonic(), cpu_ticks(proc.pid)
            time.sleep(args.seconds)
            t1, c1 = time.monotonic(), cpu_ticks(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        rows = len((root / "results" / "monitor.csv").read_text().splitlines()) - 1
        header = json.loads((root / "results" / "monitor.json").read_text())
    cpu_s = (c1 - c0) / hz
    share = 100.0 * cpu_s / (t1 - t0)
    per_sample_ms = 1000.0 * cpu_s / max(1, round((t1 - t0) / args.interval))
    print(
        f"interval {args.interval:g} s, {t1 - t0:.1f} s measured, {rows} samples in all, "
        f"{len(header['columns']) - 1} metrics, throttling from {header['sources']['throttle_source']}"
    )
    print(
        f"CPU {cpu_s:.3f} s (clock ticks of 1/{hz} s) = {share:.3f} % of one core, ~{per_sample_ms:.2f} ms/sample"
    )
    verdict = "met" if share <= 0.5 else "NOT met"
    print(f"target <= 0.5 % of one core: {verdict}; load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
