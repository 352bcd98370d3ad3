"""Dry runs (``dit run --check``): what preflight and apply would change on every node, changing nothing.

The driver runs the preflight and apply playbooks in Ansible check mode with ``--diff``
(:meth:`dit.run.driver.Driver.dry_run`): the modules read each node's current state and report what
they would do, but write nothing, and the journal-before-change action plugins journal nothing in
check mode (a plan is the answer). Profile, collect, aggregate and optimise do not run, and since
nothing was started or changed there is no teardown.

The run directory (rendered playbooks, the local-mode node directories, ``run.log``) lives in a
temporary directory that is removed afterwards: a dry run leaves nothing under ``runs/`` that could
be mistaken for a run. Pass ``work_dir`` to keep it (tests inspect it).

Afterwards the dry run checks its own promise and fails if it was broken: the journal must be
empty, no process may carry the run's tag, and in local mode the node directories (the fake sysfs
trees) must be byte for byte what they were before apply.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from dit.run.ansible_exec import HostEvent
from dit.run.driver import Driver, RunOptions
from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.scenario import Scenario

STAGES = ("preflight", "apply")
KINDS = {
    "dit_node": "directory",
    "dit_sysfs": "sysfs",
    "dit_tc": "tc",
    "dit_nfqueue": "iptables",
    "dit_cgroup": "cgroup",
    "dit_proc": "process",
}


@dataclass(frozen=True)
class Change:
    """One task that would change one node."""

    stage: str
    task: str
    kind: str  # directory | sysfs | tc | iptables | cgroup | process | other
    details: tuple[str, ...]  # what exactly: "path: before -> after", tc lines, the argv

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "task": self.task, "kind": self.kind, "details": list(self.details)}


@dataclass
class DryRun:
    """The outcome of one dry run: per node, the changes apply would make."""

    label: str
    mode: str  # local | inventory
    hosts: list[str]
    run_id: str | None = None  # the tag the run's processes would carry
    node_dirs: dict[str, str] = field(default_factory=dict)  # per host: the run directory it would get
    changes: dict[str, list[Change]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)  # per host: module notes, e.g. assumptions
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "mode": self.mode,
            "ok": self.ok,
            "error": self.error,
            "run_id": self.run_id,
            "nodes": [
                {
                    "host": host,
                    "node_dir": self.node_dirs.get(host),
                    "changes": [c.to_json() for c in self.changes.get(host, [])],
                    "notes": self.notes.get(host, []),
                }
                for host in self.hosts
            ],
        }

    def render(self) -> str:
        """The report as plain text, node by node."""
        lines = [f"dry run of {self.label} ({self.mode} mode): nothing was changed"]
        for host in self.hosts:
            changes = self.changes.get(host, [])
            lines.append("")
            lines.append(
                f"{host}: {len(changes)} change(s) would be made" if changes else f"{host}: no change"
            )
            node_dir = self.node_dirs.get(host)
            if node_dir:
                lines.append(f"  ($RUN = {node_dir})")
            for change in changes:
                lines.append(f"  [{change.kind}] {change.task}")
                for detail in change.details:
                    lines.append(f"      {detail.replace(node_dir, '$RUN') if node_dir else detail}")
            lines.extend(f"  note: {note}" for note in self.notes.get(host, []))
        if self.error:
            lines += ["", f"dry run failed: {self.error}"]
        return "\n".join(lines) + "\n"


def _module(action: str) -> str:
    return action.rsplit(".", 1)[-1]


def _text_diff(before: str, after: str) -> list[str]:
    old, new = before.splitlines(), after.splitlines()
    out = []
    for line in difflib.ndiff(old, new):
        if line.startswith(("- ", "+ ")):
            out.append(line)
    return out


def _mapping_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    keys = [*before, *(k for k in after if k not in before)]
    return [
        f"{k}: {before.get(k, '(absent)')} -> {after.get(k)}" for k in keys if before.get(k) != after.get(k)
    ]


def _diff_lines(diff: Any) -> list[str]:
    """Readable lines of an Ansible ``diff`` (one or a list of {before, after})."""
    out: list[str] = []
    for item in diff if isinstance(diff, list) else [diff]:
        if not isinstance(item, Mapping):
            continue
        before, after = item.get("before"), item.get("after")
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            out += _mapping_diff(before, after)
        elif isinstance(before, str) or isinstance(after, str):
            out += _text_diff(str(before or ""), str(after or ""))
        elif "prepared" in item:
            out += str(item["prepared"]).splitlines()
    return out


def _details(kind: str, module: str, res: Mapping[str, Any]) -> list[str]:
    """What one module result (in check mode) says it would do, as readable lines."""
    raw_diff = res.get("diff")
    diff: Mapping[str, Any] = raw_diff if isinstance(raw_diff, Mapping) else {}
    args = (res.get("invocation") or {}).get("module_args") or {}
    if kind == "sysfs":
        old = dict(line.split(": ", 1) for line in str(diff.get("before", "")).splitlines() if ": " in line)
        pairs = (line.split(": ", 1) for line in str(diff.get("after", "")).splitlines() if ": " in line)
        return [f"{path}: {old.get(path, '?')} -> {value}" for path, value in pairs]
    if kind == "tc":
        details = [" ".join(str(a) for a in argv) for argv in res.get("commands") or []]
        if args.get("dry_run"):
            details.append(
                "(these tc commands would be recorded in the node's tc log, not run: local mode or dit_tc_dry_run)"
            )
        return details + [f"tree {line}" for line in _diff_lines(res.get("diff"))]
    if kind == "iptables":
        return [" ".join(str(a) for a in argv) for argv in res.get("commands") or []]
    if kind == "process":
        argv = " ".join(str(a) for a in args.get("argv") or [])
        details = [f"start '{args.get('tag', module)}': {argv}".rstrip()]
        if args.get("cgroup"):
            cgroups = args["cgroup"]
            details.append(f"in cgroup {', '.join(cgroups) if isinstance(cgroups, list) else cgroups}")
        if args.get("cpus"):
            details.append(f"on CPUs {', '.join(str(c) for c in args['cpus'])}")
        return details
    if kind == "directory":
        after = diff.get("after")
        return [f"create {res.get('path') or (after.get('path') if isinstance(after, Mapping) else '?')}"]
    return _diff_lines(res.get("diff"))  # cgroup and any other module that returns a diff


def change_of(stage: str, event: HostEvent) -> Change:
    """What ``event`` (a task result reported as ``changed`` in check mode) would do."""
    module = _module(event.action)
    kind = KINDS.get(module, "other")
    res = event.result
    # a looped task reports once, with the items' results inside
    items = [r for r in res.get("results") or [] if isinstance(r, Mapping) and r.get("changed")] or [res]
    details = [line for item in items for line in _details(kind, module, item)]
    return Change(stage, event.task, kind, tuple(details))


def report(driver: Driver, error: str | None) -> DryRun:
    """The per-node changes of ``driver``'s check-mode stages."""
    hosts = list(driver.inventory.hosts) if driver.inventory is not None else []
    result = DryRun(driver.scenario.label, "local" if driver.local else "inventory", hosts, error=error)
    run = getattr(driver, "run", None)
    result.run_id = run.run_id if run is not None else None
    contexts = getattr(driver, "contexts", {})
    result.node_dirs = {host: ctx.node_root for host, ctx in contexts.items()}
    for stage in STAGES:
        outcome = driver.outcomes.get(stage)
        if outcome is None:
            continue
        for host, events in outcome.results.items():
            for event in events:
                if event.status == "changed":
                    result.changes.setdefault(host, []).append(change_of(stage, event))
                note = event.result.get("note")
                if note:
                    result.notes.setdefault(host, []).append(f"{event.task}: {note}")
    return result


