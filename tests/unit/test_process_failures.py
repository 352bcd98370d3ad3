"""The controller's reading of the nodes' process records, and how a degraded run is shown (issue 10, item 7)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dit.cli import app
from dit.run.procs import ProcessFailure, process_failures
from dit.run.rundir import RunDir


def _records(raw: Path, host: str, entries: object) -> None:
    (raw / host).mkdir(parents=True)
    (raw / host / f"{host}_processes.json").write_text(json.dumps(entries), encoding="utf-8")


def test_failures_come_from_every_node_and_only_failed_entries_count(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _records(
        raw,
        "device1",
        [
            {"tag": "load", "state": "running", "failed": False},
            {
                "tag": "monitor",
                "state": "exited",
                "exit_code": 3,
                "error": "boom",
                "failed": True,
                "stderr_tail": ["Traceback", "boom"],
            },
        ],
    )
    _records(raw, "device2", [{"tag": "power", "state": "vanished", "exit_code": None, "failed": True}])
    _records(raw, "edge", {"not": "a list"})
    failures = process_failures(raw, ["device1", "device2", "edge", "device3"])  # device3: not collected
    assert failures == [
        ProcessFailure("device1", "monitor", "exited", 3, "boom", ("Traceback", "boom")),
        ProcessFailure("device2", "power", "vanished", None, None, ()),
        ProcessFailure("edge", "process check", "unreadable", None, failures[2].error, ()),
    ]
    assert failures[0].describe() == "device1: monitor exited with code 3 (boom)"
    assert failures[1].describe() == "device2: power ended without an exit code"
    assert failures[2].describe().startswith("edge: the device process records are unreadable")
    assert failures[0].to_dict()["stderr_tail"] == ["Traceback", "boom"]


def test_show_prints_a_degraded_run_with_its_reasons_and_stderr(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "s" / "run1")
    run.path.mkdir(parents=True)
    failure = ProcessFailure(
        "device1", "monitor", "exited", 3, "monitor returned exit code 3", ("oops: sensor",)
    )
    run.set_status(
        state="degraded", label="s", error=failure.describe(), degraded=[failure.to_dict()], stage_ns={}
    )
    result = CliRunner().invoke(app, ["show", str(run.path)])
    assert result.exit_code == 0, result.output
    assert "degraded" in result.output
    assert "device1: monitor exited with code 3" in result.output
    assert "oops: sensor" in result.output
    listed = CliRunner().invoke(app, ["ls", "--runs-dir", str(tmp_path)])
    assert "degraded" in listed.output


def test_nnpm_lists_a_degraded_run_as_finished_with_its_failed_processes(tmp_path: Path) -> None:
    from dit.web.services.runs import run_detail
    from dit.web.services.store import Store

    runs = tmp_path / "runs"
    run = RunDir(runs / "s" / "run1")
    run.path.mkdir(parents=True)
    failure = ProcessFailure("device2", "power", "vanished", None, None, ("killed",))
    run.set_status(
        state="degraded", label="s", error=failure.describe(), degraded=[failure.to_dict()], stage_ns={}
    )
    detail = run_detail(run, runs, Store(tmp_path / "nnpm.sqlite"))
    assert detail["state"] == "degraded" and detail["finished"]
    assert detail["degraded"] == [failure.to_dict()]
    assert detail["error"] == "device2: power ended without an exit code"
