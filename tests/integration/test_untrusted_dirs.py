"""Issue 46, item 2: as root, a runs directory, ``--out``, a report's directory or a run directory that
another user owns (``nobody``, uid 65534) is refused before anything runs, with one line naming it; a
link planted at a file dit writes is replaced, never written through."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result
from rich.console import Console
from typer.testing import CliRunner

from dit.cli import app
from dit.reproduce.chapters import plan
from dit.reproduce.execute import finished_runs
from dit.reproduce.report import reproduce
from dit.run.procs import process_identity
from dit.run.rundir import DRIVER, STATUS, STOP, write_json
from dit.scenario import Scenario
from dit.trusted import UntrustedPath
from dit.web.app import WebConfig
from tests.conftest import REPO, write_scenario
from tests.integration.conftest import StartNnpm

NOBODY = 65534
QUIET = Console(quiet=True)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown to another user")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), terminal_width=200)


def refused(result: Result, path: Path) -> None:
    """Refused with one line naming ``path`` and its owner, never a traceback."""
    text = " ".join(result.output.split())
    assert result.exit_code != 0, result.output
    assert str(path) in text and "owned by nobody (uid 65534)" in text, result.output
    assert "Traceback" not in result.output


def nobodys(path: Path) -> Path:
    """``path`` (made if missing) handed to nobody, as a hostile user would have made it."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, NOBODY, NOBODY)
    return path


def plant_link(link: Path, target: Path) -> None:
    """A symlink at ``link`` owned by nobody."""
    link.symlink_to(target)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)


