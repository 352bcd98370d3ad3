"""Runtimes: each node's readiness for every installed runtime, and the runtimes' maintenance actions.

Both run through :mod:`dit.runtime_ops.plays` (the code ``dit runtimes check|act`` runs: ansible-runner
against the NNPM inventory, with the driver's own environment), in a thread. Every task result is
appended to the action's log in ``run.log``'s format (``<UTC time> <node> <stream> <text>``), which the
terminal streams live. A node's readiness is only ever the check's verdict
(:func:`dit.runtime_ops.plays.readiness_of`): ``ok`` when every check of the runtime ran on it and passed,
``failed`` or ``unreachable`` with the reason otherwise — including when the check could not run at all.

A local-mode node (:func:`local_mode`: a node of the map at a loopback address that says nothing of how
to reach it, or one with ``ansible_connection: local``) is checked, acted on and installed on this
machine, as ``dit runtimes check`` does without ``-i``, never over SSH: the map's probe finds such a node
at once, and an SSH connection to 127.0.0.1 port 22 would be refused.
"""

from __future__ import annotations

import ipaddress
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from dit.device.printable import printable, printable_lines
from dit.run.ansible_exec import HostEvent, StageOutcome
from dit.runtime_api.interface import CHECK_PREFIX, NodeReadiness, Runtime
from dit.runtime_api.interface import Action as RuntimeAction
from dit.web.services.nodes import Node

__all__ = ["Action", "Actions", "local_mode"]

# The inventory source, beside NNPM's, that makes the local-mode nodes local (in the action's directory).
LOCAL_NODES = "local-nodes.yml"


class _Unsafe(str):
    """A value written as ``!unsafe``: a path (e.g. $DIT_RUNTIMES_DIR) is data, never a template."""


class _UnsafeDumper(yaml.SafeDumper):
    pass


_UnsafeDumper.add_representer(_Unsafe, lambda dumper, value: dumper.represent_scalar("!unsafe", str(value)))


def local_mode(node: Node) -> bool:
    """Whether NNPM runs ``node`` on this machine: its inventory says ``ansible_connection: local``, or it
    is at a loopback address and says neither a connection nor a port (a node added on the map at
    127.0.0.1, which the map's probe shows green)."""
    connection = node.hostvars.get("ansible_connection")
    if connection is not None:
        return str(connection) == "local"
    if node.hostvars.get("ansible_port") is not None:
        return False  # an SSH server on a loopback port (an emulated node): reached over SSH
    try:
        return ipaddress.ip_address(node.address).is_loopback
    except ValueError:
        return node.address == "localhost"


def local_variables(node: Node) -> dict[str, str]:
    """The host variables that run a local-mode node here as ``dit run``'s local mode runs its nodes:
    the local connection, this interpreter and the local runtimes directory, each unless the inventory
    names its own."""
    from dit.run.localmode import local_runtimes_dir

    wanted = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "dit_python": sys.executable,
        "dit_runtimes_dir": local_runtimes_dir(),
    }
    return {key: _Unsafe(value) for key, value in wanted.items() if node.hostvars.get(key) is None}


