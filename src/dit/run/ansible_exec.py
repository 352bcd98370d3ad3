"""Run one stage playbook with ansible-runner and stream its per-host events.

A stage playbook is rendered from ``playbooks/<stage>.yml.j2`` into the run directory (kept as
provenance) with the driver's own Jinja delimiters (``[% %]``, ``[[ ]]``), so that Ansible's
``{{ }}`` expressions pass through untouched. Scenario values never go into the template text:
they travel as extra variables, and every string among them (keys too, at any depth) is written
``!unsafe`` into the extra-vars file, so that Ansible takes it as data and never renders it as a
template (:func:`write_extravars`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
import jinja2

from dit.ansible_data import unsafe_yaml
from dit.paths import content_root
from dit.run.rundir import write_text

RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
    "runner_item_on_failed": "failed",
}


@dataclass(frozen=True)
class HostEvent:
    """One task result on one host, as the console and run.log show it."""

    host: str
    stream: str  # "ansible" for task events
    status: str  # ok | changed | failed | unreachable | skipped | start
    task: str
    action: str
    result: Mapping[str, Any]

    def message(self) -> str:
        text = f"{self.status}: {self.task}"
        if self.status in ("failed", "unreachable"):
            msg = self.result.get("msg") or self.result.get("stderr") or self.result.get("reason") or ""
            if not str(msg).strip():
                shown = {k: v for k, v in self.result.items() if not k.startswith("_") and k != "invocation"}
                msg = json.dumps(shown, default=str)[:1000]
            text += f" - {str(msg).strip()}"
            stderr = self.result.get("stderr")
            if stderr and stderr != msg:
                text += f"\n{str(stderr).strip()}"
        return text


@dataclass
class StageOutcome:
    stage: str
    status: str  # successful | failed | canceled | timeout
    rc: int
    results: dict[str, list[HostEvent]] = field(default_factory=dict)  # per host, in order

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    def failures(self) -> list[HostEvent]:
        return [
            e for events in self.results.values() for e in events if e.status in ("failed", "unreachable")
        ]

    def result_of(self, host: str, action: str, task: str | None = None) -> Mapping[str, Any] | None:
        """The last result of module ``action`` on ``host`` (of the task named ``task``, if given)."""
        for event in reversed(self.results.get(host, [])):
            if event.action != action or event.status not in ("ok", "changed", "failed"):
                continue
            if task is None or event.task == task:
                return event.result
        return None

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for host, events in self.results.items():
            row = out.setdefault(host, {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0})
            for event in events:
                if event.status in row:
                    row[event.status] += 1
                    if event.status == "changed":
                        row["ok"] += 1
        return out


_TEMPLATE_ENV = jinja2.Environment(
    block_start_string="[%",
    block_end_string="%]",
    variable_start_string="[[",
    variable_end_string="]]",
    comment_start_string="[#",
    comment_end_string="#]",
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,  # noqa: S701 - renders YAML, not HTML; no scenario value is rendered into it
)


def render_playbook(stage: str, dest_dir: Path, context: Mapping[str, Any]) -> Path:
    source = content_root() / "playbooks" / f"{stage}.yml.j2"
    template = _TEMPLATE_ENV.from_string(source.read_text(encoding="utf-8"))
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / f"{stage}.yml"
    write_text(dest, template.render(**context))
    return dest


def write_extravars(private_dir: Path, extravars: Mapping[str, Any]) -> Path:
    """The extra vars of one playbook run, as ``env/extravars`` of ansible-runner's private directory.

    ansible-runner passes a dict of extra vars as JSON on the command line, and Ansible trusts those
    strings as templates: a ``{{ lookup('pipe', ...) }}`` in any value (a scenario's ``model.params``,
    an action's input, a path) would run on the controller. A file it finds there is passed as
    ``-e @file`` instead, and Ansible's YAML loader honours ``!unsafe`` on every string of it.
    """
    path = private_dir / "env" / "extravars"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, unsafe_yaml(dict(extravars)), mode=0o600)
    return path


def ansible_env() -> dict[str, str]:
    root = content_root()
    bindir = str(Path(sys.executable).parent)
    return {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_LIBRARY": str(root / "library"),
        "ANSIBLE_MODULE_UTILS": str(root / "module_utils"),
        "ANSIBLE_ACTION_PLUGINS": str(root / "action_plugins"),
        "ANSIBLE_FILTER_PLUGINS": str(root / "filter_plugins"),
        "ANSIBLE_DOC_FRAGMENT_PLUGINS": str(root / "doc_fragments"),
        "ANSIBLE_ROLES_PATH": str(root / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
    }


def _collector(
    outcome: StageOutcome, on_event: Callable[[HostEvent], None]
) -> Callable[[dict[str, Any]], bool]:
    """An ansible-runner event handler: every task result into ``outcome`` and to ``on_event``."""

    def handle(event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        if kind in RESULT_EVENTS and data.get("host"):
            res = data.get("res", {}) or {}
            status = RESULT_EVENTS[kind]
            if status == "ok" and res.get("changed"):
                status = "changed"
            host_event = HostEvent(
                host=str(data["host"]),
                stream="ansible",
                status=status,
                task=str(data.get("task", "")),
                action=str(data.get("task_action", "")),
                result=res,
            )
            outcome.results.setdefault(host_event.host, []).append(host_event)
            on_event(host_event)
        return True

    return handle


def run_playbook(
    name: str,
    playbook: Path,
    private_dir: Path,
    inventory: str | Sequence[str],
    limit: str,
    extravars: Mapping[str, Any],
    on_event: Callable[[HostEvent], None],
    tags: tuple[str, ...] = (),
    forks: int = 5,
) -> StageOutcome:
    """Run a playbook that is not a stage (a runtime's readiness check or maintenance action).

    ``inventory``: one source, or several whose host variables merge, the later ones winning (NNPM adds
    one making its local-mode nodes local, :mod:`dit.web.services.runtimes`)."""
    outcome = StageOutcome(name, "failed", -1)
    private_dir.mkdir(parents=True, exist_ok=True)
    write_extravars(private_dir, extravars)
    runner = ansible_runner.run(
        private_data_dir=str(private_dir),
        playbook=str(playbook),
        inventory=inventory if isinstance(inventory, str) else list(inventory),
        limit=limit,
        envvars=ansible_env(),
        event_handler=_collector(outcome, on_event),
        quiet=True,
        rotate_artifacts=3,
        forks=forks,
        tags=",".join(tags) if tags else None,
        timeout=None,
    )
    outcome.status = str(runner.status)
    outcome.rc = int(runner.rc if runner.rc is not None else -1)
    return outcome


def run_stage(
    stage: str,
    private_dir: Path,
    inventory: str,
    limit: str,
    extravars: Mapping[str, Any],
    on_event: Callable[[HostEvent], None],
    should_cancel: Callable[[], bool],
    forks: int,
    render_context: Mapping[str, Any] | None = None,
    check: bool = False,
) -> StageOutcome:
    """Render and run the playbook of ``stage``; every task result is passed to ``on_event``."""
    project = private_dir / "project"
    playbook = render_playbook(stage, project, render_context or {})
    outcome = StageOutcome(stage, "failed", -1)
    handle = _collector(outcome, on_event)
    cmdline = "--check --diff" if check else None
    write_extravars(private_dir, extravars)
    runner = ansible_runner.run(
        private_data_dir=str(private_dir),
        project_dir=str(project),
        playbook=playbook.name,
        inventory=inventory,
        limit=limit,
        envvars=ansible_env(),
        event_handler=handle,
        cancel_callback=should_cancel,
        quiet=True,
        rotate_artifacts=3,
        forks=forks,
        cmdline=cmdline,
        timeout=None,
    )
    outcome.status = str(runner.status)
    outcome.rc = int(runner.rc if runner.rc is not None else -1)
    return outcome
