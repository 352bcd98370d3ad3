from __future__ import annotations

import errno
import json
import multiprocessing
import os
from pathlib import Path

import pytest

from dit.run.journal import Journal, JournalError


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


def test_torn_last_line_is_ignored_and_corruption_elsewhere_too(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.record_changes("edge", [{"op": "mkdir", "undo": {"path": "/x"}}], "m")
    with path.open("a") as handle:
        handle.write('{"id": "torn", "op": "mk')  # the writer died mid-line
    assert len(journal.pending()) == 1
    # A bad line anywhere is skipped, named by file and line: one bad record must not make
    # every other change of the run impossible to undo.
    path.write_text('not json\n{"undone": "x"}\n')
    assert journal.records() == [{"undone": "x"}]
    assert journal.problems() == [f"{path}:1: torn or invalid record skipped (not valid JSON)"]


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


def _tear_last_line(path: Path) -> None:
    """Cut the last line of ``path`` in half, without its newline, as a writer killed mid-write leaves it."""
    text = path.read_text(encoding="utf-8")
    head, _, last = text.rstrip("\n").rpartition("\n")
    path.write_text(head + "\n" + last[: len(last) // 2], encoding="utf-8")


@pytest.mark.parametrize("where", ["end", "middle"])
def test_a_torn_line_is_skipped_with_a_warning_and_appends_start_on_a_fresh_line(
    tmp_path: Path, where: str
) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)

    def change(i: int) -> str:
        return journal.record_changes("edge", [{"op": "mkdir", "undo": {"path": f"/x{i}"}}], "m")[0]

    ids = [change(i) for i in range(3)]
    _tear_last_line(path)
    survivors = ids[:2]
    if where == "middle":  # the run went on after the torn write: the torn line is now in the middle
        survivors.append(change(3))
    assert [c.id for c in journal.pending()] == survivors[::-1]

    journal.mark_undone(survivors)  # the next append must not glue itself onto a torn last line
    assert path.read_text(encoding="utf-8").endswith("\n")
    last = json.loads(path.read_text(encoding="utf-8").splitlines()[-1])
    assert last["undone"] == survivors[-1]
    assert journal.pending() == []
    # Named by file and line, however often the journal is read.
    assert journal.problems() == [f"{path}:3: torn or invalid record skipped (not valid JSON)"]


def test_records_of_the_wrong_shape_are_skipped_not_crashed_on(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(
        b'42\n{"id": "a", "op": "mkdir"}\n{"undone": 7}\n\xff\xfe\n'
        b'{"id": "b", "host": "edge", "op": "mkdir", "undo": {"path": "/y"}}\n'
    )
    journal = Journal(path)
    assert [c.id for c in journal.pending()] == ["b"]
    assert [p.split(": ", 1)[0] for p in journal.problems()] == [f"{path}:{n}" for n in (1, 2, 3, 4)]


def test_a_short_write_on_a_nearly_full_disk_still_appends_whole_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))  # 7 bytes a call
    journal = Journal(tmp_path / "journal.jsonl")
    ids = journal.record_changes("device1", [{"op": "file", "undo": {"path": "/x", "prior": "1"}}], "m")
    assert [c.id for c in journal.pending()] == ids
    assert journal.problems() == []


def test_a_full_disk_is_a_journal_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(_fd: int, _data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    path = tmp_path / "journal.jsonl"
    with pytest.raises(
        JournalError, match=r"journal\.jsonl: cannot write the journal \(no space left on device"
    ):
        Journal(path).mark_undone(["abc"])
