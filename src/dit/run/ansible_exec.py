"""Run stage playbooks with ansible-runner and stream their per-host events.

A stage playbook is rendered from ``playbooks/<stage>.yml.j2`` into the run directory (kept as
provenance) with the driver's own Jinja delimiters (``[% %]``, ``[[ ]]``), so that Ansible's
``{{ }}`` expressions pass through untouched. Scenario values never go into the template text:
they travel as extra variables, and every string among them (keys too, at any depth) is written
``!unsafe`` into the extra-vars file, so that Ansible takes it as data and never renders it as a
template (:func:`write_extravars`).

Consecutive stages run as one ``ansible-playbook`` start (:func:`run_chain`): a start costs about
1.3 CPU-s and a second or more of wall time before its first task, and a run has up to five stages.
Between two stages a ``dit_handoff`` play waits for the driver, which reads the stage that ended
and writes the next one's variables (:mod:`dit.ansible_plugins.handoff`).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
import jinja2
import yaml

from dit.ansible_data import unsafe_yaml
from dit.ansible_plugins.handoff import STOP_KEY
from dit.paths import content_root
from dit.run.node_modules import built_library
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
    # What ansible-runner raised in the session's thread (a full disk under the artifacts): the driver's
    # thread raises it again, as a stage run on its own would have, so the run says why in words.
    error: Exception | None = None

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
    """The environment of every Ansible run: dit's content, its modules as a node runs them
    (:mod:`dit.run.node_modules`)."""
    root = content_root()
    bindir = str(Path(sys.executable).parent)
    return {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_LIBRARY": str(built_library(root)),
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


def _host_event(event: Mapping[str, Any]) -> HostEvent | None:
    """The task result an ansible-runner event carries, or None for any other event."""
    kind = event.get("event", "")
    data = event.get("event_data", {})
    if kind not in RESULT_EVENTS or not data.get("host"):
        return None
    res = data.get("res", {}) or {}
    status = RESULT_EVENTS[kind]
    if status == "ok" and res.get("changed"):
        status = "changed"
    return HostEvent(
        host=str(data["host"]),
        stream="ansible",
        status=status,
        task=str(data.get("task", "")),
        action=str(data.get("task_action", "")),
        result=res,
    )


def _collector(
    outcome: StageOutcome, on_event: Callable[[HostEvent], None]
) -> Callable[[dict[str, Any]], bool]:
    """An ansible-runner event handler: every task result into ``outcome`` and to ``on_event``."""

    def handle(event: dict[str, Any]) -> bool:
        host_event = _host_event(event)
        if host_event is not None:
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
        fact_cache_type=FACT_CACHE,
        forks=forks,
        tags=",".join(tags) if tags else None,
        timeout=None,
    )
    outcome.status = str(runner.status)
    outcome.rc = int(runner.rc if runner.rc is not None else -1)
    return outcome


@dataclass(frozen=True)
class ChainedStage:
    """A stage a :class:`StageSession` expects, with the context its playbook is rendered with."""

    stage: str
    render_context: Mapping[str, Any] = field(default_factory=dict)


#: Facts (and the variables a hand-over sets as facts) stay in the playbook's memory. ansible-runner's
#: default, a jsonfile cache in the artifacts, is read back and decoded with every variable's origin
#: tags at every task of every host: half the playbook process's CPU in a quickstart run (py-spy), and
#: a task's dispatch per host grew from 2 ms to 100-200 ms along one run's stages (issue 48).
FACT_CACHE = "memory"

HANDOFF_TASK = "Hand over to the controller"  # + ": <the next stage>"


def chain_playbook(stages: Sequence[str]) -> str:
    """The playbook that imports each stage's playbook (``ansible/<stage>/project/<stage>.yml``,
    relative: the runs directory is the user's text, never a template) with a hand-over between two."""
    plays: list[dict[str, Any]] = []
    for index, stage in enumerate(stages):
        if index:
            task = {
                "name": f"{HANDOFF_TASK}: {stage}",
                "dit_handoff": {
                    "path": "{{ dit_handoff_files['%s'] }}" % stage,  # noqa: UP031 - a stage name, not user text
                    "driver_pid": "{{ dit_driver_pid }}",
                },
                "run_once": True,
                "any_errors_fatal": True,
            }
            plays.append(
                {"name": f"Hand over to {stage}", "hosts": "all", "gather_facts": False, "tasks": [task]}
            )
        own = f"{stage}.yml" if index == 0 else f"../../{stage}/project/{stage}.yml"
        plays.append({"ansible.builtin.import_playbook": own})
    head = (
        f"# {', '.join(stages)} in one ansible-playbook start; between two stages the driver reads the one\n"
        "# that ended and hands the next its variables (dit_handoff, dit.run.ansible_exec.StageSession).\n"
    )
    return "---\n" + head + yaml.safe_dump(plays, sort_keys=False, width=120)


