"""The system monitor: the ``monitor`` device command (stdlib only).

Once every ``interval_s`` (1 s) it samples

- CPU utilisation, overall and per core, in percent of the interval, from ``/proc/stat`` deltas
  (busy = user + nice + system + irq + softirq + steal; idle = idle + iowait);
- memory from ``/proc/meminfo`` (MemTotal, MemAvailable, used = total - available);
- every thermal zone's temperature, ``<sysfs_root>/class/thermal/thermal_zone*/temp`` (m°C → °C);
- every core's current frequency, ``<sysfs_root>/devices/system/cpu/cpuN/cpufreq/scaling_cur_freq``,
  or the ``scaling_cur_freq`` of the cpufreq policy whose ``affected_cpus`` lists the core (kHz);
- the firmware throttling flags (:data:`THROTTLE_BITS`): ``vcgencmd get_throttled`` where that command
  exists, else ``<sysfs_root>/devices/platform/soc/soc:firmware/get_throttled`` (both hexadecimal); empty
  where neither exists (the edge server).

It writes ``monitor.csv`` (``results_dir``): one row per sample, flushed, first column ``t_mono_ns`` (raw
``time.monotonic_ns()`` at the sample) then the columns fixed at start (they depend on the node's cores and
zones), and ``monitor.json`` with the monitor's own origin pair (``origin_wall_ns``, ``origin_mono_ns``)
and the column sources, so aggregate aligns the trace on the device's origin by arithmetic. Samples are on
an absolute schedule (origin + k·interval; a missed tick is skipped, not bunched). SIGTERM stops it.
SIGHUP hands it over to a sweep's next variant (its condition stays in force, and the variant's
directory is emptied): it writes ``monitor.json`` and a new ``monitor.csv`` before its next sample.
Cost: a handful of small file reads per sample (``benchmarks/bench_monitor_overhead.py``).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from dit.device.common import ConfigError, Origin, require, write_json
from dit.device.sampling import StopSignal, deadline_ns, every
from dit.device.tags import RUN_ENV

#: Raspberry Pi firmware ``get_throttled`` bits.
THROTTLE_BITS: Final[Mapping[str, int]] = {
    "under_voltage_now": 1 << 0,
    "freq_capped_now": 1 << 1,
    "throttled_now": 1 << 2,
    "soft_temp_limit_now": 1 << 3,
    "under_voltage_occurred": 1 << 16,
    "freq_capped_occurred": 1 << 17,
    "throttled_occurred": 1 << 18,
    "soft_temp_limit_occurred": 1 << 19,
}
FIRMWARE_THROTTLED: Final = "devices/platform/soc/soc:firmware/get_throttled"
VCGENCMD_ARGV: Final = ("vcgencmd", "get_throttled")
THROTTLE_SOURCES: Final = ("auto", "vcgencmd", "sysfs", "none")
_CPU_DIR = re.compile(r"cpu(\d+)$")
_ZONE_DIR = re.compile(r"thermal_zone(\d+)$")


# --------------------------------------------------------------------------- readers


def read_proc_stat(path: Path = Path("/proc/stat")) -> dict[str, tuple[int, int]]:
    """``{"cpu": (busy, total), "cpu0": (busy, total), ...}`` in clock ticks since boot."""
    out: dict[str, tuple[int, int]] = {}
    with open(path, encoding="ascii") as fh:
        for line in fh:
            if not line.startswith("cpu"):
                break
            name, *fields = line.split()
            values = [int(v) for v in fields[:8]]  # guest time is already part of user time
            values += [0] * (8 - len(values))
            idle = values[3] + values[4]
            total = sum(values)
            out[name] = (total - idle, total)
    return out


def utilisation_pct(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Busy share of the interval between two ``/proc/stat`` readings, in percent (None: no ticks)."""
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return None
    return 100.0 * max(0, busy) / total


