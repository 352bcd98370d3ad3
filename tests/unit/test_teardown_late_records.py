"""Teardown undoes a change journaled after it read the journal (a task still running as a stop arrived)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dit.run import teardown as stages_teardown
from dit.run.ansible_exec import HostEvent, StageOutcome
from dit.run.inventory import RunInventory
from dit.run.journal import Journal
from dit.run.rundir import RunDir


def test_a_record_journaled_during_the_replay_gets_a_second_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunDir.create(tmp_path / "runs", "late", "0" * 64)
    journal = Journal(run.journal)
    (early,) = journal.record_changes(
        "device1", [{"op": "lease", "undo": {"path": "/x/lease.json"}}], "dit_lease"
    )
    inventory = RunInventory(str(tmp_path / "inventory.yml"), True, "edge", ("device1",), "127.0.0.1", {})
    sent: list[dict[str, Any]] = []

    def playbook(
        run: RunDir, inventory: RunInventory, extravars: dict[str, Any], on_event: Any, notes: list[str]
    ) -> StageOutcome:
        undo = extravars["dit_undo"]
        sent.append(undo)
        if len(sent) == 1:  # the stage's late task journals its change while the first replay runs
            journal.record_changes(
                "device1", [{"op": "lease", "undo": {"path": "/y/lease.json"}}], "dit_lease"
            )
        ids = [r["id"] for records in undo.values() for r in records]
        on_event(HostEvent("device1", "ansible", "changed", "replay", "dit_restore", {"undone": ids}))
        return StageOutcome("teardown", "successful", 0)

    monkeypatch.setattr(stages_teardown, "_teardown_playbook", playbook)
    monkeypatch.setattr(stages_teardown, "run_processes", lambda run_id: [])
    error, _ = stages_teardown.teardown(run, inventory, None)
    assert [r["id"] for r in sent[0]["device1"]] == [early]
    assert len(sent) == 2 and [r["undo"]["path"] for r in sent[1]["device1"]] == ["/y/lease.json"]
    assert journal.pending() == [] and error is None, error


@pytest.mark.parametrize(
    ("status", "own_playbook"),
    [("successful", False), ("failed", False), ("canceled", True), ("error", True), (None, True)],
)
def test_a_completed_runs_teardown_plays_in_its_session_unless_the_session_cannot_finish_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str | None, own_playbook: bool
) -> None:
    """Issue 48: the first pass runs where the stage session's playbook waits for it (no ansible-playbook
    start of its own); a session that cannot run it (None) or whose playbook ended otherwise than
    successful or failed (cancelled, ansible-runner's own error) leaves the same undo to a playbook of its
    own: nothing stays pending either way."""
    run = RunDir.create(tmp_path / "runs", "insession", "0" * 64)
    journal = Journal(run.journal)
    (change,) = journal.record_changes(
        "device1", [{"op": "lease", "undo": {"path": "/x/lease.json"}}], "dit_lease"
    )
    inventory = RunInventory(str(tmp_path / "inventory.yml"), True, "edge", ("device1",), "127.0.0.1", {})
    played: list[str] = []

    def undo_all(extravars: dict[str, Any], on_event: Any) -> None:
        ids = [r["id"] for records in extravars["dit_undo"].values() for r in records]
        on_event(HostEvent("device1", "ansible", "changed", "replay", "dit_restore", {"undone": ids}))

    def in_session(extravars: dict[str, Any], on_event: Any) -> StageOutcome | None:
        played.append("session")
        if status is None:
            return None  # the session's playbook does not wait for teardown: nothing ran
        if status in ("successful", "failed"):
            undo_all(extravars, on_event)
        return StageOutcome("teardown", status, 0 if status == "successful" else 2)

    def playbook(
        run: RunDir, inventory: RunInventory, extravars: dict[str, Any], on_event: Any, notes: list[str]
    ) -> StageOutcome:
        played.append("own")
        assert [r["id"] for r in extravars["dit_undo"]["device1"]] == [change]  # the same undo
        undo_all(extravars, on_event)
        return StageOutcome("teardown", "successful", 0)

    monkeypatch.setattr(stages_teardown, "_teardown_playbook", playbook)
    monkeypatch.setattr(stages_teardown, "run_processes", lambda run_id: [])
    error, _ = stages_teardown.teardown(run, inventory, None, in_session=in_session)
    assert played == (["session", "own"] if own_playbook else ["session"])
    assert journal.pending() == []
    assert (error is None) == (status != "failed"), error  # a failed play is said, not played again


def test_a_session_that_cannot_run_teardown_is_closed_before_teardown_runs_on_its_own() -> None:
    """Only a completed run's teardown is handed to its session; one the session declines (it waits for
    another stage, or a variable would change) closes it first: no stage playbook waits beside teardown's."""
    calls: list[str] = []

    class Session:
        def hand_over(self, stage: str, extravars: dict[str, Any], on_event: Any) -> None:
            calls.append(f"hand_over {stage}")

        def close(self) -> None:
            calls.append("close")

    session: Any = Session()
    assert stages_teardown.teardown_in_session(session, "failed") is None
    assert stages_teardown.teardown_in_session(None, "completed") is None
    in_session = stages_teardown.teardown_in_session(session, "completed")
    assert in_session is not None and calls == []
    assert in_session({}, lambda event: None) is None
    assert calls == ["hand_over teardown", "close"]