class StageSession:
    """The node stages of one run in one ``ansible-playbook`` start, each run when the driver asks for it.

    The playbook (:func:`chain_playbook`) holds the stages of ``plan``, rendered before it starts; it
    runs in a thread, and stops at each hand-over until :meth:`run` gives the next stage its
    variables. A stage asked for out of the plan's order, with another render context, or with a
    variable the playbook's extra vars already hold with another value (host facts rank below extra
    vars) ends the session (:meth:`close`) and runs on its own, as :func:`run_stage` does.
    """

    def __init__(
        self,
        plan: Sequence[ChainedStage],
        ansible_dir: Path,
        inventory: str,
        limit: str,
        on_event: Callable[[HostEvent], None],
        should_cancel: Callable[[], bool],
        forks: int,
        check: bool = False,
    ) -> None:
        self.plan = list(plan)
        self.ansible_dir = ansible_dir
        self.inventory, self.limit, self.forks, self.check = inventory, limit, forks, check
        self.on_event = on_event
        self.should_cancel = should_cancel
        self.files = self._handoff_files()
        self.extravars: dict[str, Any] = {}
        self.next = 0  # the index in plan of the stage the playbook runs next (or waits for)
        self.thread: threading.Thread | None = None
        self.ended: queue.Queue[StageOutcome] = queue.Queue()
        self.closed = False
        self.cancelled = False  # set when the hand-over cannot be told to stop: ansible-runner kills it
        self.starts = 0  # ansible-playbook starts, this session's and the stages run on their own

    def run(
        self, stage: str, extravars: Mapping[str, Any], render_context: Mapping[str, Any]
    ) -> StageOutcome:
        """Run ``stage`` (in the session when it is the one the playbook expects) and return its outcome."""
        if self.thread is None and not self.closed:
            self._begin_at(stage, render_context)
        expected = self.plan[self.next] if not self.closed and self.next < len(self.plan) else None
        if (
            expected is not None
            and expected.stage == stage
            and dict(expected.render_context) == dict(render_context)
        ):
            if self.thread is None:
                self._start(extravars)
                return self._wait()
            outcome = self.hand_over(stage, extravars)
            if outcome is not None:
                return outcome
        self.close()
        self.starts += 1
        return run_stage(
            stage,
            self.ansible_dir / stage,
            self.inventory,
            self.limit,
            extravars,
            self.on_event,
            self.should_cancel,
            self.forks,
            render_context=render_context,
            check=self.check,
        )

    def hand_over(
        self, stage: str, extravars: Mapping[str, Any], on_event: Callable[[HostEvent], None] | None = None
    ) -> StageOutcome | None:
        """Run ``stage`` in the session's playbook, which waits for it at its hand-over, and return its
        outcome; None, with nothing run, when the playbook does not wait for it there (not started, ended,
        closed, another stage next) or a variable its extra vars hold would take another value.
        ``on_event``: the handler of this stage's events and of those after it (else the session's)."""
        thread = self.thread
        if thread is None or self.closed or not thread.is_alive() or self.next >= len(self.plan):
            return None
        if self.plan[self.next].stage != stage:
            return None
        given = {k: v for k, v in extravars.items() if k not in self.extravars or self.extravars[k] != v}
        if any(k in self.extravars for k in given):
            return None
        if on_event is not None:
            self.on_event = on_event  # read per event by the playbook's thread: set before the hand-over
        self.next += 1
        write_text(self.files[stage], unsafe_yaml(given), mode=0o600)
        return self._wait()

    def _begin_at(self, stage: str, render_context: Mapping[str, Any]) -> None:
        """Drop the planned stages before ``stage``, the first asked for, and render it with the context
        asked for (nothing is rendered yet): a sweep's variant that reuses the sweep's preflight starts
        at apply, whose conditions are only those not in force alike, and its later stages still share
        one start."""
        stages = [c.stage for c in self.plan]
        if stage in stages:
            self.plan = [ChainedStage(stage, render_context), *self.plan[stages.index(stage) + 1 :]]
            self.files = self._handoff_files()

    def _handoff_files(self) -> dict[str, Path]:
        """Where the driver writes each stage's variables, read at the hand-over before it."""
        return {c.stage: self.ansible_dir / c.stage / "env" / "extravars" for c in self.plan[1:]}

    def close(self) -> None:
        """End the session's playbook: at a hand-over it is told to stop; then it is waited for."""
        if self.closed:
            return
        self.closed = True
        if self.thread is None:
            return
        if self.thread.is_alive() and self.next < len(self.plan):
            stage = self.plan[self.next].stage
            try:
                stop = {STOP_KEY: f"the driver asked for no {stage} stage"}
                write_text(self.files[stage], unsafe_yaml(stop), mode=0o600)
            except OSError:  # a full or read-only run directory: the playbook is killed instead
                self.cancelled = True
        self.thread.join()

    def _start(self, extravars: Mapping[str, Any]) -> None:
        first = self.plan[0].stage
        private = self.ansible_dir / first
        for index, chained in enumerate(self.plan):
            render_playbook(
                chained.stage, self.ansible_dir / chained.stage / "project", chained.render_context
            )
            if index:
                self.files[chained.stage].parent.mkdir(parents=True, exist_ok=True)
                self.files[chained.stage].unlink(missing_ok=True)  # the hand-over waits for it to appear
        self.extravars = dict(extravars)
        playbook = f"{first}.yml"
        if len(self.plan) > 1:
            playbook = "chain.yml"
            write_text(private / "project" / playbook, chain_playbook([c.stage for c in self.plan]))
            files = {stage: str(path) for stage, path in self.files.items()}
            self.extravars |= {"dit_handoff_files": files, "dit_driver_pid": os.getpid()}
        write_extravars(private, self.extravars)
        self.next = 1
        self.starts += 1
        self.thread = threading.Thread(
            target=self._play, args=(private, playbook), name="dit-stages", daemon=True
        )
        self.thread.start()

    def _play(self, private: Path, playbook: str) -> None:
        current = StageOutcome(self.plan[0].stage, "running", -1)

        def handle(event: dict[str, Any]) -> bool:
            nonlocal current
            task = str(event.get("event_data", {}).get("task", ""))
            if task.startswith(HANDOFF_TASK):  # the stage before it has ended on every host
                if event.get("event") == "playbook_on_task_start":
                    current.status, current.rc = "successful", 0
                    self.ended.put(current)
                    current = StageOutcome(task.removeprefix(f"{HANDOFF_TASK}: "), "running", -1)
                return True
            host_event = _host_event(event)
            if host_event is not None:
                current.results.setdefault(host_event.host, []).append(host_event)
                self.on_event(host_event)
            return True

        try:
            runner = ansible_runner.run(
                private_data_dir=str(private),
                project_dir=str(private / "project"),
                playbook=playbook,
                inventory=self.inventory,
                limit=self.limit,
                envvars=ansible_env(),
                event_handler=handle,
                cancel_callback=lambda: self.cancelled or self.should_cancel(),
                quiet=True,
                rotate_artifacts=3,
                fact_cache_type=FACT_CACHE,
                forks=self.forks,
                cmdline="--check --diff" if self.check else None,
                timeout=None,
            )
            current.status = str(runner.status)
            current.rc = int(runner.rc if runner.rc is not None else -1)
        except Exception as exc:  # raised again in the driver's thread (_wait)
            current.status, current.rc, current.error = f"failed ({type(exc).__name__}: {exc})", -1, exc
        finally:
            self.closed = True  # nothing more can be handed over
            self.ended.put(current)

    def _wait(self) -> StageOutcome:
        while True:
            try:
                outcome = self.ended.get(timeout=0.2)  # a timeout: signal handlers run in this thread
            except queue.Empty:
                continue
            if outcome.error is not None:
                raise outcome.error
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
        fact_cache_type=FACT_CACHE,
        forks=forks,
        cmdline=cmdline,
        timeout=None,
    )
    outcome.status = str(runner.status)
    outcome.rc = int(runner.rc if runner.rc is not None else -1)
    return outcome
