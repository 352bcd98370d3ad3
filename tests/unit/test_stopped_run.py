"""Issue 49 item 4: a stopped run shows what it kept (the files fetched before the stop, aggregated as far
as they go) and says the user stopped it at which stage, not "error: stopped by SIGTERM"."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from dit.analysis.run import LoadedRun
from dit.report import labels
from dit.report.build import build_report
from dit.run import analyse
from dit.run.rundir import RunDir
from dit.run.stop import USER_STOP, StopRequests
from dit.runtime_api import registry
from dit.web.services import runs as runs_mod
from dit.web.services.store import Store
from tests.conftest import REPO


def test_a_signal_after_dit_stops_request_is_the_user_stopping() -> None:
    """``dit stop`` (and NNPM's Stop) writes its request file, then sends SIGTERM: the reason is the user."""
    for requested, reason in ((True, USER_STOP), (False, "SIGTERM")):
        stop = StopRequests(lambda requested=requested: requested, lambda _text: None)
        with stop.signals():
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.reason == reason


def _stopped(target: Path, stage: str = "profile", error: str = f"stopped by {USER_STOP}") -> Path:
    shutil.copytree(REPO / "tests" / "fixtures" / "run_small", target)
    status = {"state": "stopped", "label": "small", "error": error, "ended_stage": stage,
              "stage_ns": {"preflight": 1_960_000_000, "apply": 2_000_000_000, "teardown": 2_100_000_000}}  # fmt: skip
    (target / "status.json").write_text(json.dumps(status))
    (target / "metadata.json").write_text(json.dumps({"mode": "local", "scenario": {"label": "small"}}))
    return target


def _keep(run: Path) -> dict[str, object]:
    kept = analyse.aggregate_kept(LoadedRun(run), registry.get("layers"))
    RunDir(run).set_status(kept=kept)
    return kept


def test_the_outcome_says_the_user_stopped_it_at_its_stage() -> None:
    status = {"state": "stopped", "error": f"stopped by {USER_STOP}", "ended_stage": "profile"}
    assert labels.run_outcome(status) == (
        "Stopped by the user (dit stop or NNPM's Stop) at the profile stage: the stages after it did not run."
    )
    ctrl_c = labels.run_outcome({**status, "error": "stopped by SIGINT", "ended_stage": "apply"}) or ""
    assert ctrl_c.startswith("Stopped by the user (Ctrl-C) at the apply stage")
    assert (labels.run_outcome({**status, "error": "stopped by SIGTERM"}) or "").startswith(
        "Stopped by SIGTERM at the profile stage"
    )


def test_a_stopped_runs_kept_files_are_aggregated_and_shown_on_its_page(tmp_path: Path) -> None:
    run = _stopped(tmp_path / "runs" / "small" / "20261201T100000Z-cccccccc")
    kept = _keep(run)
    assert "layers results" in kept["aggregated"] and kept["not_aggregated"] == {}
    assert (run / "aggregate" / "phases_summary.csv").is_file()
    detail = runs_mod.run_detail(RunDir(run), tmp_path / "runs", Store(tmp_path / "store.db"))
    assert detail["inference_ran"] is True  # the phases measured before the stop are in the table
    assert detail["phases"]["rows"]
    assert detail["kept_files"]["device1"] == sorted(p.name for p in (run / "raw" / "device1").iterdir())
    note = detail["kept_note"] or ""
    assert note.startswith(
        "Kept from before the stop: 13 file(s) fetched into raw/ (device1: 5, device2: 4, edge: 4)"
    )
    assert "aggregated from them: monitors, power models, layers results" in note
    html = build_report(run)
    facts = html[html.index('<section id="facts">') : html.index("</section>")]
    assert "Stopped by the user (dit stop or NNPM&#39;s Stop) at the profile stage" in facts
    assert "Kept from before the stop: 13 file(s)" in facts
    assert ">error<" not in facts  # a stop is not shown as an error
    phases = html[html.index('<section id="phases">') :]
    assert "device1" in phases[: phases.index("</section>")]


def test_a_step_the_stop_cut_short_is_named_and_the_rest_still_aggregate(tmp_path: Path) -> None:
    run = _stopped(tmp_path / "runs" / "small" / "20261201T100000Z-dddddddd")
    (run / "raw" / "device2" / "device2_layers.csv").unlink()  # device2 never finished profiling
    kept = _keep(run)
    assert kept["aggregated"][:2] == ["monitors", "power models"]
    why = kept["not_aggregated"]["layers results"]  # type: ignore[index]
    assert "device2_layers.csv is missing" in why
    status = RunDir(run).status()
    note = labels.kept_text(run, status) or ""
    assert "12 file(s)" in note and "not aggregated: layers results (" in note
    assert labels.kept_text(run, {**status, "state": "completed"}) is None
