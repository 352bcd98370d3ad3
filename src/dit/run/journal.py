"""The run journal: every change to a node is appended here *before* it is made.

``journal.jsonl`` lives in the run directory on the controller. A *change* record says what was
changed on which host and how to undo it (``op`` + ``undo`` data, interpreted by the node-side
``dit_restore`` module). An *undone* record (``{"undone": <id>}``) is appended once the change
has been reverted. Teardown and ``dit cleanup`` replay the pending changes backwards, so a crashed
driver (even SIGKILL) always leaves enough to undo everything, and replaying twice is harmless.

Appends are single ``write`` calls of one line under an exclusive ``flock``: Ansible's forked
workers append concurrently. A writer killed mid-write leaves a torn line without its newline;
the next append therefore starts on a fresh line, and readers skip a torn or malformed record
wherever it is (naming file and line in :meth:`Journal.problems`) instead of refusing the whole
journal: one lost record must not make every other change of the run impossible to undo.
What undoing a record may do on a node is confined: see ``docs/journal.md``.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit.run.rundir import os_reason

if TYPE_CHECKING:
    from dit.run.inventory import RunInventory


class JournalError(Exception):
    """The journal cannot be read or written (the file itself, not one of its records)."""


@dataclass(frozen=True)
class Change:
    id: str
    host: str
    op: str
    undo: Mapping[str, Any]
    record: Mapping[str, Any]


def _append_lines(path: Path, lines: Iterable[str]) -> None:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if not data:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise JournalError(f"{path}: cannot write the journal ({os_reason(exc)})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # A writer was killed mid-line: end its fragment here, or this record would be glued
            # onto it and lost with it.
            data = b"\n" + data
        view = memoryview(data)
        while view:  # a nearly full disk takes part of a write: the rest then raises ENOSPC, not lost
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as exc:  # a full disk: what was not appended stays pending, a later cleanup redoes it
        raise JournalError(f"{path}: cannot write the journal ({os_reason(exc)})") from None
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _malformed(record: Any) -> str | None:
    """Why ``record`` is neither a change nor an undone record (None when it is one)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if "undone" in record:
        return None if isinstance(record["undone"], str) else "'undone' is not a record id"
    for key in ("id", "host", "op"):
        if not isinstance(record.get(key), str):
            return f"change record without a string {key!r}"
    if not isinstance(record.get("undo", {}), dict):
        return "'undo' is not an object"
    return None


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record_changes(
        self, host: str, records: Iterable[Mapping[str, Any]], source: str, role: str | None = None
    ) -> list[str]:
        """Append change records for ``host`` and return their ids (assigned here). ``role``: the
        condition role whose task made them, so that a sweep can keep what the next variant keeps."""
        ids: list[str] = []
        lines: list[str] = []
        for record in records:
            if "op" not in record:
                raise JournalError(f"journal record from {source} has no 'op': {dict(record)!r}")
            change_id = uuid.uuid4().hex
            ids.append(change_id)
            full = {
                "id": change_id,
                "t_wall_ns": time.time_ns(),
                "host": host,
                "source": source,
                **({"role": role} if role else {}),
                **dict(record),
            }
            lines.append(json.dumps(full, sort_keys=True, separators=(",", ":")))
        _append_lines(self.path, lines)
        return ids

    def mark_undone(self, ids: Iterable[str]) -> None:
        now = time.time_ns()
        _append_lines(
            self.path,
            (json.dumps({"undone": i, "t_wall_ns": now}, separators=(",", ":")) for i in ids),
        )

    def records(self) -> list[dict[str, Any]]:
        """The well-formed records, in file order; see :meth:`problems` for the lines skipped."""
        return self._read()[0]

    def problems(self) -> list[str]:
        """One warning per skipped line (torn or malformed), naming ``file:line``."""
        return self._read()[1]

    def _read(self) -> tuple[list[dict[str, Any]], list[str]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot read the journal ({exc.strerror or exc})") from None
        out: list[dict[str, Any]] = []
        problems: list[str] = []
        for number, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                why: str | None = "not UTF-8"
            except json.JSONDecodeError:
                why = "not valid JSON"
            else:
                why = _malformed(record)
            if why is None:
                out.append(record)
            else:
                problems.append(f"{self.path}:{number}: torn or invalid record skipped ({why})")
        return out, problems

    def pending(self) -> list[Change]:
        """Changes not yet undone, newest first (the order teardown must undo them in)."""
        records = self.records()
        undone = {r["undone"] for r in records if "undone" in r}
        changes = [
            Change(r["id"], r["host"], r["op"], r.get("undo", {}), r)
            for r in records
            if "id" in r and r["id"] not in undone
        ]
        changes.reverse()
        return changes

    def pending_by_host(self) -> dict[str, list[dict[str, Any]]]:
        """Pending change records grouped by host, newest first, as plain dicts for a playbook."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for change in self.pending():
            grouped.setdefault(change.host, []).append(dict(change.record))
        return grouped


def _built_conditions(metadata: Path) -> dict[str, Any]:
    """The conditions the run built per host (``metadata.json``), or none when it has no metadata."""
    try:
        conditions = json.loads(metadata.read_text(encoding="utf-8")).get("conditions", {})
    except (OSError, ValueError, AttributeError):
        return {}  # preflight writes it before apply: without it, no condition was applied
    return conditions if isinstance(conditions, dict) else {}


def undo_scopes(run_id: str, inventory: RunInventory, metadata: Path) -> dict[str, dict[str, Any]]:
    """What undoing the journal may touch on each host: ``dit_restore``'s scope parameters.

    Taken from the inventory (the node's run directory, its sysfs root, the lease directory) and,
    through every condition's ``undo_scope`` hook (:func:`dit.conditions.undo_scope`), from the
    conditions the run built (``metadata``, the run's ``metadata.json``) and the host's variables;
    never from the journal itself. docs/journal.md says what each allows.
    """
    from dit.conditions import undo_scope  # here: the action plugins import this module, not the conditions

    conditions = _built_conditions(metadata)
    scopes: dict[str, dict[str, Any]] = {}
    for host in inventory.hosts:
        hostvars = inventory.hostvars.get(host, {})
        built = conditions.get(host)
        scopes[host] = {
            "node_root": inventory.node_root(host, run_id),
            "sysfs_root": str(hostvars.get("sysfs_root") or "/sys"),
            **undo_scope(host, built if isinstance(built, dict) else {}, hostvars),
        }
        if hostvars.get("dit_lease_dir"):  # the node lease moved out of the node's dit directory
            scopes[host]["lease_dir"] = str(hostvars["dit_lease_dir"])
    return scopes


def collected_name(raw_dir: Path, host: str, node_path: str) -> Path:
    """Where the collect stage puts a node's ``results/<name>`` or ``logs/<name>`` under ``raw/``."""
    sub, _, name = node_path.partition("/")
    target = raw_dir / host if sub == "results" else raw_dir / host / sub
    return target / f"{host}_{name}"


def fetched_results(raw_dir: Path, host: str) -> list[str]:
    """The node files (``results/<name>``, ``logs/<name>``) of ``host`` that ``raw/`` already holds,
    collected or fetched: teardown removes a node's run directory only when every file of its
    ``results/`` and ``logs/`` is among them (a file is compared by name: what a process appended
    after collect is not a new result)."""
    prefix = f"{host}_"
    found: list[str] = []
    for sub, directory in (("results", raw_dir / host), ("logs", raw_dir / host / "logs")):
        try:
            names = sorted(p.name for p in directory.iterdir() if p.is_file() and not p.is_symlink())
        except OSError:
            continue
        found.extend(f"{sub}/{name[len(prefix) :]}" for name in names if name.startswith(prefix))
    return found


def dropped_results(raw_dir: Path, removed: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[str]:
    """The node files removed with a run directory that are not in ``raw/`` (fetched or collected)."""
    dropped: list[str] = []
    for host, files in sorted(removed.items()):
        for item in files:
            path = str(item.get("path", ""))
            if not collected_name(raw_dir, host, path).is_file():
                dropped.append(f"{host}:{path} ({int(item.get('bytes', 0))} bytes)")
    return dropped
