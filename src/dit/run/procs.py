"""Controller-side view of a run's processes (local mode: every node is this machine)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from dit.analysis.run import PROCESSES_FILE
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


def holds_directory(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` has ``directory`` open (``/proc/<pid>/fd``), as a run's driver holds
    its run directory for as long as it runs (:meth:`dit.run.driver.Driver.execute`).

    Unlike the pid, start time and command line in ``driver.json``, which anyone who could write that
    file could have copied from any process, this is the process's own state. False when it cannot be
    read (gone, no /proc).
    """
    try:
        wanted = os.stat(directory)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.path.samestat(os.stat(f"/proc/{pid}/fd/{fd}"), wanted):
                return True
        except OSError:  # closed meanwhile
            continue
    return False


# --------------------------------------------------------------------------- device process exits


@dataclass(frozen=True)
class ProcessFailure:
    """A device process (monitor, load, power, netem-vary, edge …) that ended badly during the run."""

    node: str
    process: str  # its tag
    state: str  # exited (non-zero code) | vanished (gone without an exit code: a signal) | unreadable
    exit_code: int | None
    error: str | None
    stderr_tail: tuple[str, ...]

    def describe(self) -> str:
        if self.state == "unreadable":
            return f"{self.node}: the device process records are unreadable ({self.error})"
        how = f"exited with code {self.exit_code}" if self.state == "exited" else "ended without an exit code"
        return f"{self.node}: {self.process} {how}" + (f" ({self.error})" if self.error else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "process": self.process,
            "state": self.state,
            "exit_code": self.exit_code,
            "error": self.error,
            "stderr_tail": list(self.stderr_tail),
        }


def process_failures(raw_dir: Path, hosts: Iterable[str]) -> list[ProcessFailure]:
    """The failed device processes recorded in ``raw/<host>/<host>_processes.json`` (collect stage).

    A node without the file (collect did not reach it) contributes nothing; a file that is not a list of
    records is reported as a failure of the node's process check, so a broken check never passes silently.
    """
    out: list[ProcessFailure] = []
    for host in hosts:
        path = raw_dir / host / f"{host}_{PROCESSES_FILE}"
        if not path.exists():
            continue
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            out.append(ProcessFailure(host, "process check", "unreadable", None, f"{path}: {exc}", ()))
            continue
        if not isinstance(entries, list):
            out.append(ProcessFailure(host, "process check", "unreadable", None, f"{path}: not a list", ()))
            continue
        for entry in entries:
            if not isinstance(entry, dict) or not entry.get("failed"):
                continue
            code = entry.get("exit_code")
            tail = entry.get("stderr_tail") or []
            out.append(
                ProcessFailure(
                    node=host,
                    process=str(entry.get("tag", "?")),
                    state=str(entry.get("state", "?")),
                    exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                    error=str(entry["error"]) if entry.get("error") else None,
                    stderr_tail=tuple(str(line) for line in tail) if isinstance(tail, list) else (),
                )
            )
    return out