def _read_text(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_throttled(text: str) -> int:
    """``throttled=0x50005`` (vcgencmd) or ``50005`` (sysfs) → the flags as an integer (hexadecimal)."""
    value = text.strip().rpartition("=")[2].strip()
    return int(value, 16)


def decode_throttled(flags: int) -> dict[str, bool]:
    return {name: bool(flags & bit) for name, bit in THROTTLE_BITS.items()}


def _meminfo(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(path, encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def core_frequency_files(sysfs_root: Path) -> dict[int, Path]:
    """Core → the ``scaling_cur_freq`` that reports it (its own cpufreq dir, else its policy's)."""
    cpu_dir = sysfs_root / "devices/system/cpu"
    cores: list[int] = []
    if cpu_dir.is_dir():
        for entry in cpu_dir.iterdir():
            match = _CPU_DIR.match(entry.name)
            if match:
                cores.append(int(match.group(1)))
    policies: dict[int, Path] = {}
    policy_root = cpu_dir / "cpufreq"
    if policy_root.is_dir():
        for policy in sorted(policy_root.glob("policy*")):
            for name in ("affected_cpus", "related_cpus"):
                text = _read_text(policy / name)
                if text:
                    for cpu in text.split():
                        if cpu.isdigit():
                            policies.setdefault(int(cpu), policy / "scaling_cur_freq")
                    break
    out: dict[int, Path] = {}
    for core in sorted(cores):
        own = cpu_dir / f"cpu{core}/cpufreq/scaling_cur_freq"
        if own.is_file():
            out[core] = own
        elif core in policies and policies[core].is_file():
            out[core] = policies[core]
    return out


def thermal_zone_files(sysfs_root: Path) -> dict[str, Path]:
    """Zone name (``thermal_zone0``) → its ``temp`` file."""
    base = sysfs_root / "class/thermal"
    zones: list[tuple[int, Path]] = []
    if base.is_dir():
        for entry in base.iterdir():
            match = _ZONE_DIR.match(entry.name)
            if match and (entry / "temp").is_file():
                zones.append((int(match.group(1)), entry / "temp"))
    return {f"thermal_zone{n}": path for n, path in sorted(zones)}


# --------------------------------------------------------------------------- sampler


class Sampler:
    """Reads one sample; the columns are fixed at construction."""

    def __init__(
        self,
        sysfs_root: Path,
        proc_root: Path = Path("/proc"),
        throttle_source: str = "auto",
        vcgencmd_argv: Sequence[str] = VCGENCMD_ARGV,
    ) -> None:
        self.proc_stat = proc_root / "stat"
        self.meminfo = proc_root / "meminfo"
        self.freq_files = core_frequency_files(sysfs_root)
        self.zones = thermal_zone_files(sysfs_root)
        self.vcgencmd_argv = list(vcgencmd_argv)
        firmware = sysfs_root / FIRMWARE_THROTTLED
        if throttle_source not in THROTTLE_SOURCES:
            raise ConfigError(f"throttle_source: {throttle_source!r} is not one of {THROTTLE_SOURCES}")
        if throttle_source == "auto":
            if self.vcgencmd_argv and shutil.which(self.vcgencmd_argv[0]):
                throttle_source = "vcgencmd"
            elif firmware.is_file():
                throttle_source = "sysfs"
            else:
                throttle_source = "none"
        self.throttle_source = throttle_source
        self.firmware = firmware
        self.prev = read_proc_stat(self.proc_stat)
        self.cpu_names = ["cpu", *sorted((n for n in self.prev if n != "cpu"), key=lambda n: int(n[3:]))]
        self.columns: list[str] = [
            "t_mono_ns",
            *(f"{n}_pct" for n in self.cpu_names),
            "mem_total_bytes",
            "mem_available_bytes",
            "mem_used_pct",
            *(f"{zone}_temp_c" for zone in self.zones),
            *(f"cpu{core}_freq_khz" for core in self.freq_files),
            "throttled",
        ]

    def sources(self) -> dict[str, Any]:
        return {
            "proc_stat": str(self.proc_stat),
            "meminfo": str(self.meminfo),
            "thermal_zones": {zone: str(path) for zone, path in self.zones.items()},
            "frequency": {str(core): str(path) for core, path in self.freq_files.items()},
            "throttle_source": self.throttle_source,
            "throttle": (
                self.vcgencmd_argv
                if self.throttle_source == "vcgencmd"
                else str(self.firmware)
                if self.throttle_source == "sysfs"
                else None
            ),
        }

    def throttled(self) -> int | None:
        try:
            if self.throttle_source == "sysfs":
                text = _read_text(self.firmware)
                return parse_throttled(text) if text else None
            if self.throttle_source == "vcgencmd":
                # The command inherits the blocked SIGTERM/SIGINT (StopSignal); it exits in milliseconds.
                proc = subprocess.run(
                    self.vcgencmd_argv, capture_output=True, text=True, check=False, timeout=5
                )
                return parse_throttled(proc.stdout) if proc.returncode == 0 else None
        except (ValueError, OSError, subprocess.SubprocessError):
            return None
        return None

    def sample(self) -> list[Any]:
        now = time.monotonic_ns()
        stat = read_proc_stat(self.proc_stat)
        row: list[Any] = [now]
        for name in self.cpu_names:
            pct = utilisation_pct(self.prev[name], stat[name]) if name in stat else None
            row.append("" if pct is None else f"{pct:.2f}")
        self.prev = stat
        mem = _meminfo(self.meminfo)
        total, available = mem.get("MemTotal"), mem.get("MemAvailable")
        row += [
            "" if total is None else total,
            "" if available is None else available,
            "" if not total or available is None else f"{100.0 * (total - available) / total:.2f}",
        ]
        for path in self.zones.values():
            milli = _read_int(path)
            row.append("" if milli is None else f"{milli / 1000:.3f}")
        for path in self.freq_files.values():
            khz = _read_int(path)
            row.append("" if khz is None else khz)
        flags = self.throttled()
        row.append("" if flags is None else flags)
        return row


# --------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class MonitorConfig:
    host: str
    run_id: str
    results_dir: Path
    sysfs_root: Path
    proc_root: Path
    interval_s: float
    throttle_source: str
    vcgencmd_argv: tuple[str, ...]
    duration_s: float | None
    ready_file: Path | None


def parse_config(cfg: Mapping[str, Any]) -> MonitorConfig:
    interval = cfg.get("interval_s", 1.0)
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        raise ConfigError(f"interval_s: {interval!r} is not a positive number")
    duration = cfg.get("duration_s")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int | float)):
        raise ConfigError(f"duration_s: {duration!r} is not a number")
    argv = cfg.get("vcgencmd_argv", list(VCGENCMD_ARGV))
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f"vcgencmd_argv: {argv!r} is not a list of strings")
    ready = cfg.get("ready_file")
    return MonitorConfig(
        host=str(require(cfg, "host", str)),
        run_id=str(cfg.get("run_id", "")),
        results_dir=Path(require(cfg, "results_dir", str)),
        sysfs_root=Path(str(cfg.get("sysfs_root") or "/sys")),
        proc_root=Path(str(cfg.get("proc_root") or "/proc")),
        interval_s=float(interval),
        throttle_source=str(cfg.get("throttle_source") or "auto"),
        vcgencmd_argv=tuple(argv),
        duration_s=float(duration) if duration is not None else None,
        ready_file=Path(str(ready)) if ready else None,
    )