def must_not_run(what: str) -> Any:
    def run(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(f"{what} ran although its directory is not root's")

    return run


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of root's that a planted link points at."""
    path = tmp_path / "victim"
    path.write_text("root's\n", encoding="utf-8")
    return path


def forged_run(run: Path, pid: int) -> Path:
    """A running run's files naming process ``pid`` (copied from /proc as the attack did), and an
    inventory whose interpreter is the attacker's."""
    run.mkdir(parents=True, exist_ok=True)
    write_json(run / STATUS, {"state": "running", "stage": "profile", "label": "s"})
    write_json(run / DRIVER, {"host": platform.node(), "local": True, "pid": pid, **process_identity(pid)})
    inventory = {"all": {"hosts": {"edge": {"ansible_python_interpreter": "/tmp/theirs.sh"}}}}
    (run / "inventory.yml").write_text(yaml.safe_dump(inventory), encoding="utf-8")
    (run / "journal.jsonl").write_text("", encoding="utf-8")
    return run


# -- 2a: the runs directory (dit run, dit web) ----------------------------------------------------


def test_dit_run_refuses_a_runs_directory_another_user_owns_or_sits_below(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dit.run.driver.Driver.execute", must_not_run("the driver"))
    scenario = write_scenario(tmp_path)
    theirs = nobodys(tmp_path / "theirs")
    for runs in (theirs, theirs / "runs"):  # the runs directory itself, or a directory above it
        result = invoke("run", str(scenario), "--runs-dir", str(runs))
        refused(result, theirs)
        assert "--runs-dir" in result.output and "chown root:root" in result.output
        assert result.exit_code == 2
    assert os.listdir(theirs) == []
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # root's, but anyone may rename what dit makes in it
    result = invoke("run", str(scenario), "--runs-dir", str(shared))
    assert result.exit_code == 2 and "mode 0777" in result.output and str(shared) in result.output


def test_dit_web_refuses_a_runs_directory_another_user_owns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dit.web.app.serve", must_not_run("NNPM"))
    theirs = nobodys(tmp_path / "theirs")
    result = invoke("web", "--runs-dir", str(theirs), "--no-token")
    refused(result, theirs)
    assert result.exit_code == 2


# -- 2b: dit reproduce --out, its resumed runs and its report --------------------------------------


def _finished(runs: Path, name: str, scenario: Scenario) -> Path:
    run = runs / scenario.name / name
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": "completed"}))
    (run / "metadata.json").write_text(json.dumps({"scenario": {"hash": scenario.hash}}))
    return run


def test_dit_reproduce_refuses_an_out_another_user_owns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dit.reproduce.report.reproduce", must_not_run("the chapter"))
    theirs = nobodys(tmp_path / "theirs")
    result = invoke("reproduce", "ch4", "--out", str(theirs))
    refused(result, theirs)
    assert result.exit_code == 2 and "--out" in result.output
    assert os.listdir(theirs) == []


def test_a_finished_variant_in_another_users_directory_is_run_again(tmp_path: Path) -> None:
    rr, sjf = plan("ch4", "quick").variants
    runs = tmp_path / "out" / "runs"
    mine = _finished(runs, "20261204T000000Z-a", rr)
    forged = _finished(runs, "20261204T000001Z-b", sjf)  # status and metadata planted by nobody
    os.chown(forged, NOBODY, NOBODY)
    assert {digest: run.path for digest, (run, _state) in finished_runs(runs).items()} == {rr.hash: mine}


def test_reproduce_replaces_planted_links_and_refuses_another_users_validation_link(
    tmp_path: Path, victim: Path
) -> None:
    out = tmp_path / "ch4"
    out.mkdir()
    os.chmod(out, 0o755)
    plant_link(out / "report.html", victim)
    plant_link(out / "reproduce.json", victim)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant_link(out / "validation", elsewhere)

    def not_run(
        s: Scenario, root: Path, inventory: str | None, console: Console
    ) -> tuple[Path | None, str, str | None]:
        return None, "failed", "not run by this test"

    with pytest.raises(UntrustedPath, match=r"--out .*validation.* a link anyone but root could have made"):
        reproduce("ch4", "quick", out, None, "local mode", QUIET, not_run)
    assert os.listdir(elsewhere) == []
    (out / "validation").unlink()
    target = reproduce("ch4", "quick", out, None, "local mode", QUIET, not_run)
    assert victim.read_text(encoding="utf-8") == "root's\n"
    assert not target.is_symlink() and "Chapter 4" in target.read_text(encoding="utf-8")
    assert json.loads((out / "reproduce.json").read_text(encoding="utf-8"))["chapter"] == "ch4"


# -- 2c: dit note (and the report's output) ----------------------------------------------------------


def test_dit_note_refuses_a_run_directory_another_user_owns(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "runs" / "s" / "20260101T000000Z-0123abcd"
    run.mkdir(parents=True)
    write_json(run / STATUS, {"state": "completed"})
    os.chown(run, NOBODY, NOBODY)
    plant_link(run / "note.md.tmp", victim)
    result = invoke("note", str(run), "measured after the firmware update")
    refused(result, run)
    assert victim.read_text(encoding="utf-8") == "root's\n" and not (run / "note.md").exists()


def test_dit_note_never_writes_through_a_link_at_its_file_names(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "runs" / "s" / "20260101T000000Z-0123abcd"
    run.mkdir(parents=True)
    write_json(run / STATUS, {"state": "completed"})
    (run / "note.md.tmp").symlink_to(victim)  # left there however it came: a name dit once used
    result = invoke("note", str(run), "a note")
    assert result.exit_code == 0, result.output
    assert victim.read_text(encoding="utf-8") == "root's\n"
    assert (run / "note.md").read_text(encoding="utf-8") == "a note\n"
    (run / "note.md").unlink()
    (run / "note.md").symlink_to(victim)
    assert invoke("note", str(run), "again").exit_code == 0
    assert victim.read_text(encoding="utf-8") == "root's\n" and not (run / "note.md").is_symlink()


def _report_run(root: Path, name: str = "20260101T000000Z-abcdef12") -> Path:
    run = root / "fixture_small" / name
    shutil.copytree(REPO / "tests" / "fixtures" / "run_small", run)
    write_json(run / STATUS, {"state": "completed", "label": "fixture_small", "stage_ns": {}})
    return run


def test_dit_report_refuses_an_output_directory_another_user_owns(tmp_path: Path, victim: Path) -> None:
    run = _report_run(tmp_path / "runs")
    theirs = nobodys(tmp_path / "theirs")
    result = invoke("report", str(run), "-o", str(theirs / "report.html"))
    refused(result, theirs)
    assert os.listdir(theirs) == []
    other = _report_run(tmp_path / "runs", "20260101T000001Z-abcdef13")
    result = invoke("report", str(run), str(other), "-o", str(theirs / "compare.html"))
    refused(result, theirs)
    plant_link(run / "report.html", victim)  # a root-owned run directory: the link is replaced
    assert invoke("report", str(run)).exit_code == 0
    assert victim.read_text(encoding="utf-8") == "root's\n" and not (run / "report.html").is_symlink()


# -- 2d: dit stop, and NNPM's Stop ---------------------------------------------------------------------


def test_dit_stop_refuses_a_run_directory_another_user_owns(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    run = forged_run(tmp_path / "runs" / "s" / "20260101T000000Z-0123abcd", sleeper.pid)
    os.chown(run, NOBODY, NOBODY)
    result = invoke("stop", str(run), "--wait", "0.5")
    refused(result, run)
    assert sleeper.poll() is None and not (run / STOP).exists()


def test_nnpm_stop_refuses_a_run_directory_another_user_owns(
    tmp_path: Path, nnpm: StartNnpm, sleeper: subprocess.Popen[bytes]
) -> None:
    runs = tmp_path / "runs"
    run = forged_run(runs / "s" / "20260101T000000Z-0123abcd", sleeper.pid)
    os.chown(run, NOBODY, NOBODY)
    client = nnpm(WebConfig(inventory=tmp_path / "inventory.yml", runs_dir=runs, probe="off"))
    answer = client.post(f"/api/runs/s/{run.name}/stop", json={})
    assert answer.status_code == 409 and str(run) in answer.json()["detail"]
    assert "nobody (uid 65534)" in answer.json()["detail"]
    answer = client.put(f"/api/runs/s/{run.name}/note", json={"text": "theirs"})
    assert answer.status_code == 409 and not (run / "note.md").exists()
    assert sleeper.poll() is None
    assert sorted(os.listdir(run)) == ["driver.json", "inventory.yml", "journal.jsonl", "status.json"]


# -- 2e: dit cleanup ---------------------------------------------------------------------------------


def test_dit_cleanup_refuses_a_run_directory_another_user_owns_before_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dit.run.inventory.inventory_of", must_not_run("reading the inventory"))
    monkeypatch.setattr("dit.run.teardown.teardown", must_not_run("the journal's replay"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    run = forged_run(tmp_path / "runs" / "s" / "20260101T000000Z-0123abcd", os.getpid())
    write_json(run / DRIVER, {"host": platform.node(), "pid": int(dead.stdout)})  # a driver that died
    for theirs in (run, run.parent):  # the run directory, or a directory above it
        os.chown(theirs, NOBODY, NOBODY)
        result = invoke("cleanup", str(run))
        refused(result, theirs)
        assert result.exit_code == 2
        os.chown(theirs, 0, 0)


def test_ordinary_root_owned_runs_still_pass(tmp_path: Path) -> None:
    """The refusals above are about the owner: the same files in root's directories are acted on."""
    run = tmp_path / "runs" / "s" / "20260101T000000Z-0123abcd"
    run.mkdir(parents=True)
    write_json(run / STATUS, {"state": "completed"})
    assert invoke("note", str(run), "kept").exit_code == 0
    assert invoke("note", str(run)).output.strip() == "kept"
