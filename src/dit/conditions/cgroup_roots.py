"""Where this machine creates cgroups: local mode's cgroup roots for the memory and CPU-share conditions.

Not a condition (no ``CONDITION``): the two conditions' ``local_hostvars`` hooks and local mode's check
that CPU shares can be capped here read the machine's hierarchy through it.
"""

from __future__ import annotations

from pathlib import Path


def cgroup_memory_root(base: Path = Path("/sys/fs/cgroup")) -> str:
    """Where memory cgroups are created on this machine: local mode's ``dit_cgroup_root``.

    Memory limits are applied for real in local mode. This is the cgroup v2 root when its
    ``cgroup.controllers`` lists ``memory``, else the cgroup v1 memory hierarchy.
    """
    controllers = base / "cgroup.controllers"
    if controllers.is_file() and "memory" in controllers.read_text(encoding="utf-8").split():
        return str(base)
    if (base / "memory" / "memory.limit_in_bytes").exists():
        return str(base / "memory")
    return str(base)


def cgroup_cpu_root(base: Path = Path("/sys/fs/cgroup")) -> str:
    """Where CPU cgroups are created on this machine: local mode's ``dit_cpu_cgroup_root``.

    The cgroup v2 root when its ``cgroup.controllers`` lists ``cpu``, else the cgroup v1 cpu hierarchy
    (``cpu``, or ``cpu,cpuacct`` where the two share one), else the v2 root (the role then refuses).
    """
    controllers = base / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text(encoding="utf-8").split():
        return str(base)
    for name in ("cpu", "cpu,cpuacct"):
        if (base / name / "cpu.cfs_quota_us").exists():
            return str(base / name)
    return str(base)
