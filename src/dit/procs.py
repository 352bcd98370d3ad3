"""Controller-side view of a run's processes (local mode: every node is this machine)."""

from __future__ import annotations

import os

import psutil

from dit.device.tags import RUN_ENV


def run_processes(run_id: str) -> list[psutil.Process]:
    """Live processes on this machine whose environment carries ``DIT_RUN_ID=run_id``."""
    found: list[psutil.Process] = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(RUN_ENV) == run_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def pid_alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_identity(pid: int) -> dict[str, object]:
    """What tells process ``pid`` apart from a later one that reuses its pid (for ``driver.json``)."""
    proc = psutil.Process(pid)
    return {"pid_create_time": proc.create_time(), "pid_cmdline": proc.cmdline()}


# psutil derives a start time from the boot time, which NTP may shift by up to a second.
CREATE_TIME_TOLERANCE_S = 1.0


def identity_mismatch(pid: int, identity: dict[str, object]) -> str | None:
    """Why ``pid`` is not the process :func:`process_identity` recorded (None: it is that process)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"pid {pid} has exited"
        created, cmdline = proc.create_time(), proc.cmdline()
    except psutil.NoSuchProcess:
        return f"pid {pid} has exited"
    except psutil.AccessDenied:
        return f"pid {pid} cannot be inspected"
    recorded = identity.get("pid_create_time")
    if not isinstance(recorded, int | float) or abs(created - recorded) > CREATE_TIME_TOLERANCE_S:
        return f"pid {pid} is now another process (started at a different time)"
    if cmdline != identity.get("pid_cmdline"):
        return f"pid {pid} is now another process ({' '.join(cmdline)[:80]!r})"
    return None
