"""Immutable scenario versions in SQLite, keyed by content hash; history per name; diffs.

A version's hash is the SHA-256 of the canonical JSON of the *resolved* document (every default
applied, see :mod:`dit.scenario`) with its ``sweep`` kept: for a scenario without a sweep it is exactly
:attr:`dit.scenario.Scenario.hash`, the hash in the name of its run directories, so spelling out a
default or reordering keys saves no new version. The hashes of the variants a version expands to are
stored too, so any run (from NNPM or the CLI) is traced back to the version it executed.

Nothing here validates: callers save only documents :func:`dit.scenario.validate` accepted.
"""

from __future__ import annotations

import difflib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.scenario import Scenario, canonical_json, content_hash, dump_yaml, resolve

SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    document TEXT NOT NULL,   -- the document as written (JSON)
    resolved TEXT NOT NULL,   -- canonical JSON of what is hashed
    kind TEXT NOT NULL DEFAULT 'scenario',  -- scenario | benchmark (derived: profiling only)
    derived_from TEXT
);
CREATE INDEX IF NOT EXISTS versions_name ON versions(name, created_ns);
CREATE TABLE IF NOT EXISTS variants (
    variant_hash TEXT NOT NULL,
    version_hash TEXT NOT NULL REFERENCES versions(hash),
    label TEXT NOT NULL,
    PRIMARY KEY (variant_hash, version_hash)
);
CREATE TABLE IF NOT EXISTS notes (  -- a note on a version (a lab notebook entry): the version stays immutable
    version_hash TEXT PRIMARY KEY REFERENCES versions(hash),
    text TEXT NOT NULL,
    updated_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (  -- runs waiting for the runs going before them (NNPM's run queue)
    id TEXT PRIMARY KEY,
    version_hash TEXT NOT NULL REFERENCES versions(hash),
    kind TEXT NOT NULL,
    mode TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'waiting',  -- waiting | started | cancelled | failed
    launch TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS queue_state ON queue(state, created_ns);
CREATE TABLE IF NOT EXISTS launches (
    id TEXT PRIMARY KEY,
    version_hash TEXT NOT NULL,
    kind TEXT NOT NULL,
    mode TEXT NOT NULL,
    pid INTEGER,
    created_ns INTEGER NOT NULL,
    argv TEXT NOT NULL,
    log TEXT NOT NULL
);
"""


_SELECT = "SELECT versions.*, notes.text AS note FROM versions LEFT JOIN notes ON notes.version_hash = versions.hash"
NOTE_MAX_CHARS = 10_000


def version_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """What a version's hash covers: the resolved document, plus its sweep when it has one."""
    out = resolve(doc)
    if "sweep" in doc:
        out["sweep"] = json.loads(json.dumps(doc["sweep"]))
    return out


def version_hash(doc: Mapping[str, Any]) -> str:
    return content_hash(version_document(doc))


@dataclass(frozen=True)
class Version:
    hash: str
    name: str
    created_ns: int
    document: dict[str, Any]
    resolved: dict[str, Any]
    kind: str
    derived_from: str | None
    note: str = ""  # the researcher's note on the version (not part of it: not hashed)

    @property
    def derived(self) -> bool:
        """Made by dit from another version (a benchmark's profiling-only copy), not saved by the
        researcher: listed, marked, never the version the editor opens (issue 49, item 2)."""
        return self.kind != "scenario"

    def yaml(self) -> str:
        return dump_yaml(self.document, header=f"# {self.name} · NNPM version sha256 {self.hash}\n")

    def summary(self) -> dict[str, Any]:
        return {
            "hash": self.hash,
            "name": self.name,
            "created_ns": self.created_ns,
            "kind": self.kind,
            "derived": self.derived,
            "derived_from": self.derived_from,
            "note": self.note,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "document": self.document, "yaml": self.yaml()}


class Store:
    """The NNPM database (one SQLite file; safe to share between threads of one process)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def save(
        self,
        doc: Mapping[str, Any],
        variants: list[Scenario],
        kind: str = "scenario",
        derived_from: str | None = None,
    ) -> tuple[Version, bool]:
        """Store a (valid) document; ``(version, created)`` — an identical version is returned as is,
        except that the researcher saving what dit had derived makes it theirs (no longer derived)."""
        resolved = version_document(doc)
        digest = content_hash(resolved)
        existing = self.get(digest)
        if existing is not None and existing.derived and kind == "scenario":
            with self._tx() as db:
                db.execute(
                    "UPDATE versions SET kind = 'scenario', derived_from = NULL WHERE hash = ?", (digest,)
                )
            existing = self.get(digest)
        if existing is not None:
            return existing, False
        now = time.time_ns()
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO versions (hash, name, created_ns, document, resolved, kind, derived_from)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    digest,
                    str(doc["name"]),
                    now,
                    json.dumps(doc),
                    canonical_json(resolved),
                    kind,
                    derived_from,
                ),
            )
            db.executemany(
                "INSERT OR IGNORE INTO variants (variant_hash, version_hash, label) VALUES (?, ?, ?)",
                [(v.hash, digest, v.label) for v in variants],
            )
        version = self.get(digest)
        assert version is not None
        return version, True

    @staticmethod
    def _version(row: sqlite3.Row) -> Version:
        return Version(
            hash=row["hash"],
            name=row["name"],
            created_ns=row["created_ns"],
            document=json.loads(row["document"]),
            resolved=json.loads(row["resolved"]),
            kind=row["kind"],
            derived_from=row["derived_from"],
            note=row["note"] or "",
        )

    def get(self, digest: str) -> Version | None:
        with self._lock:
            row = self._db.execute(f"{_SELECT} WHERE hash = ?", (digest,)).fetchone()
        return None if row is None else self._version(row)

    def find(self, prefix: str) -> Version | None:
        """The version whose hash is ``prefix`` or starts with it (when only one does)."""
        if not prefix or not all(c in "0123456789abcdef" for c in prefix):
            return None
        with self._lock:
            rows = self._db.execute(
                f"{_SELECT} WHERE hash >= ? AND hash < ? LIMIT 2", (prefix, prefix + "g")
            ).fetchall()
        return self._version(rows[0]) if len(rows) == 1 else None

    def history(self, name: str) -> list[Version]:
        """Every version of ``name``, newest first (derived ones too: :meth:`opens` picks the editor's)."""
        with self._lock:
            rows = self._db.execute(
                f"{_SELECT} WHERE name = ? ORDER BY created_ns DESC, hash", (name,)
            ).fetchall()
        return [self._version(r) for r in rows]

    def names(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, COUNT(*) AS versions, MAX(created_ns) AS latest_ns FROM versions"
                " GROUP BY name ORDER BY name"
            ).fetchall()
        out = []
        for row in rows:
            latest = opens(self.history(row["name"]))
            out.append({"name": row["name"], "versions": row["versions"], "latest": latest.summary()})
        return out

    def set_note(self, digest: str, text: str) -> Version:
        """Set the note of the version ``digest`` (an empty text removes it); ``ValueError`` for a note
        over :data:`NOTE_MAX_CHARS`, ``KeyError`` for no such version."""
        if len(text) > NOTE_MAX_CHARS:
            raise ValueError(f"{len(text)} characters, at most {NOTE_MAX_CHARS}")
        with self._tx() as db:
            if db.execute("SELECT 1 FROM versions WHERE hash = ?", (digest,)).fetchone() is None:
                raise KeyError(digest)
            if text.strip():
                db.execute(
                    "INSERT INTO notes (version_hash, text, updated_ns) VALUES (?, ?, ?) ON CONFLICT"
                    "(version_hash) DO UPDATE SET text = excluded.text, updated_ns = excluded.updated_ns",
                    (digest, text, time.time_ns()),
                )
            else:
                db.execute("DELETE FROM notes WHERE version_hash = ?", (digest,))
        version = self.get(digest)
        assert version is not None
        return version

    def enqueue(self, digest: str, kind: str, mode: str, count: int) -> list[str]:
        """``count`` runs of the version ``digest`` at the end of the queue; their ids, in order."""
        now = time.time_ns()
        ids = [f"q{now}-{i:03d}" for i in range(count)]
        with self._tx() as db:
            db.executemany(
                "INSERT INTO queue (id, version_hash, kind, mode, created_ns) VALUES (?, ?, ?, ?, ?)",
                [(qid, digest, kind, mode, now + i) for i, qid in enumerate(ids)],
            )
        return ids

    def queued(self, states: tuple[str, ...] = ("waiting",)) -> list[dict[str, Any]]:
        """Queue entries in those states, first in line first (with their version's name)."""
        with self._lock:  # read every half second by the housekeeping: only the rows asked for
            rows = self._db.execute(
                "SELECT queue.*, versions.name AS name FROM queue JOIN versions ON versions.hash ="
                " queue.version_hash WHERE queue.state IN (SELECT value FROM json_each(?))"
                " ORDER BY queue.created_ns, queue.id",
                (json.dumps(list(states)),),
            ).fetchall()
        return [dict(r) for r in rows]

    def settle_queued(
        self, qid: str, state: str, launch: str | None = None, error: str | None = None
    ) -> bool:
        """Move a *waiting* entry to ``state`` (started, cancelled, failed); False if it was not waiting."""
        with self._tx() as db:
            done = db.execute(
                "UPDATE queue SET state = ?, launch = ?, error = ? WHERE id = ? AND state = 'waiting'",
                (state, launch, error, qid),
            )
            return done.rowcount == 1

    def version_of_variant(self, variant_hash: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT v.hash FROM variants x JOIN versions v ON v.hash = x.version_hash"
                " WHERE x.variant_hash = ? ORDER BY v.created_ns LIMIT 1",
                (variant_hash,),
            ).fetchone()
        return None if row is None else str(row["hash"])

    def add_launch(
        self, launch_id: str, version: str, kind: str, mode: str, pid: int, argv: list[str], log: str
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO launches (id, version_hash, kind, mode, pid, created_ns, argv, log)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (launch_id, version, kind, mode, pid, time.time_ns(), json.dumps(argv), log),
            )

    def launches(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM launches ORDER BY created_ns DESC").fetchall()
        return [{**dict(r), "argv": json.loads(r["argv"])} for r in rows]


def opens(history: list[Version]) -> Version:
    """The version the editor opens of a (non-empty, newest first) history: the newest the researcher
    saved, never a derived one (a benchmark's copy, with inference and optimisation off), unless every
    version is derived."""
    return next((v for v in history if not v.derived), history[0])


def _typed_paths(doc: Any, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every path the researcher wrote in ``doc`` (a model given by name is its ``model.name``)."""
    out: set[tuple[str, ...]] = {path} if path else set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            out |= _typed_paths(value, (*path, str(key)))
    elif path == ("model",) and isinstance(doc, str):
        out.add(("model", "name"))
    return out


def _shown(side: Any, other: Any, typed: set[tuple[str, ...]], path: tuple[str, ...] = ()) -> Any:
    """``side``'s resolved document without the defaults that only it holds and nobody typed: a block added
    in one version brings its defaults with it, which are no change the researcher made (issue 49, item 6).
    A value in both versions stays (unchanged, it is context; changed, it is a change)."""
    if not isinstance(side, dict):
        return side
    out: dict[str, Any] = {}
    for key, value in side.items():
        sub = (*path, str(key))
        there = other.get(key, _MISSING) if isinstance(other, dict) else _MISSING
        shown = _shown(value, there, typed, sub)
        if there is not _MISSING or sub in typed or (isinstance(shown, dict) and shown):
            out[key] = shown
    return out


def diff(a: Version, b: Version) -> dict[str, Any]:
    """What changed from ``a`` to ``b``: changed paths (resolved values) and a unified YAML diff, neither
    listing a default that only one version holds because a block was added or removed around it."""
    changes: list[dict[str, Any]] = []
    typed = _typed_paths(a.document) | _typed_paths(b.document)
    shown_a, shown_b = _shown(a.resolved, b.resolved, typed), _shown(b.resolved, a.resolved, typed)

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y)):
                sub = f"{path}.{key}" if path else str(key)
                walk(x.get(key, _MISSING), y.get(key, _MISSING), sub)
            return
        if x != y:
            changes.append(
                {
                    "path": path,
                    "a": None if x is _MISSING else x,
                    "b": None if y is _MISSING else y,
                    "added": x is _MISSING,
                    "removed": y is _MISSING,
                }
            )

    walk(shown_a, shown_b, "")
    text_a = dump_yaml(shown_a).splitlines(keepends=True)
    text_b = dump_yaml(shown_b).splitlines(keepends=True)
    unified = "".join(
        difflib.unified_diff(
            text_a, text_b, fromfile=f"{a.name}@{a.hash[:12]}", tofile=f"{b.name}@{b.hash[:12]}"
        )
    )
    return {"a": a.summary(), "b": b.summary(), "changes": changes, "unified": unified}


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
