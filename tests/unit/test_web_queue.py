"""NNPM's run queue (issue 36 item 10): runs asked for while another is going wait their turn."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dit.scenario import expand
from dit.web.services import queue
from dit.web.services.runs import Launch
from dit.web.services.store import Store, Version

DOC = {"name": "q1", "model": "fake", "devices": ["device1"], "repetitions": 2}


def _going(runs_root: Path, state: str = "running") -> Path:
    """A run of this machine whose driver (this test's own process) is alive."""
    path = runs_root / "other" / "20260101T000000Z-going"
    path.mkdir(parents=True, exist_ok=True)
    (path / "status.json").write_text(json.dumps({"state": state, "label": "other"}))
    (path / "driver.json").write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    return path


def test_queued_runs_wait_for_the_going_one_then_start_in_order(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    store = Store(tmp_path / "nnpm.sqlite")
    version, _ = store.save(DOC, expand(DOC))
    started: list[tuple[str, str, str]] = []

    def start(v: Version, kind: str, mode: str) -> Launch:
        started.append((v.hash, kind, mode))
        return Launch(f"launch-{len(started)}", v.hash, kind, mode, 0, tmp_path / "log", [])

    going = _going(runs)
    first, second, third = store.enqueue(version.hash, "run", "local", 3)
    line = queue.entries(runs, store)
    assert line["holder"] == "other/20260101T000000Z-going"
    assert [(e["id"], e["position"], e["name"]) for e in line["entries"]] == [
        (first, 1, "q1"), (second, 2, "q1"), (third, 3, "q1"),
    ]  # fmt: skip
    assert queue.advance(runs, store, start) is None and started == []  # the holder is going
    assert store.settle_queued(second, "cancelled") and not store.settle_queued(second, "cancelled")
    (going / "status.json").write_text(json.dumps({"state": "completed", "label": "other"}))
    assert queue.advance(runs, store, start) == first
    assert started == [(version.hash, "run", "local")]
    assert [e["id"] for e in queue.entries(runs, store)["entries"]] == [third]
    assert queue.advance(runs, store, start) == third  # nothing going (the fake launch left no driver)
    assert queue.entries(runs, store) == {"holder": None, "entries": []}
    rows = {r["id"]: r for r in store.queued(("started", "cancelled"))}
    assert rows[first]["launch"] == "launch-1" and rows[second]["state"] == "cancelled"
    store.close()


def test_an_entry_that_cannot_start_is_marked_failed_and_the_next_goes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    store = Store(tmp_path / "nnpm.sqlite")
    version, _ = store.save(DOC, expand(DOC))

    def refuse(v: Version, kind: str, mode: str) -> Launch:
        raise ValueError("no inventory: start dit web with --inventory to run on the nodes")

    (only,) = store.enqueue(version.hash, "run", "inventory", 1)
    assert queue.advance(runs, store, refuse) is None
    (failed,) = store.queued(("failed",))
    assert failed["id"] == only and "no inventory" in failed["error"]
    assert store.queued() == []
    store.close()
