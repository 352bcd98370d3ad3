"""Runtimes: each node's readiness for every installed runtime, and the runtimes' maintenance actions.

Both run through :mod:`dit.runtime_ops.plays` (the code ``dit runtimes check|act`` runs: ansible-runner
against the NNPM inventory, with the driver's own environment), in a thread. Every task result is
appended to the action's log in ``run.log``'s format (``<UTC time> <node> <stream> <text>``), which the
terminal streams live. A node's readiness is only ever the check's verdict
(:func:`dit.runtime_ops.plays.readiness_of`): ``ok`` when every check of the runtime ran on it and passed,
``failed`` or ``unreachable`` with the reason otherwise — including when the check could not run at all.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dit.run.ansible_exec import HostEvent
from dit.runtime_api.interface import CHECK_PREFIX, NodeReadiness, Runtime
from dit.runtime_api.interface import Action as RuntimeAction

__all__ = ["Action", "Actions"]


@dataclass
class Action:
    """One Ansible run started from NNPM: a readiness check or a maintenance action."""

    id: str
    kind: str  # check | maintenance
    runtime: str
    title: str
    log: Path
    hosts: list[str]
    state: str = "running"  # running | done | failed
    rc: int | None = None
    # host -> check -> result, as the check's tasks report (the live table)
    checks: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # the verdicts (NodeReadiness) when finished
    started_ns: int = field(default_factory=time.time_ns)
    finished_ns: int | None = None
    error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def line(self, node: str, stream: str, text: str) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        with self._lock, self.log.open("a", encoding="utf-8") as out:
            for part in text.splitlines() or [""]:
                out.write(f"{stamp} {node} {stream} {part}\n")

    @property
    def finished(self) -> bool:
        return self.state != "running"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "runtime": self.runtime,
            "title": self.title,
            "hosts": self.hosts,
            "state": self.state,
            "rc": self.rc,
            "checks": self.checks,
            "nodes": self.nodes,
            "started_ns": self.started_ns,
            "finished_ns": self.finished_ns,
            "error": self.error,
        }


def event_line(action: Action, event: HostEvent) -> None:
    """One task result into the action's log (and, for a readiness check, its live per-check table)."""
    action.line(event.host, "ansible", event.message())
    for stream in ("stdout", "stderr"):
        text = str(event.result.get(stream) or "").strip()
        if text:
            action.line(event.host, stream, text[-4000:])
    for item in event.result.get("results") or []:
        if isinstance(item, dict) and str(item.get("stdout") or "").strip():
            action.line(event.host, "stdout", str(item["stdout"]).strip()[-4000:])
    if action.kind == "check" and event.task.startswith(CHECK_PREFIX) and event.status != "skipped":
        from dit.runtime_ops.plays import check_detail

        action.checks.setdefault(event.host, {})[event.task.removeprefix(CHECK_PREFIX)] = {
            "ok": event.status in ("ok", "changed"),
            "detail": check_detail(event),
        }


class Actions:
    """The actions of this server (kept in memory; their logs are files under ``<base>/actions``)."""

    def __init__(self, base: Path, inventory: Callable[[], Path | None]) -> None:
        self.base = base
        self.inventory = inventory
        self.items: dict[str, Action] = {}

    def _new(self, kind: str, runtime: str, title: str, hosts: Sequence[str]) -> Action:
        (self.base / "actions").mkdir(parents=True, exist_ok=True)
        action_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
        log = self.base / "actions" / f"{action_id}.log"
        action = Action(action_id, kind, runtime, title, log, list(hosts))
        action.log.touch()
        self.items[action_id] = action
        return action

    def _start(self, action: Action, work: Callable[[str, Path], None]) -> None:
        """Run ``work(inventory path, private directory)`` in a thread; its failure fails the action."""

        def run() -> None:
            try:
                inventory = self.inventory()
                if inventory is None:
                    raise RuntimeError("no inventory")
                private = self.base / "ansible" / action.id
                private.mkdir(parents=True, exist_ok=True)
                action.line("nnpm", "info", f"{action.title}: {', '.join(action.hosts)}")
                # an absolute path: ansible-runner takes a string that names no file from its private
                # directory (a path relative to the server's directory) for inventory *content*
                work(str(Path(inventory).resolve()), private)
            except Exception as exc:
                action.state, action.error = "failed", f"{type(exc).__name__}: {exc}"
            finally:
                if action.state == "running":
                    action.state = "done"
                action.finished_ns = time.time_ns()
                action.line(
                    "nnpm",
                    "info" if action.state == "done" else "error",
                    f"{action.title}: {action.state}" + (f" ({action.error})" if action.error else ""),
                )

        threading.Thread(target=run, name=f"nnpm-action-{action.id}", daemon=True).start()

    def check(self, runtime: Runtime, hosts: Sequence[str], scenario: Mapping[str, Any] | None) -> Action:
        """Readiness of ``hosts`` for ``runtime`` (for ``scenario``, e.g. ``{"model": {"name": ...}}``)."""
        from dit.runtime_ops import plays as ops

        action = self._new("check", runtime.name, f"readiness for the runtime {runtime.name}", hosts)

        def work(inventory: str, private: Path) -> None:
            try:
                verdicts = ops.check_hosts(
                    runtime, inventory, action.hosts, private, scenario, lambda e: event_line(action, e)
                )
            except Exception as exc:  # the check could not run: no node is ready, and the reason says why
                reason = f"the check did not run: {type(exc).__name__}: {exc}"
                verdicts = [NodeReadiness(h, "failed", reason, ()) for h in action.hosts]
                action.state, action.error = "failed", reason
            action.nodes = [v.to_json() for v in verdicts]
            for verdict in verdicts:
                text = verdict.state + (f" - {verdict.reason}" if verdict.reason else "")
                action.line(verdict.host, "info" if verdict.ok else "error", f"readiness: {text}")

        self._start(action, work)
        return action

    def maintenance(
        self, runtime: Runtime, spec: RuntimeAction, inputs: Mapping[str, Any], hosts: Sequence[str]
    ) -> Action:
        """Run ``spec`` (its inputs validated, defaults applied) on ``hosts``."""
        from dit.runtime_ops import plays as ops

        action = self._new("maintenance", runtime.name, f"{runtime.name}: {spec.title}", hosts)

        def work(inventory: str, private: Path) -> None:
            outcome = ops.act_on_hosts(
                runtime, spec, inputs, inventory, action.hosts, private, lambda e: event_line(action, e)
            )
            action.rc = outcome.rc
            if not outcome.ok or outcome.failures():
                action.state, action.error = "failed", f"ansible {outcome.status} (rc {outcome.rc})"

        self._start(action, work)
        return action

    def readiness(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The latest verdict per runtime and node (from the finished checks of this server)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for action in sorted(self.items.values(), key=lambda a: a.started_ns):
            if action.kind == "check" and action.finished:
                for verdict in action.nodes:
                    out.setdefault(action.runtime, {})[str(verdict["host"])] = verdict
        return out
