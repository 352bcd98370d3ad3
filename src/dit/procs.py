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
