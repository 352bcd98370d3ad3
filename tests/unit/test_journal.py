from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from dit.journal import Journal, JournalError


def test_pending_is_newest_first_and_excludes_undone(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    first = journal.record_changes("device1", [{"op": "mkdir", "undo": {"path": "/a"}}], "dit_node")
    second = journal.record_changes(
        "device1",
        [{"op": "process", "undo": {"tag": "x"}}, {"op": "file", "undo": {"path": "/f", "prior": "1"}}],
        "m",
    )
    assert [c.id for c in journal.pending()] == [second[1], second[0], first[0]]
    journal.mark_undone([second[1]])
    assert [c.id for c in journal.pending()] == [second[0], first[0]]
    assert journal.pending_by_host() == {
        "device1": [dict(c.record) for c in journal.pending()],
    }
    journal.mark_undone([second[0], first[0]])
    assert journal.pending() == []


def test_records_carry_host_source_and_time(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    (change_id,) = journal.record_changes("edge", [{"op": "mkdir", "undo": {"path": "/x"}}], "dit_node")
    (record,) = journal.records()
    assert record["id"] == change_id
    assert record["host"] == "edge"
    assert record["source"] == "dit_node"
    assert record["undo"] == {"path": "/x"}
    assert isinstance(record["t_wall_ns"], int)


def test_record_without_op_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    with pytest.raises(JournalError, match="no 'op'"):
        journal.record_changes("edge", [{"undo": {}}], "m")
    assert journal.records() == []


def test_torn_last_line_is_ignored_but_corruption_elsewhere_is_not(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.record_changes("edge", [{"op": "mkdir", "undo": {"path": "/x"}}], "m")
    with path.open("a") as handle:
        handle.write('{"id": "torn", "op": "mk')  # the writer died mid-line
    assert len(journal.pending()) == 1
    path.write_text('not json\n{"undone": "x"}\n')
    with pytest.raises(JournalError, match=":1: not valid JSON"):
        journal.records()


def _append_many(path: str, host: str) -> None:
    journal = Journal(Path(path))
    for i in range(50):
        journal.record_changes(host, [{"op": "mkdir", "undo": {"path": f"/{host}/{i}"}}], "m")


def test_concurrent_appends_from_processes_keep_every_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    workers = [multiprocessing.Process(target=_append_many, args=(str(path), f"h{i}")) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 200
    assert all(json.loads(line)["op"] == "mkdir" for line in lines)
