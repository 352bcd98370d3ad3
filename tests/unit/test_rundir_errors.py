"""A run directory that cannot be written (full disk, read-only, not a directory) gives one line
naming the file and the reason, never a traceback; the run log is given up, not the run."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dit.cli import app
from dit.run import rundir
from dit.run.console import Reporter
from dit.run.rundir import STOP, RunDir, RunDirError, check_writable, read_json, write_json
from tests.conftest import write_scenario


def test_write_json_names_the_file_and_the_reason(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    target = blocker / "status.json"
    with pytest.raises(RunDirError) as caught:
        write_json(target, {"a": 1})
    assert str(caught.value) == f"{target}: cannot write: Not a directory"
    assert isinstance(caught.value, OSError) and caught.value.filename == str(target)


def test_a_full_disk_says_so_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    target = tmp_path / "status.json"
    with pytest.raises(RunDirError) as caught:
        write_json(target, {"a": 1})
    assert str(caught.value) == f"{target}: cannot write: no space left on device: the file system is full"
    assert rundir.disk_full(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_read_json_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"missing\.json: cannot read: No such file or directory$"):
        read_json(tmp_path / "missing.json")


def test_a_run_directory_under_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("", encoding="utf-8")
    with pytest.raises(RunDirError, match=r"runs/s: cannot create the directory: Not a directory$"):
        RunDir.create(tmp_path / "runs", "s", "0123456789abcdef")
    with pytest.raises(RunDirError, match=r"runs: cannot use it: not a directory$"):
        check_writable(tmp_path / "runs")


def test_try_set_status_returns_the_error_instead_of_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunDir.create(tmp_path / "runs", "s", "0123456789abcdef")
    run.set_status(state="running")

    def read_only(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "replace", read_only)
    assert (
        run.try_set_status(stage="teardown")
        == f"{run.path / 'status.json'}: cannot write: read-only file system"
    )
    assert run.status() == {"state": "running", "updated_wall_ns": run.status()["updated_wall_ns"]}


def test_dit_run_refuses_a_runs_dir_it_cannot_use_before_anything_starts(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path)
    runs = tmp_path / "runs"
    runs.write_text("", encoding="utf-8")
    result = CliRunner().invoke(app, ["run", str(scenario), "--runs-dir", str(runs)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert " ".join(result.output.split()) == f"error: --runs-dir: {runs}: cannot use it: not a directory"


def test_a_stop_request_carries_discard_results(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "runs", "s", "0123456789abcdef")
    assert not run.discard_requested()
    run.request_stop()
    assert run.stop_requested() and not run.discard_requested()
    run.request_stop(discard_results=True)
    assert run.discard_requested()
    (run.path / STOP).write_text("1764000000000000000\n", encoding="utf-8")  # an older dit's STOP file
    assert run.stop_requested() and not run.discard_requested()


def test_the_reporter_gives_up_an_unwritable_log_not_the_run(tmp_path: Path) -> None:
    shown = io.StringIO()
    reporter = Reporter(tmp_path / "gone" / "run.log", Console(file=shown, width=300), "label")
    reporter.info("teardown: undone")
    reporter.close()
    text = shown.getvalue()
    assert f"{tmp_path / 'gone' / 'run.log'}: cannot write the run log (No such file or directory)" in text
    assert "teardown: undone" in text  # its lines go to the console instead


def test_the_reporter_survives_a_log_that_fills_up(tmp_path: Path) -> None:
    shown = io.StringIO()
    reporter = Reporter(tmp_path / "run.log", Console(file=shown, width=300), "label")
    log = reporter._log
    assert log is not None

    class Full(io.StringIO):
        def flush(self) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    reporter._log = Full()
    reporter.info("one")
    reporter.info("two")
    reporter.close()
    log.close()
    text = shown.getvalue()
    assert text.count("cannot write the run log (no space left on device: the file system is full)") == 1
    assert "two" in text
