"""Runtimes: each device's readiness for an inference runtime, and maintenance actions.

Both run Ansible against the NNPM inventory through ansible-runner (the driver's own environment,
:func:`dit.ansible_exec.ansible_env`), in a thread; every task event is appended to the action's log
in ``run.log``'s format (``<UTC time> <node> <stream> <text>``), which the terminal streams.

- **Readiness of the built-in runtime** (its plays: :func:`dit.runtimes.layers.check_playbook`): the node's
  Python (``dit_python``, else ``/usr/bin/python3``) is 3.11 or newer; ``dit-device.pyz`` (built
  here, copied to a temporary directory on the node and removed after) runs; the framework of the
  chosen model (from the model catalogue: none, tensorflow or torch) imports, with its version.
- **Maintenance**: ``playbooks/provision.yml`` with a tag (``runtime``: install the runtime from the
  mirror; ``weights``: distribute the catalogue's checkpoints with checksums), limited to the chosen
  nodes.
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

import yaml

from dit.paths import content_root
from dit.runtimes.layers import CHECKS, check_playbook, framework_of

__all__ = ["ACTIONS", "CHECKS", "Action", "Actions", "MaintenanceAction"]


@dataclass(frozen=True)
class MaintenanceAction:
    id: str
    title: str
    playbook: str  # relative to the content root
    tags: tuple[str, ...]
    description: str


ACTIONS: Mapping[str, MaintenanceAction] = {
    "install-runtime": MaintenanceAction(
        "install-runtime",
        "Install the runtime from the mirror",
        "playbooks/provision.yml",
        ("runtime",),
        "provision.yml --tags runtime: the runtime venv from the mirror (no index, hashes required)",
    ),
    "distribute-weights": MaintenanceAction(
        "distribute-weights",
        "Distribute the checkpoints",
        "playbooks/provision.yml",
        ("weights",),
        "provision.yml --tags weights: the catalogue's model weights, verified by checksum",
    ),
}


@dataclass
class Action:
    """One Ansible run started from NNPM: a readiness check or a maintenance action."""

    id: str
    kind: str  # check | maintenance
    title: str
    log: Path
    hosts: list[str]
    state: str = "running"  # running | done | failed
    rc: int | None = None
    checks: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # host -> check -> result
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
            "title": self.title,
            "hosts": self.hosts,
            "state": self.state,
            "rc": self.rc,
            "checks": self.checks,
            "started_ns": self.started_ns,
            "finished_ns": self.finished_ns,
            "error": self.error,
        }


def _event_line(action: Action, event: Mapping[str, Any]) -> None:
    kind = str(event.get("event", ""))
    data = event.get("event_data", {}) or {}
    host = str(data.get("host") or "")
    task = str(data.get("task") or "")
    res = data.get("res") or {}
    status = {
        "runner_on_ok": "ok",
        "runner_on_failed": "failed",
        "runner_on_unreachable": "unreachable",
        "runner_on_skipped": "skipped",
    }.get(kind)
    if kind == "playbook_on_task_start":
        action.line("ansible", "ansible", f"TASK {task}")
        return
    if status is None or not host:
        return
    if status == "ok" and res.get("changed"):
        status = "changed"
    if status == "failed" and data.get("ignore_errors"):
        status = "failed (ignored)"
    text = f"{status}: {task}"
    message = res.get("msg") or ""
    stdout = str(res.get("stdout") or "").strip()
    stderr = str(res.get("stderr") or "").strip()
    if message and status != "ok":
        text += f" - {message}"
    action.line(host, "ansible", text)
    if stdout:
        action.line(host, "stdout", stdout[:4000])
    if stderr:
        action.line(host, "stderr", stderr[:4000])
    if task.startswith("check: "):
        check = task.removeprefix("check: ")
        if status == "skipped" and check in action.checks.get(host, {}):
            return  # decided before the playbook ran (a model that needs no framework)
        ok = status in ("ok", "changed")
        detail = stdout.splitlines()[-1] if ok and stdout else (stderr or str(message) or status)
        if check == "dit-device.pyz" and ok:
            detail = "runs (usage printed)"
        action.checks.setdefault(host, {})[check] = {
            "ok": ok,
            "skipped": status == "skipped",
            "detail": str(detail)[:500],
        }


class Actions:
    """The actions of this server (kept in memory; their logs are files under ``<base>/actions``)."""

    def __init__(self, base: Path, inventory: Callable[[], Path | None]) -> None:
        self.base = base
        self.inventory = inventory
        self.items: dict[str, Action] = {}

    def _new(self, kind: str, title: str, hosts: Sequence[str]) -> Action:
        (self.base / "actions").mkdir(parents=True, exist_ok=True)
        action_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
        action = Action(action_id, kind, title, self.base / "actions" / f"{action_id}.log", list(hosts))
        action.log.touch()
        self.items[action_id] = action
        return action

    def _run(
        self,
        action: Action,
        playbook: Path,
        extravars: dict[str, Any],
        tags: Sequence[str] = (),
        prepare: Callable[[], None] | None = None,
    ) -> None:
        import ansible_runner

        from dit.ansible_exec import ansible_env

        inventory = self.inventory()
        if inventory is None:
            action.state, action.error = "failed", "no inventory"
            return

        def handler(event: Mapping[str, Any]) -> bool:
            _event_line(action, event)
            return True

        def work() -> None:
            try:
                if prepare is not None:
                    prepare()
                private = self.base / "ansible" / action.id
                private.mkdir(parents=True, exist_ok=True)
                action.line("nnpm", "info", f"{action.title}: {', '.join(action.hosts)}")
                runner = ansible_runner.run(
                    private_data_dir=str(private),
                    playbook=str(playbook),
                    # a path: ansible-runner takes a string that names no file, such as a path relative
                    # to the server's directory seen from its private_data_dir, as inventory *content*
                    inventory=str(Path(inventory).resolve()),
                    limit=":".join(action.hosts),
                    extravars=extravars,
                    envvars=ansible_env(),
                    event_handler=handler,
                    quiet=True,
                    tags=",".join(tags) if tags else None,
                    rotate_artifacts=5,
                )
                action.rc = int(runner.rc if runner.rc is not None else -1)
                action.state = "done" if runner.status == "successful" else "failed"
                if action.state == "failed":
                    action.error = f"ansible {runner.status} (rc {action.rc})"
            except Exception as exc:
                action.state, action.error = "failed", str(exc)
            finally:
                action.finished_ns = time.time_ns()
                action.line(
                    "nnpm",
                    "info",
                    f"{action.title}: {action.state}" + (f" ({action.error})" if action.error else ""),
                )

        threading.Thread(target=work, name=f"nnpm-action-{action.id}", daemon=True).start()

    def check(self, hosts: Sequence[str], model: str) -> Action:
        framework = framework_of(model)
        action = self._new("check", f"readiness of the built-in runtime for {model} ({framework})", hosts)
        playbook = self.base / "ansible" / "runtime_check.yml"
        pyz = self.base / "runtime" / "dit-device.pyz"

        def prepare() -> None:
            from dit.device.build import build_zipapp

            playbook.parent.mkdir(parents=True, exist_ok=True)
            playbook.write_text(yaml.safe_dump(check_playbook(), sort_keys=False), encoding="utf-8")
            pyz.parent.mkdir(parents=True, exist_ok=True)
            build_zipapp(pyz)
            for host in hosts:
                if framework == "none":
                    action.checks.setdefault(host, {})["framework"] = {
                        "ok": True,
                        "skipped": False,
                        "detail": f"{model} needs no framework (stdlib only)",
                    }

        self._run(
            action, playbook, {"dit_check_pyz": str(pyz), "dit_check_framework": framework}, prepare=prepare
        )
        return action

    def maintenance(self, action_id: str, hosts: Sequence[str]) -> Action:
        spec = ACTIONS[action_id]
        action = self._new("maintenance", spec.title, hosts)
        playbook = content_root() / spec.playbook
        if not playbook.is_file():
            action.state, action.error = "failed", f"{spec.playbook} does not exist"
            action.finished_ns = time.time_ns()
            action.line("nnpm", "error", action.error)
            return action
        self._run(action, playbook, {}, tags=spec.tags)
        return action
