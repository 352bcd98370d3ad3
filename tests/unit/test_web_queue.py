"""NNPM's run queue (issue 36 item 10): runs asked for while another is going wait their turn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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


def test_a_run_asked_for_while_one_is_going_is_queued_never_a_second_driver(tmp_path: Path) -> None:
    """Issue 49 item 1: with one run going and nothing waiting, Run queued nothing (the holder was only
    computed when something waited) and started a second driver the lease refused. The server decides:
    queued behind the holder, refused when the request says not to queue, started only when free."""
    runs = tmp_path / "runs"
    store = Store(tmp_path / "nnpm.sqlite")
    version, _ = store.save(DOC, expand(DOC))
    started: list[str] = []

    def start(v: Version, kind: str, mode: str) -> Launch:
        started.append(kind)
        return Launch(f"launch-{len(started)}", v.hash, kind, mode, 0, tmp_path / "log", [])

    going = _going(runs)
    assert queue.entries(runs, store)["holder"] == "other/20260101T000000Z-going"  # nothing waits
    with pytest.raises(queue.Busy, match=r"^other/20260101T000000Z-going is going: .*queue it"):
        queue.start_or_enqueue(runs, store, version, "run", "local", start, queue=False)
    done = queue.start_or_enqueue(runs, store, version, "run", "local", start)
    assert done.launch is None and len(done.queued) == 1 and started == []
    # a benchmark asked for now waits too, behind the run already waiting
    bench = queue.start_or_enqueue(runs, store, version, "benchmark", "local", start)
    assert [e["id"] for e in queue.entries(runs, store)["entries"]] == [*done.queued, *bench.queued]
    (going / "status.json").write_text(json.dumps({"state": "completed", "label": "other"}))
    # nothing going, but runs wait: a new one takes its turn after them (false: refused, naming them)
    with pytest.raises(queue.Busy, match=r"^2 run\(s\) wait their turn"):
        queue.start_or_enqueue(runs, store, version, "run", "local", start, queue=False)
    assert queue.advance(runs, store, start) == done.queued[0] and started == ["run"]
    store.settle_queued(bench.queued[0], "cancelled")
    # free: started at once, unless asked to queue
    now = queue.start_or_enqueue(runs, store, version, "run", "local", start, queue=False)
    assert now.launch is not None and now.launch.id == "launch-2" and now.queued == ()
    assert queue.start_or_enqueue(runs, store, version, "run", "local", start, queue=True).launch is None
    store.close()
