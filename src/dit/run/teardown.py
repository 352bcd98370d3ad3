"""Teardown: the run's journal replayed backwards on every node, and no process of the run left.

It runs whatever happened before it (a failed stage, Ctrl-C, SIGTERM, ``dit stop``) and again from
``dit cleanup``; nothing in it depends on writing the run directory (a full disk still gets its undo).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from dit.device.tags import HOST_ENV, TAG_ENV
from dit.run.ansible_exec import HostEvent, StageOutcome, StageSession, run_stage
from dit.run.console import Reporter
from dit.run.inventory import RunInventory
from dit.run.journal import (
    Journal,
    JournalError,
    collected_name,
    dropped_results,
    fetched_results,
    undo_scopes,
)
from dit.run.procs import run_processes
from dit.run.rundir import RunDir, os_reason

FETCH_ACTIONS = ("ansible.builtin.fetch", "fetch")


@dataclass
class _TeardownSeen:
    """What teardown's playbook reported: ``dit_restore``'s results and the fetches that failed."""

    undone: list[str] = field(default_factory=list)
    removed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    restore: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # each host's last result
    fetch_errors: dict[str, list[str]] = field(default_factory=dict)

    def add(self, event: HostEvent) -> None:
        if event.action == "dit_restore":
            self.undone.extend(event.result.get("undone", []))
            self.removed.setdefault(event.host, []).extend(event.result.get("removed_results", []))
            self.refused.extend(
                f"{event.host}: refused {r.get('op')} record {r.get('id')} (from {r.get('source')}): "
                f"{r.get('reason')}"
                for r in event.result.get("refused", [])
            )
            self.restore[event.host] = event.result
        elif self.failed_fetch(event) and "item" in event.result:
            item = event.result.get("item") or {}
            message = " ".join(str(event.result.get("msg") or "failed").split())
            # "Failed to transfer file to '<dest>': [Errno 28] No space left on device: <src> -> <dest>"
            found = re.search(r"\[Errno \d+\] ([^:]+)", message)
            reason = found.group(1) if found else message[:200]
            self.fetch_errors.setdefault(event.host, []).append(f"{item.get('path')}: {reason}")

    @staticmethod
    def failed_fetch(event: HostEvent) -> bool:
        return event.action in FETCH_ACTIONS and event.status == "failed"


@dataclass(frozen=True)
class NodeScope:
    """Whose changes a teardown undoes when they are not the run directory's own: a sweep's
    variants share one run id on the nodes and one journal (:mod:`dit.run.sweep`)."""

    run_id: str
    journal: Path
    metadata: Path | None = None  # the conditions in force (metadata.json), when not the run directory's


Keep = Callable[[Mapping[str, Any]], bool]
#: The teardown play run where it already waits (the run's stage session: no ansible-playbook start of its
#: own): its outcome, or None when it cannot be run there (then it runs on its own).
InSession = Callable[[dict[str, Any], Callable[[HostEvent], None]], StageOutcome | None]


def teardown(
    run: RunDir,
    inventory: RunInventory | None,
    reporter: Reporter | None,
    discard_results: bool = False,
    *,
    node: NodeScope | None = None,
    keep: Keep | None = None,
    spare: Mapping[str, Collection[str]] | None = None,
    in_session: InSession | None = None,
) -> tuple[str | None, int]:
    """Replay ``run``'s pending journal backwards on every node; verify no process survives.

    A node's run directory goes only once ``raw/`` holds every file of its ``results/`` and
    ``logs/``: what raw/ lacks is fetched, and a directory holding a file that could not be fetched
    is kept and named, unless ``discard_results``. Nothing here depends on writing the run
    directory: status, log and journal writes are best effort, said on stderr when they fail (a
    full disk), and the undo runs all the same.

    ``node``: the run id and journal of the nodes when they are a sweep's (``run`` is then the variant
    whose ``raw/``, ``metadata.json`` and status count); ``keep``: the pending records to leave in
    force (a sweep's next variant applies them alike), undone by a later teardown; ``spare``: per host, the
    tags of the processes ``keep`` leaves running (their records are kept): on such a host the run
    directory stays, emptied of what collect fetched but their logs, and they are told to start their
    results anew (dit_restore's ``reset``); ``in_session``: where
    the first pass may run without a playbook start of its own (a completed run's stage session, which
    waits for teardown after collect); a session that cannot run it, or whose playbook ends otherwise than
    successful or failed (cancelled, or ansible-runner's own error), leaves the pass to a playbook of its
    own.

    Returns the error (None when everything was undone and nothing survives) and the wall time.
    """
    node = node or NodeScope(run.run_id, run.journal)
    journal = Journal(node.journal)
    errors: list[str] = []
    infos: list[str] = []
    notes: list[str] = []  # what could not be written into the run directory: said, not failures
    spare = {host: sorted(tags) for host, tags in (spare or {}).items() if tags}
    try:
        by_host = journal.pending_by_host()
        pending, warnings = _with_resets(_kept_out(by_host, keep), by_host, spare), journal.problems()
    except JournalError as exc:  # unreadable: still reap the run's processes below
        pending, warnings = {}, []
        errors.append(str(exc))
    start = time.monotonic_ns()
    if reporter is not None:
        reporter.stage("teardown", "running")
    _note(notes, run.try_set_status(stage="teardown"))
    if inventory is not None:
        raw = run.path / "raw"
        fetched_before = {host: fetched_results(raw, host) for host in inventory.hosts}
        seen = _TeardownSeen()

        def on_event(event: HostEvent) -> None:
            seen.add(event)
            # A failed fetch is said once per node, with the directory it kept (_kept_message).
            if reporter is not None and not seen.failed_fetch(event):
                reporter.event(event)

        undo, sent = pending, set[str]()
        for _ in range(2):
            sent |= {str(record.get("id")) for records in undo.values() for record in records}
            extravars = {
                "dit_run_id": node.run_id,
                "dit_journal_path": str(node.journal),
                "dit_undo": undo,
                "dit_undo_scope": undo_scopes(
                    node.run_id, inventory, node.metadata or run.path / "metadata.json"
                ),
                "dit_raw_dir": str(raw),
                "dit_fetched": fetched_before,
                "dit_discard_results": discard_results,
                "dit_spare": spare,
            }
            played = None if in_session is None else in_session(extravars, on_event)
            in_session = None  # a second pass (late records) has its own playbook
            # (what the session's play undid, if it ran, stays seen: undoing a record again is harmless)
            outcome = (
                played
                if played is not None and played.status in ("successful", "failed")
                else _teardown_playbook(run, inventory, extravars, on_event, notes)
            )
            # A change journaled after the journal was read above (a stage's task that was still
            # running as a stop arrived: its journal record lands first, by design) gets a second pass.
            undo = _kept_out(_late_records(journal, sent), keep)
            if not undo:
                break
        warnings.extend(seen.refused)
        try:
            journal.mark_undone(seen.undone)
        except JournalError as exc:  # undone on the nodes all the same; a later cleanup redoes it harmlessly
            errors.append(f"{exc}: the nodes are undone, run 'dit cleanup {run.path}' once it can be written")
        kept_ids: set[str] = set()
        for host in inventory.hosts:
            result = seen.restore.get(host) or {}
            if result.get("kept"):
                kept_ids.update(str(r.get("id")) for r in result.get("kept_records", []))
                errors.append(_kept_message(run, host, result, seen.fetch_errors.get(host, [])))
            new = sorted(set(fetched_results(raw, host)) - set(fetched_before[host]))
            if new:
                infos.append(
                    f"fetched {len(new)} file(s) of {host}'s results and logs the collect stage had not "
                    f"into {raw / host}: {', '.join(new)}"
                )
        if kept_ids:
            errors.append(
                f"the results stay on the nodes: 'dit cleanup {run.path}' fetches them once raw/ can take "
                f"them, 'dit cleanup --discard-results {run.path}' deletes them"
            )
        dropped = dropped_results(raw, seen.removed)
        if dropped:
            warnings.append(
                ("deleted with --discard-results, never fetched into raw/: " if discard_results
                 else "removed from the nodes without being fetched into raw/: ")
                + ", ".join(dropped)
            )  # fmt: skip
        # A failed fetch is reported with the directory it kept (above), not as a failure of its own.
        errors.extend(f"{e.host}: {e.message()}" for e in outcome.failures() if e.action not in FETCH_ACTIONS)
        if not outcome.ok and not errors:
            errors.append(f"teardown playbook {outcome.status}")
        try:
            undone = set(seen.undone)
            left = {
                c.host
                for c in journal.pending()
                if c.id not in kept_ids and c.id not in undone and not (keep and keep(c.record))
            }
        except JournalError:
            left = set()  # unreadable: already reported above
        if left:
            errors.append(f"journal changes not undone on {', '.join(sorted(left))}")
        if inventory.local:
            survivors = [p for p in run_processes(node.run_id) if not _spared(p, spare)]
            if survivors:
                errors.append(
                    "processes of the run survive teardown: " + ", ".join(str(p.pid) for p in survivors)
                )
    elif pending:
        errors.append("no inventory to undo the journal with")
    ns = time.monotonic_ns() - start
    try:
        stage_ns = dict(run.status().get("stage_ns", {}))
    except (OSError, ValueError, TypeError, AttributeError):
        stage_ns = {}  # set_status below sets the unreadable file aside
    stage_ns["teardown"] = ns
    _note(
        notes,
        run.try_set_status(
            stage_ns=stage_ns, teardown={"ok": not errors, "errors": errors, "warnings": warnings}
        ),
    )
    _say(run, reporter, infos, warnings + notes)
    if reporter is not None:
        reporter.stage("teardown", "failed" if errors else "done", ns / 1e6)
        for error in errors:
            reporter.error(f"teardown: {error}")
    return ("; ".join(errors) if errors else None), ns


def teardown_in_session(session: StageSession | None, state: str) -> InSession | None:
    """Where a run ending in ``state`` has its teardown without an ansible-playbook start of its own: a
    completed run's stage session, whose playbook waits for it after collect with every host still in its
    plays. After a failure or a stop (a host may have left the plays, the playbook may be gone) teardown
    has its own start."""
    if state != "completed" or session is None:
        return None

    def in_session(extravars: dict[str, Any], on_event: Callable[[HostEvent], None]) -> StageOutcome | None:
        outcome = session.hand_over("teardown", extravars, on_event)
        if outcome is None:
            session.close()  # teardown runs on its own then: no stage playbook may wait beside it
        return outcome

    return in_session


def _with_resets(
    pending: dict[str, list[dict[str, Any]]],
    every: Mapping[str, list[dict[str, Any]]],
    spare: Mapping[str, Collection[str]],
) -> dict[str, list[dict[str, Any]]]:
    """``pending`` plus, on each host with spared processes, its run directory's record (dit_node's
    ``mkdir``, kept) marked ``reset``: the directory is emptied for the next variant, not removed."""
    out = {host: list(records) for host, records in pending.items()}
    for host, tags in spare.items():
        resets = [
            {**record, "reset": True}
            for record in every.get(host, [])
            if record.get("op") == "mkdir" and record.get("source") == "dit_node"
        ]
        if tags and resets:
            out.setdefault(host, []).extend(resets)
    return out


def _spared(proc: psutil.Process, spare: Mapping[str, Collection[str]]) -> bool:
    """Whether a local process of the run is one ``spare`` leaves running."""
    try:
        env = proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return True  # gone: not a survivor
    return env.get(TAG_ENV, "") in spare.get(env.get(HOST_ENV, ""), ())


def _kept_out(pending: dict[str, list[dict[str, Any]]], keep: Keep | None) -> dict[str, list[dict[str, Any]]]:
    if keep is None:
        return pending
    left = {host: [r for r in records if not keep(r)] for host, records in pending.items()}
    return {host: records for host, records in left.items() if records}


def _note(notes: list[str], error: str | None) -> None:
    note = f"not recorded in the run directory: {error}"
    if error and note not in notes:
        notes.append(note)


def _kept_message(run: RunDir, host: str, result: Mapping[str, Any], fetch_errors: list[str]) -> str:
    """Which node directory was kept, for which files and why."""
    unfetched = [f for f in result.get("unfetched", []) if isinstance(f, Mapping)]
    # A fetch that failed half-way may have left part of a file in raw/: it must not pass for fetched.
    for item in unfetched:
        # raw/<host> may be no directory, or not writable: then there is nothing of it to remove
        with contextlib.suppress(OSError):
            collected_name(run.path / "raw", host, str(item.get("path", ""))).unlink(missing_ok=True)
    shown = ", ".join(f"{f.get('path')} ({int(f.get('bytes', 0))} bytes)" for f in unfetched[:4])
    if len(unfetched) > 4:
        shown += f" and {len(unfetched) - 4} more"
    why = f"; fetching failed: {fetch_errors[0]}" if fetch_errors else ""
    return (
        f"{host}: kept {', '.join(str(k) for k in result.get('kept', []))} on the node: {len(unfetched)} "
        f"file(s) there are not in {run.path / 'raw' / host} ({shown}){why}"
    )


def _late_records(journal: Journal, sent: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The pending records per host that teardown has not yet sent to the nodes."""
    try:
        pending = journal.pending_by_host()
    except JournalError:
        return {}  # unreadable: reported by the caller's own read
    late = {host: [r for r in records if str(r.get("id")) not in sent] for host, records in pending.items()}
    return {host: records for host, records in late.items() if records}


def _teardown_playbook(
    run: RunDir,
    inventory: RunInventory,
    extravars: dict[str, Any],
    on_event: Callable[[HostEvent], None],
    notes: list[str],
) -> StageOutcome:
    """The teardown playbook, its Ansible files written outside the run directory.

    ansible-runner writes the rendered playbook, its inputs and every event under its private
    directory: on a full or read-only run directory that would stop the undo before it starts.
    They are copied into ``ansible/teardown`` afterwards, beside the other stages', if they fit.
    """
    keep = run.path / "ansible" / "teardown"
    try:
        private: Path | None = Path(tempfile.mkdtemp(prefix="dit-teardown-"))
    except OSError as exc:
        notes.append(f"no temporary directory for teardown's Ansible files ({os_reason(exc)}): using {keep}")
        private = None
    try:
        return run_stage(
            "teardown",
            private or keep,
            inventory.source,
            inventory.limit,
            extravars,
            on_event,
            lambda: False,
            forks=max(5, len(inventory.hosts)),
        )
    finally:
        if private is not None:
            try:
                shutil.copytree(private, keep, symlinks=True, dirs_exist_ok=True)
            except OSError as exc:  # shutil.Error (several files) has no errno
                reason = os_reason(exc) if exc.errno else "some files could not be copied"
                notes.append(f"{keep}: teardown's Ansible files are not kept ({reason})")
            shutil.rmtree(private, ignore_errors=True)


def _say(run: RunDir, reporter: Reporter | None, infos: list[str], warnings: list[str]) -> None:
    """Show and log what teardown has to say: through the run's reporter, or on stderr and in run.log."""
    if not infos and not warnings:
        return
    target = reporter or Reporter(run.log, Console(stderr=True, soft_wrap=True), run.run_id)
    try:
        for info in infos:
            target.info(f"teardown: {info}")
        for warning in warnings:
            target.warn(f"teardown: {warning}")
    finally:
        if reporter is None:
            target.close()
