"""The run journal: every change to a node is appended here *before* it is made.

``journal.jsonl`` lives in the run directory on the controller. A *change* record says what was
changed on which host and how to undo it (``op`` + ``undo`` data, interpreted by the node-side
``dit_restore`` module). An *undone* record (``{"undone": <id>}``) is appended once the change
has been reverted. Teardown and ``dit cleanup`` replay the pending changes backwards, so a crashed
driver (even SIGKILL) always leaves enough to undo everything, and replaying twice is harmless.

Appends are single ``write`` calls of one line under an exclusive ``flock``: Ansible's forked
workers append concurrently.
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
from typing import Any


class JournalError(Exception):
    """The journal cannot be read (e.g. a corrupt line that is not the last one)."""


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
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record_changes(self, host: str, records: Iterable[Mapping[str, Any]], source: str) -> list[str]:
        """Append change records for ``host`` and return their ids (assigned here)."""
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
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        out: list[dict[str, Any]] = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if number == len(lines):
                    # A torn last line (the writer was killed mid-write) carries no complete change.
                    continue
                raise JournalError(f"{self.path}:{number}: not valid JSON ({exc.msg})") from exc
        return out

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
