"""NNPM's run queue: a run asked for while another is going waits its turn instead of being refused.

A node takes one run at a time (its lease, docs/leases.md): a second ``dit run`` started beside a
going one is refused at preflight. Queued runs (``POST /api/runs`` with ``"queue": true``, ``count``
of them, or any run asked for while one is going or others wait) wait in the store's ``queue`` table,
first in line first, and the server's housekeeping starts the head as soon as nothing is going under
its runs directory: no launch of this server whose driver is alive, and no run (from NNPM or the CLI)
whose state is running or starting with its driver alive. What is going is the queue's *holder*,
shown with each entry's position. The queue outlives a restart of the server (it is in the database).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.run.rundir import find_runs
from dit.web.services import runs as runs_mod
from dit.web.services.store import Store, Version

Launcher = Callable[[Version, str, str], runs_mod.Launch]
"""Start ``dit run`` of a version (kind, mode): :func:`dit.web.services.runs.launch` bound to the server."""


def holder(runs_root: Path, store: Store) -> str | None:
    """What is going under ``runs_root`` (a run key, or a launch not yet in a run directory), or None."""
    for run in find_runs(runs_root):
        try:  # the state first (one small file): only a run still going is looked at further
            state = run.status().get("state")
        except (OSError, ValueError, AttributeError):
            continue
        if state not in (None, "running", "starting"):
            continue
        summary = runs_mod.run_summary(run, runs_root, store)
        if summary["state"] in ("running", "starting") and summary["driver_alive"]:
            return str(summary["key"])
    alive = runs_mod.alive_launches()
    if alive:
        launches = {int(row["pid"]): str(row["id"]) for row in store.launches() if row.get("pid")}
        return f"launch {launches.get(alive[0], alive[0])}"
    return None


def entries(runs_root: Path, store: Store) -> dict[str, Any]:
    """The waiting entries with their position (1 = next) and what is going (also when nothing waits:
    NNPM's Run asks it to say that its run will wait)."""
    waiting = store.queued()
    going = holder(runs_root, store)
    return {
        "holder": going,
        "entries": [
            {
                "id": row["id"],
                "position": i,
                "version": row["version_hash"],
                "name": row["name"],
                "kind": row["kind"],
                "mode": row["mode"],
                "created_ns": row["created_ns"],
            }
            for i, row in enumerate(waiting, start=1)
        ],
    }


class Busy(Exception):
    """A run asked for with ``"queue": false`` while another is going or runs wait their turn."""

    def __init__(self, going: str | None, waiting: int) -> None:
        self.going, self.waiting = going, waiting
        ahead = [f"{going} is going"] if going else []
        ahead += [f"{waiting} run(s) wait their turn"] if waiting else []
        super().__init__(
            f"{' and '.join(ahead)}: a run started now would be refused by the nodes' lease; "
            "queue it (queue: true) or stop what is going first"
        )


@dataclass(frozen=True)
class Started:
    """What :func:`start_or_enqueue` did: ``launch`` when it started the run, else the ``queued`` ids."""

    launch: runs_mod.Launch | None = None
    queued: tuple[str, ...] = ()


# One decision at a time between the requests to run and the housekeeping's advance: two of them seeing
# nothing going at once would start two drivers, and the lease would refuse the second (issue 49, item 1).
_TURN = threading.Lock()


def start_or_enqueue(
    runs_root: Path,
    store: Store,
    version: Version,
    kind: str,
    mode: str,
    start: Launcher,
    count: int = 1,
    queue: bool | None = None,
) -> Started:
    """Start ``version`` now when nothing is going and nothing waits, else queue it behind them.

    ``queue`` True always queues (``count`` entries); False refuses with :class:`Busy` rather than
    queue; None (the default) queues only when it must. Never a second driver beside a going one."""
    with _TURN:
        waiting = len(store.queued())
        going = holder(runs_root, store)
        if queue is False and (going or waiting):
            raise Busy(going, waiting)
        if queue or count > 1 or going or waiting:
            return Started(queued=tuple(store.enqueue(version.hash, kind, mode, count)))
        return Started(launch=start(version, kind, mode))


def advance(runs_root: Path, store: Store, start: Launcher) -> str | None:
    """Start the head of the queue when nothing is going; the id of the entry started, or None.

    An entry whose start fails (its version gone, no inventory) is marked ``failed`` with the error,
    and the next one gets its turn at the next call."""
    with _TURN:
        return _advance(runs_root, store, start)


def _advance(runs_root: Path, store: Store, start: Launcher) -> str | None:
    waiting = store.queued()
    if not waiting or holder(runs_root, store) is not None:
        return None
    head = waiting[0]
    version = store.get(str(head["version_hash"]))
    try:
        if version is None:
            raise ValueError(f"version {head['version_hash']} is no longer stored")
        launched = start(version, str(head["kind"]), str(head["mode"]))
    except (OSError, ValueError) as exc:
        store.settle_queued(str(head["id"]), "failed", error=str(exc))
        return None
    store.settle_queued(str(head["id"]), "started", launch=launched.id)
    return str(head["id"])