def run_monitor(raw: Mapping[str, Any]) -> int:
    """The ``monitor`` command (see the module docstring and ``docs/protocol.md``)."""
    cfg = parse_config(raw)
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(RUN_ENV, cfg.run_id)
    with StopSignal(handover=True) as stop:
        return _monitor(cfg, stop)


def _monitor(cfg: MonitorConfig, stop: StopSignal) -> int:
    sampler = Sampler(cfg.sysfs_root, cfg.proc_root, cfg.throttle_source, cfg.vcgencmd_argv)
    origin = Origin.now()
    interval_ns = round(cfg.interval_s * 1e9)
    end = deadline_ns(origin.mono_ns, cfg.duration_s)
    fh, writer = _begin(cfg, sampler, origin)
    if cfg.ready_file is not None:
        write_json(cfg.ready_file, {"host": cfg.host, "pid": os.getpid(), "columns": sampler.columns})

    def sample() -> None:
        nonlocal fh, writer
        if stop.take_handover():  # a sweep's next variant: its own monitor.csv from here on
            fh.close()
            fh, writer = _begin(cfg, sampler, origin)
        writer.writerow(sampler.sample())
        fh.flush()

    try:
        every(stop, origin.mono_ns, interval_ns, end, sample)
    finally:
        fh.close()
    return 0


def _begin(cfg: MonitorConfig, sampler: Sampler, origin: Origin) -> tuple[TextIO, Any]:
    """``monitor.json`` and a new ``monitor.csv`` with its header (at the start, and at each hand-over
    to a sweep's next variant, whose collect takes the files this writes anew)."""
    write_json(
        cfg.results_dir / "monitor.json",
        {
            "host": cfg.host,
            "run_id": cfg.run_id,
            "pid": os.getpid(),
            "origin_wall_ns": origin.wall_ns,
            "origin_mono_ns": origin.mono_ns,
            "interval_s": cfg.interval_s,
            "columns": sampler.columns,
            "sources": sampler.sources(),
            "throttle_bits": dict(THROTTLE_BITS),
        },
    )
    fh = open(cfg.results_dir / "monitor.csv", "w", encoding="utf-8", newline="")  # noqa: SIM115
    writer = csv.writer(fh, lineterminator="\n")
    writer.writerow(sampler.columns)
    fh.flush()
    return fh, writer
