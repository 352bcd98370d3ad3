"""Local mode: every node is a directory on this machine with a fake ``/sys`` tree.

The fake tree has what the roles read and write on a Raspberry Pi 4 (cpufreq policy with its
available frequencies, a thermal zone, the firmware throttle flags) and, on the edge server, what
an Intel desktop exposes (intel_pstate ``no_turbo``, a base frequency). Roles address it through the
``sysfs_root`` host variable (the directory standing for ``/sys``), so the same tasks run against
``/sys`` on the rack.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from dit.conditions.cgroup_roots import cgroup_cpu_root

PI4_FREQS_KHZ = tuple(range(600_000, 1_800_001, 100_000))
EDGE_BASE_KHZ = 3_600_000
EDGE_MAX_KHZ = 4_900_000


def local_runtimes_dir() -> str:
    """One directory of external runtimes' venvs for every local-mode node on this machine
    (``$DIT_RUNTIMES_DIR``, else ``~/.cache/dit/runtimes``): an install serves every later local run."""
    return os.environ.get("DIT_RUNTIMES_DIR") or str(Path.home() / ".cache" / "dit" / "runtimes")


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n", encoding="utf-8")


def make_fake_sysfs(root: Path, role: str, cpus: int = 4) -> Path:
    """Create the fake ``/sys`` of a device (``role='device'``) or the edge server under ``root``."""
    cpu_dir = root / "devices/system/cpu"
    if role == "edge":
        freqs: tuple[int, ...] = (800_000, 2_000_000, EDGE_BASE_KHZ, EDGE_MAX_KHZ)
        max_khz, governor = EDGE_MAX_KHZ, "powersave"
        _write(cpu_dir / "intel_pstate/no_turbo", "0")
        _write(cpu_dir / "intel_pstate/status", "active")
    else:
        freqs, max_khz, governor = PI4_FREQS_KHZ, PI4_FREQS_KHZ[-1], "ondemand"
        _write(root / "devices/platform/soc/soc:firmware/get_throttled", "0")
    for cpu in range(cpus):
        _write(cpu_dir / f"cpu{cpu}/online", "1")
    policies = [0] if role != "edge" else list(range(cpus))
    for index in policies:
        policy = cpu_dir / f"cpufreq/policy{index}"
        related = " ".join(str(c) for c in range(cpus)) if role != "edge" else str(index)
        _write(policy / "affected_cpus", related)
        _write(policy / "related_cpus", related)
        _write(policy / "cpuinfo_min_freq", str(freqs[0]))
        _write(policy / "cpuinfo_max_freq", str(max_khz))
        _write(policy / "scaling_min_freq", str(freqs[0]))
        _write(policy / "scaling_max_freq", str(max_khz))
        _write(policy / "scaling_cur_freq", str(max_khz))
        _write(policy / "scaling_available_frequencies", " ".join(str(f) for f in freqs))
        _write(
            policy / "scaling_available_governors",
            "conservative ondemand userspace powersave performance schedutil",
        )
        _write(policy / "scaling_governor", governor)
        if role == "edge":
            _write(policy / "base_frequency", str(EDGE_BASE_KHZ))
    _write(root / "class/thermal/thermal_zone0/temp", "45000")
    _write(root / "class/thermal/thermal_zone0/type", "cpu-thermal" if role != "edge" else "x86_pkg_temp")
    return root


def snapshot_tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its content (for before/after equality checks)."""
    return {
        str(path.relative_to(root)): path.read_text(encoding="utf-8")
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def cpu_quota_usable(base: Path = Path("/sys/fs/cgroup")) -> bool:
    """This process can create CPU-capped cgroups here: root, and a cpu controller with CFS bandwidth
    control that children may use (v2: ``cpu`` in the root's ``cgroup.subtree_control``)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    root = Path(cgroup_cpu_root(base))
    if (root / "cgroup.controllers").is_file():
        subtree = root / "cgroup.subtree_control"
        return subtree.is_file() and "cpu" in subtree.read_text(encoding="utf-8").split()
    return (root / "cpu.cfs_quota_us").exists()


def default_cpu_share_pct(device_cpus: int, devices: int) -> int:
    """Local mode's CPU share per device: the devices' CPUs split equally, in percent of one CPU
    (two devices on one CPU: 50 each; four devices on three CPUs: 75 each)."""
    if devices <= 0:
        raise ValueError(f"devices: {devices} is not a device count")
    return max(1, 100 * max(1, device_cpus) // devices)


LOCAL_CPU_SHARE_ENV = "DIT_LOCAL_CPU_SHARE"


def _auto_off_or_number(env: str, setting: str | None, upper: int, unit: str) -> int | Literal["auto"] | None:
    """A local-mode setting ``auto | off | N``: unset is ``"auto"``, ``off`` None, N (1..``upper``) N."""
    value = (setting or "auto").strip().lower()
    if value in ("auto", "off"):
        return "auto" if value == "auto" else None
    if value.isdigit() and 1 <= int(value) <= upper:
        return int(value)
    raise ValueError(f"{env}={setting!r}: expected auto, off or {unit} (1-{upper})")


def local_cpu_share(setting: str | None, usable: bool, device_cpus: int, devices: int) -> int | None:
    """Local mode's default share per device from ``DIT_LOCAL_CPU_SHARE``: unset or ``auto`` is
    :func:`default_cpu_share_pct` (where ``usable``: root and a cpu controller), ``off`` none (no CPU
    cgroup unless the scenario sets ``cpu_share_pct``), a number that percentage of one CPU.

    On by default since the start lead is sized from the prepare task and the edge profiles its
    capacity under the devices' load: ch4_validation (4 devices at 25 % of CPU 1, busy loads on three)
    gave a delay-model MAPE of 6.7 % (RR) and 7.4 % (SJF), start lateness under 0.5 ms (2 December
    2026, docs/optimisers.md). It was opt-in before, when the agents shared their share with the load
    and reached the start instant 31-140 s late (MAPE 22 / 44 %)."""
    value = _auto_off_or_number(LOCAL_CPU_SHARE_ENV, setting, 25600, "a percentage of one CPU")
    if value is None or not usable or devices <= 0:
        return None
    return default_cpu_share_pct(device_cpus, devices) if value == "auto" else value


LOCAL_MEMORY_ENV = "DIT_LOCAL_MEMORY_MB"
#: A Raspberry Pi 4's memory (the 4 GB board), MiB: what a local-mode device stands for by default.
DEFAULT_BOARD_MEMORY_MB = 4096


def local_board_memory_mb(setting: str | None) -> int | None:
    """The memory of the board a local-mode device stands for, MiB, from ``DIT_LOCAL_MEMORY_MB``:
    unset or ``auto`` is :data:`DEFAULT_BOARD_MEMORY_MB`, ``off`` none (the machine's MemTotal), a
    number that many MiB. It is the basis of the load's memory targets (``load_board_memory_mb``), so
    that a light load takes a board's 10-20 % and not this machine's: on a 24 GiB machine that was
    4.3 GB for a light load, and the quickstart's apply stage spent 42 s writing it in a 50 % CPU share.
    A scenario's ``hardware.<device>.memory_limit_mb`` (a real cgroup limit) comes first."""
    value = _auto_off_or_number(LOCAL_MEMORY_ENV, setting, 1_048_576, "MiB")
    return DEFAULT_BOARD_MEMORY_MB if value == "auto" else value


def check_local_settings(environ: Mapping[str, str] = os.environ) -> None:
    """Raise ValueError naming the variable when a local-mode setting of ``environ`` is malformed:
    checked before a run directory is made, so a typo leaves nothing behind."""
    local_cpu_share(environ.get(LOCAL_CPU_SHARE_ENV), False, 1, 1)
    local_board_memory_mb(environ.get(LOCAL_MEMORY_ENV))
