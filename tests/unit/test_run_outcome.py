"""Issue 36 item 3: a stopped or refused run says what happened, not "no inference ran (a benchmark)"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dit.report import labels
from dit.report.build import build_report
from dit.web.services import runs as runs_mod
from tests.conftest import REPO

HELD = (
    "preflight: device1: node device1 is leased by run 20261201T100000Z-aaaaaaaa (controller lab, pid 7, "
    "since 2026-12-01 10:00 UTC, run directory /runs/x), which is still running: wait for it or 'dit stop /runs/x'"
)


def test_run_outcome_names_the_stage_and_the_lease() -> None:
    stopped = {"state": "stopped", "error": "stopped by SIGINT", "ended_stage": "apply",
               "stage_ns": {"preflight": 5, "teardown": 7}}  # fmt: skip
    assert labels.run_outcome(stopped) == (
        "Stopped by the user (Ctrl-C) at the apply stage: the stages after it did not run."
    )
    # a run written before the driver recorded ended_stage: the stage after the last that ended
    legacy = {
        "state": "stopped",
        "error": "stopped by SIGTERM",
        "stage_ns": {"preflight": 5, "apply": 6, "teardown": 7},
    }
    assert (labels.run_outcome(legacy) or "").startswith("Stopped by SIGTERM at the profile stage")
    refused = labels.run_outcome({"state": "failed", "error": HELD, "ended_stage": "preflight"}) or ""
    assert refused.startswith("Refused by a node's lease during the preflight stage: ")
    assert "is leased by run 20261201T100000Z-aaaaaaaa" in refused
    failed = {"state": "failed", "error": "apply: device2 unreachable", "ended_stage": "apply"}
    assert labels.run_outcome(failed) == "Failed during the apply stage: apply: device2 unreachable."
    assert labels.run_outcome({"state": "completed", "stage_ns": {}}) is None
    assert labels.run_outcome({"state": "degraded"}) is None


def _stopped_run(target: Path) -> Path:
    shutil.copytree(REPO / "tests" / "fixtures" / "run_small", target)
    status = {"state": "stopped", "label": "small", "error": "stopped by SIGINT", "ended_stage": "apply",
              "stage_ns": {"preflight": 1_960_000_000, "teardown": 2_100_000_000}}  # fmt: skip
    (target / "status.json").write_text(json.dumps(status))
    (target / "metadata.json").write_text(json.dumps({"mode": "local", "scenario": {"label": "small"}}))
    return target


def test_report_and_run_page_say_the_run_stopped(tmp_path: Path) -> None:
    run = _stopped_run(tmp_path / "runs" / "small" / "20261201T100000Z-cccccccc")
    html = build_report(run)
    phases = html[html.index('<section id="phases">') :]
    phases = phases[: phases.index("</section>")]
    assert "Stopped by the user (Ctrl-C) at the apply stage" in phases
    assert "No inference ran" not in phases
    from dit.run.rundir import RunDir
    from dit.web.services.store import Store

    detail = runs_mod.run_detail(RunDir(run), tmp_path / "runs", Store(tmp_path / "store.db"))
    assert (detail["outcome_note"] or "").startswith("Stopped by the user (Ctrl-C) at the apply stage")
    assert detail["inference_ran"] is False


def test_dit_show_says_the_run_stopped_in_one_sentence(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dit.cli import app

    run = _stopped_run(tmp_path / "runs" / "small" / "20261201T100000Z-cccccccc")
    shown = CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "Stopped by the user (Ctrl-C) at the apply stage: the stages after it did not run." in text
    assert "stopped by SIGINT" not in text  # the sentence says it: the raw reason is not printed beside it
