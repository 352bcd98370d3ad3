"""Node leases: one run at a time per node, decided on the controller.

Preflight takes a lease on every node: ``lease.json`` in the node's dit directory (``dit_lease_dir``,
by default the directory holding the runs' node directories, ``/var/lib/dit``), holding who took it.
The node-side ``dit_lease`` module only reads, writes (compare-and-swap) and removes that file; whether
the holder still lives can only be told here, on the controller, because the holder is a controller
process: :func:`classify` and :func:`decide` are that decision, as pure functions.

A holder is *live* when it runs on this controller host and its pid still is the process that took
the lease (same start time). It is *stale* when it ran here and that process is gone. A holder on
another controller host cannot be checked from here: it is refused like a live one, and only the
explicit ``--break-stale-lease`` takes the node from it (its age proves nothing: runs can last days).

Local mode is the same: its nodes are this machine, which two local runs really share (CPUs,
loopback, memory cgroups), so the lease lives in one directory per machine
(:func:`local_lease_dir`) and two local runs contend, whatever their runs directories. That directory
is trusted only when it and every directory above it are root's alone (:mod:`dit.trusted`): a lease
another user could plant there would refuse every local run, or let one through beside another.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from dit.runtime_api.interface import NODE_DIT_DIR
from dit.trusted import check_trusted_dir

LEASE_FILE = "lease.json"
LOCAL_LEASE_DIR_ENV = "DIT_LOCAL_LEASE_DIR"
DEFAULT_LEASE_DIR = NODE_DIT_DIR  # a rack node's dit directory, and this machine's in local mode
BREAK_FLAG = "--break-stale-lease"
# Process start times come from boot time + start ticks; the boot time psutil derives can move by
# a second when the clock is stepped. A reused pid that started within a second of the old one is
# not a realistic case.
START_TOLERANCE_S = 1.0


def local_lease_dir() -> str:
    """The directory of this machine's lease in local mode (``DIT_LOCAL_LEASE_DIR`` overrides it), once
    it and the directories above it are known to be root's alone.

    Raises :class:`dit.trusted.UntrustedPath` naming the directory, its owner and the fix otherwise.
    A directory that does not exist yet passes when what exists above it does: ``dit_lease`` creates
    it, root's, component by component.
    """
    path = os.environ.get(LOCAL_LEASE_DIR_ENV) or DEFAULT_LEASE_DIR
    with contextlib.suppress(FileNotFoundError):
        check_trusted_dir(path, what=f"local mode's lease directory ({LOCAL_LEASE_DIR_ENV})")
    return path


@dataclass(frozen=True)
class Holder:
    """What a lease file holds: the run and the controller process that took it."""

    run_id: str
    controller_host: str
    controller_pid: int
    pid_started_s: float  # the controller pid's start time (seconds since the epoch)
    since_wall_ns: int  # when the lease was taken
    run_dir: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "since": _utc(self.since_wall_ns)}

    def describe(self) -> str:
        return (
            f"run {self.run_id} (controller {self.controller_host}, pid {self.controller_pid}, "
            f"since {_utc(self.since_wall_ns)}, run directory {self.run_dir})"
        )


def _utc(wall_ns: int) -> str:
    return datetime.fromtimestamp(wall_ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def named_run_id(text: str) -> str | None:
    """The run id a lease file's content names (its ``run_id``), or None: what the node's
    ``dit_lease`` calls this run's own lease, which it keeps and journals nothing for. The node side
    cannot import dit, so ``module_utils/dit_lease_file.py`` spells the same reading (``run_id_of``);
    a test holds the two to the same answers."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return str(data.get("run_id")) if isinstance(data, dict) and data.get("run_id") else None


def parse_holder(data: Any) -> Holder | None:
    """The holder in a lease file's JSON, or None when it is not a complete lease."""
    if not isinstance(data, Mapping):
        return None
    try:
        holder = Holder(
            run_id=str(data["run_id"]),
            controller_host=str(data["controller_host"]),
            controller_pid=int(data["controller_pid"]),
            pid_started_s=float(data["pid_started_s"]),
            since_wall_ns=int(data["since_wall_ns"]),
            run_dir=str(data.get("run_dir", "")),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return holder if holder.run_id else None


def process_started_s(pid: int) -> float | None:
    """The start time of ``pid`` on this machine, or None when no such (live) process exists."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:  # it exists; its start time is readable from /proc for any user
        return None


def controller_holder(run_id: str, run_dir: Path) -> Holder:
    """This driver process as a lease holder."""
    pid = os.getpid()
    return Holder(
        run_id=run_id,
        controller_host=platform.node(),
        controller_pid=pid,
        pid_started_s=process_started_s(pid) or 0.0,
        since_wall_ns=time.time_ns(),
        run_dir=str(run_dir),
    )


class State(enum.Enum):
    FREE = "free"  # no lease file
    OURS = "ours"  # held by this run (another host of the run took it on a shared machine)
    LIVE = "live"  # held by a run whose driver runs on this controller host
    STALE = "stale"  # held by a run whose driver on this controller host is gone
    ELSEWHERE = "elsewhere"  # held by a run on another controller host: cannot be checked from here
    UNREADABLE = "unreadable"  # a lease file that is not a lease


def classify(
    text: str | None,
    run_id: str,
    controller_host: str,
    started_s: Callable[[int], float | None] = process_started_s,
) -> tuple[State, Holder | None]:
    """The state of a node's lease file content ``text`` (None: no file) for run ``run_id``."""
    if text is None:
        return State.FREE, None
    try:
        holder = parse_holder(json.loads(text))
    except ValueError:
        holder = None
    if holder is None:
        return State.UNREADABLE, None
    if holder.run_id == run_id:
        return State.OURS, holder
    if holder.controller_host != controller_host:
        return State.ELSEWHERE, holder
    started = started_s(holder.controller_pid)
    if started is None or abs(started - holder.pid_started_s) > START_TOLERANCE_S:
        return State.STALE, holder
    return State.LIVE, holder


@dataclass(frozen=True)
class Decision:
    take: bool
    breaks: bool  # taking it means replacing another run's lease
    message: str | None  # why it is refused, or what was broken


def decide(state: State, holder: Holder | None, node: str, lease_path: str, break_stale: bool) -> Decision:
    """Take the lease, break a stale one (only with ``break_stale``), or refuse with the holder named."""
    if state in (State.FREE, State.OURS):
        return Decision(True, False, None)
    if holder is None:
        why, remedy = f"node {node}: {lease_path} is not a lease dit can read", ""
    else:
        held = f"node {node} is leased by {holder.describe()}"
        if state is State.LIVE:
            return Decision(
                False, False, f"{held}, which is still running: wait for it or 'dit stop {holder.run_dir}'"
            )
        if state is State.STALE:
            why = f"{held}, whose driver is gone (pid {holder.controller_pid} no longer runs it)"
            remedy = f"'dit cleanup {holder.run_dir}' releases it"
        else:
            why = f"{held}; dit cannot tell from here whether that run still goes on"
            remedy = f"if it is over, 'dit cleanup {holder.run_dir}' on {holder.controller_host} releases it"
    if break_stale:
        return Decision(True, True, f"breaking the lease: {why}")
    remedy = f"{remedy}, or" if remedy else "remove it by hand or"
    return Decision(False, False, f"{why}: {remedy} run again with {BREAK_FLAG} to take it over")