@dataclass
class Action:
    """One Ansible run started from NNPM: a readiness check or a maintenance action."""

    id: str
    kind: str  # check | maintenance | install | dry-run
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
            for part in printable_lines(text):  # node output shown in NNPM's terminal: escapes escaped
                out.write(f"{stamp} {printable(node)} {printable(stream)} {part}\n")

    def finish(self) -> None:
        """Done unless it failed; the time, and a last line saying how it ended."""
        if self.state == "running":
            self.state = "done"
        self.finished_ns = time.time_ns()
        self.line(
            "nnpm",
            "info" if self.state == "done" else "error",
            f"{self.title}: {self.state}" + (f" ({self.error})" if self.error else ""),
        )

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

    def __init__(
        self,
        base: Path,
        inventory: Callable[[], Path | None],
        nodes: Callable[[], Sequence[Node]] = lambda: (),
    ) -> None:
        self.base = base
        self.inventory = inventory
        self.nodes = nodes
        self.items: dict[str, Action] = {}

    def new(self, kind: str, runtime: str, title: str, hosts: Sequence[str]) -> Action:
        """A new action, running, with an empty log (its terminal's file)."""
        (self.base / "actions").mkdir(parents=True, exist_ok=True)
        action_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
        log = self.base / "actions" / f"{action_id}.log"
        action = Action(action_id, kind, runtime, title, log, list(hosts))
        action.log.touch()
        self.items[action_id] = action
        return action

    def _sources(self, action: Action, inventory: str, private: Path) -> tuple[list[str], list[str]]:
        """The inventory sources of ``action`` (NNPM's, then one making its local-mode nodes local) and
        which of its hosts are local-mode nodes; each of those is told in the action's log."""
        by_name = {n.name: n for n in self.nodes()}
        local = [h for h in action.hosts if h in by_name and local_mode(by_name[h])]
        overlay = {h: variables for h in local if (variables := local_variables(by_name[h]))}
        for host in local:
            action.line(
                host, "info", f"local-mode node ({by_name[host].address}): run on this machine, not over SSH"
            )
        sources = [inventory]
        if overlay:
            path = private / LOCAL_NODES
            doc = yaml.dump({"all": {"hosts": overlay}}, Dumper=_UnsafeDumper)
            path.write_text(doc, encoding="utf-8")
            sources.append(str(path))
        return sources, local

    def _start(self, action: Action, work: Callable[[list[str], list[str], Path], None]) -> None:
        """Run ``work(inventory sources, local-mode hosts, private directory)`` in a thread; its failure
        fails the action."""

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
                sources, local = self._sources(action, str(Path(inventory).resolve()), private)
                work(sources, local, private)
            except Exception as exc:
                action.state, action.error = "failed", f"{type(exc).__name__}: {exc}"
            finally:
                action.finish()

        threading.Thread(target=run, name=f"nnpm-action-{action.id}", daemon=True).start()

    def check(self, runtime: Runtime, hosts: Sequence[str], scenario: Mapping[str, Any] | None) -> Action:
        """Readiness of ``hosts`` for ``runtime`` (for ``scenario``, e.g. ``{"model": {"name": ...}}``)."""
        from dit.runtime_ops import plays as ops

        action = self.new("check", runtime.name, f"readiness for the runtime {runtime.name}", hosts)

        def work(sources: list[str], _local: list[str], private: Path) -> None:
            try:
                verdicts = ops.check_hosts(
                    runtime, sources, action.hosts, private, scenario, lambda e: event_line(action, e)
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

        action = self.new("maintenance", runtime.name, f"{runtime.name}: {spec.title}", hosts)

        def work(sources: list[str], _local: list[str], private: Path) -> None:
            outcome = ops.act_on_hosts(
                runtime, spec, inputs, sources, action.hosts, private, lambda e: event_line(action, e)
            )
            action.rc = outcome.rc
            if not outcome.ok or outcome.failures():
                action.state, action.error = "failed", f"ansible {outcome.status} (rc {outcome.rc})"

        self._start(action, work)
        return action

    def install(
        self, runtime: Runtime, hosts: Sequence[str], mirror_dir: Path, sources_file: Path | None = None
    ) -> Action:
        """Install or update ``runtime`` at its declared pin on ``hosts`` (what ``dit runtimes install``
        does: roles/runtime_env from the mirror, hashes required), then check their readiness for it.
        The local-mode nodes share this machine's runtimes directory: one install serves them all."""
        from dit.runtime_ops import plays as ops

        action = self.new("install", runtime.name, f"install or update the runtime {runtime.name}", hosts)

        def work(sources: list[str], local: list[str], private: Path) -> None:
            remote = [h for h in action.hosts if h not in local]
            on_event: Callable[[HostEvent], None] = lambda e: event_line(action, e)  # noqa: E731
            outcomes: list[StageOutcome] = []
            if local:
                action.line("nnpm", "info", f"one install on this machine for {', '.join(local)}")
                outcomes.append(
                    ops.install_on_hosts(
                        runtime.name, sources, local[0], True, private / "install-local", mirror_dir,
                        None, sources_file, on_event,
                    )
                )  # fmt: skip
            if remote:
                outcomes.append(
                    ops.install_on_hosts(
                        runtime.name, sources, ":".join(remote), False, private / "install", mirror_dir,
                        None, sources_file, on_event, forks=max(5, len(remote)),
                    )
                )  # fmt: skip
            failed = [o for o in outcomes if not o.ok or o.failures()]
            if failed:
                action.state = "failed"
                action.error = "; ".join(f"ansible {o.status} (rc {o.rc})" for o in failed)
                action.rc = failed[0].rc
            else:
                action.rc = 0
            action.line("nnpm", "info", f"readiness for the runtime {runtime.name} after the install")
            try:
                verdicts = ops.check_hosts(runtime, sources, action.hosts, private / "check", None, on_event)
            except Exception as exc:
                reason = f"the check did not run: {type(exc).__name__}: {exc}"
                verdicts = [NodeReadiness(h, "failed", reason, ()) for h in action.hosts]
            action.nodes = [v.to_json() for v in verdicts]
            for verdict in verdicts:
                text = verdict.state + (f" - {verdict.reason}" if verdict.reason else "")
                action.line(verdict.host, "info" if verdict.ok else "error", f"readiness: {text}")

        self._start(action, work)
        return action

    def readiness(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The latest verdict per runtime and node (from the finished checks of this server, and the
        checks that follow an install)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for action in sorted(self.items.values(), key=lambda a: a.started_ns):
            if action.kind in ("check", "install") and action.finished:
                for verdict in action.nodes:
                    out.setdefault(action.runtime, {})[str(verdict["host"])] = verdict
        return out