def tree_digest(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with its content's SHA-256 (directories: "dir")."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + str(path.readlink())
        elif path.is_dir():
            out[rel] = "dir"
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@contextmanager
def _work_dir(work_dir: Path | None) -> Iterator[Path]:
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        yield work_dir
        return
    tmp = Path(tempfile.mkdtemp(prefix="dit-dry-run-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Snapshotting(Driver):
    """The driver, with the local nodes' directories snapshotted between preflight and apply."""

    before: dict[str, str] | None = None

    def _apply(self) -> None:
        if self.local:
            self.before = tree_digest(self.run.path / "nodes")
        super()._apply()


def dry_run(scenario: Scenario, options: RunOptions, work_dir: Path | None = None) -> DryRun:
    """Dry-run ``scenario`` (one sweep variant): preflight and apply in check mode, then verify."""
    driver = _Snapshotting(scenario, dataclasses.replace(options, check=True))
    with _work_dir(work_dir) as where:
        error = driver.dry_run(where)
        problems: list[str] = []
        if getattr(driver, "run", None) is not None:
            records = Journal(driver.run.journal).pending()
            if records:
                problems.append(f"the dry run journaled {len(records)} change(s)")
            survivors = run_processes(driver.run.run_id)
            if survivors:
                problems.append(
                    "processes of the dry run are running: " + ", ".join(str(p.pid) for p in survivors)
                )
            if driver.before is not None and tree_digest(driver.run.path / "nodes") != driver.before:
                problems.append("the dry run changed the local nodes' directories")
        if problems:
            error = "; ".join(filter(None, [error, *problems]))
        return report(driver, error)


def print_dry_runs(scenarios: list[Scenario], options: RunOptions, as_json: bool, console: Console) -> int:
    """``dit run --check``: dry-run every variant, print the reports; the exit status (1: a dry run failed)."""
    results = [dry_run(scenario, options) for scenario in scenarios]
    if as_json:
        console.print_json(json.dumps({"dry_runs": [r.to_json() for r in results]}))
    else:
        for result in results:
            console.print(result.render(), markup=False, highlight=False, soft_wrap=True, end="")
    return 0 if all(r.ok for r in results) else 1
