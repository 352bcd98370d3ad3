"""Run directories as root reads them back (issue 46, item 2): created only below directories that are
root's alone, written through names that follow no link, and a driver known by the directory it holds."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dit.run.procs import holds_directory
from dit.run.rundir import STATUS, RunDir, check_writable, write_json
from dit.trusted import UntrustedPath, check_trusted_dir

NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown to another user")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    path = tmp_path / "runs"
    path.mkdir()
    return path


@as_root
def test_check_writable_refuses_a_runs_directory_another_user_owns_and_makes_a_missing_one_roots(
    tmp_path: Path,
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedPath, match=rf"--out {theirs}/runs: {theirs} above it is owned by nobody"):
        check_writable(theirs / "runs", what="--out")
    assert not (theirs / "runs").exists()
    made = tmp_path / "a" / "runs"
    check_writable(made)
    assert made.stat().st_uid == 0 and (made.stat().st_mode & 0o777) == 0o755
    assert os.listdir(made) == []  # the write probe is gone


@as_root
def test_a_run_directory_is_not_made_below_a_scenario_directory_another_user_owns(runs: Path) -> None:
    # the runs directory is root's, but someone was given (or took) runs/<scenario>: they could swap
    # a run directory, inventory.yml included, for theirs while root runs it
    scenario_dir = runs / "s"
    scenario_dir.mkdir()
    os.chown(scenario_dir, NOBODY, NOBODY)
    with pytest.raises(UntrustedPath, match=rf"the runs directory {scenario_dir} is owned by nobody"):
        RunDir.create(runs, "s", "0123456789abcdef")
    assert os.listdir(scenario_dir) == []


def test_a_new_run_directory_and_its_parts_are_roots_alone(runs: Path) -> None:
    run = RunDir.create(runs, "s", "0123456789abcdef")
    for path in (
        run.path.parent,
        run.path,
        *(run.path / sub for sub in ("raw", "aggregate", "ansible", "optimise")),
    ):
        assert path.stat().st_uid == os.geteuid() and not path.stat().st_mode & 0o022, path
    run.check_trusted()


@as_root
def test_writes_into_a_run_directory_another_user_owns_are_refused(runs: Path) -> None:
    run = RunDir.create(runs, "s", "0123456789abcdef")
    os.chown(run.path, NOBODY, NOBODY)
    for write in (
        lambda: run.set_status(state="running"),
        lambda: run.set_note("theirs"),
        lambda: run.set_note(""),
        run.request_stop,
        lambda: write_json(run.path / "metadata.json", {}),
    ):
        with pytest.raises(UntrustedPath, match=rf"the run directory {run.path} is owned by nobody"):
            write()
    assert sorted(os.listdir(run.path)) == ["aggregate", "ansible", "optimise", "raw"]  # nothing written


def test_status_is_replaced_never_written_through_a_link(runs: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's\n", encoding="utf-8")
    run = RunDir.create(runs, "s", "0123456789abcdef")
    (run.path / (STATUS + ".tmp")).symlink_to(victim)  # the temporary name dit used before issue 46
    run.set_status(state="running")
    assert victim.read_text(encoding="utf-8") == "root's\n"
    assert run.status()["state"] == "running"


@pytest.fixture
def holder(runs: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    run = runs / "held"
    run.mkdir()
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    try:
        proc = subprocess.Popen(["sleep", "60"], pass_fds=(fd,))
    finally:
        os.close(fd)
    yield proc, run
    proc.kill()
    proc.wait()


def test_a_driver_is_known_by_the_run_directory_it_holds_open(
    holder: tuple[subprocess.Popen[bytes], Path], runs: Path
) -> None:
    proc, run = holder
    other = runs / "other"
    other.mkdir()
    assert holds_directory(proc.pid, run)
    assert not holds_directory(proc.pid, other)
    assert not holds_directory(os.getpid(), run)  # this process closed its descriptor
    proc.kill()
    proc.wait()
    assert not holds_directory(proc.pid, run)  # gone


@as_root
def test_the_user_dit_runs_as_trusts_its_own_directories_and_no_one_elses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # local mode works without root: a user's own directory is as trusted as root's, to that user only
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    os.chown(mine, 4242, 4242)
    with pytest.raises(UntrustedPath, match=r"--out .*mine is owned by uid 4242"):
        check_trusted_dir(mine, what="--out")  # dit as root
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    check_trusted_dir(mine, what="--out")  # dit as uid 4242
