"""Node leases: the controller's decision (pure) and the node-side file operations."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from ansible.errors import AnsibleActionFail

from dit.ansible_plugins.lease_action import LeaseAction
from dit.run.lease_decision import (
    BREAK_FLAG,
    Holder,
    State,
    classify,
    controller_holder,
    decide,
    parse_holder,
    process_started_s,
)
from tests.ansible_modules import library_module, module_util, run_in_process

HERE = "controller-a"
HOLDER = Holder(
    run_id="quickstart-20261201T060000Z-abababab-0123abcd",
    controller_host=HERE,
    controller_pid=4242,
    pid_started_s=1_795_000_000.25,
    since_wall_ns=1_795_000_100_000_000_000,
    run_dir="/runs/quickstart/20261201T060000Z-abababab-0123abcd",
)
ME = "quickstart-20261201T060000Z-abababab-ffffffff"
PATH = "/var/lib/dit/lease.json"


def text(holder: Holder) -> str:
    return json.dumps(holder.to_json())


def alive(pid: int) -> float | None:
    return HOLDER.pid_started_s + 0.3 if pid == HOLDER.controller_pid else None


def test_no_lease_file_is_free_and_taken() -> None:
    assert classify(None, ME, HERE, alive) == (State.FREE, None)
    assert decide(State.FREE, None, "edge", PATH, False).take


def test_our_own_lease_is_taken_again_without_breaking_anything() -> None:
    ours = dataclasses.replace(HOLDER, run_id=ME)
    state, found = classify(text(ours), ME, HERE, alive)
    assert state is State.OURS and found == ours
    decision = decide(state, found, "edge", PATH, False)
    assert decision.take and not decision.breaks


def test_a_live_holder_on_this_controller_is_refused_even_with_the_flag() -> None:
    state, found = classify(text(HOLDER), ME, HERE, alive)
    assert state is State.LIVE and found == HOLDER
    for flag in (False, True):
        decision = decide(state, found, "device1", PATH, flag)
        assert not decision.take and not decision.breaks
        assert decision.message is not None
        for part in (
            HOLDER.run_id,
            HERE,
            "pid 4242",
            "since 2026-11-18 11:08:20 UTC",
            HOLDER.run_dir,
            "device1",
        ):
            assert part in decision.message, part


@pytest.mark.parametrize(
    "started",
    [lambda pid: None, lambda pid: HOLDER.pid_started_s + 3600.0],
    ids=["pid gone", "pid reused by a later process"],
)
def test_a_dead_holder_on_this_controller_is_stale_reported_and_broken_only_with_the_flag(
    started: object,
) -> None:
    state, found = classify(text(HOLDER), ME, HERE, started)  # type: ignore[arg-type]
    assert state is State.STALE
    refused = decide(state, found, "edge", PATH, False)
    assert not refused.take and refused.message is not None
    assert "driver is gone" in refused.message and BREAK_FLAG in refused.message
    assert f"dit cleanup {HOLDER.run_dir}" in refused.message
    broken = decide(state, found, "edge", PATH, True)
    assert broken.take and broken.breaks and broken.message and HOLDER.run_id in broken.message


def test_a_holder_on_another_controller_cannot_be_checked_and_needs_the_flag() -> None:
    def never_called(pid: int) -> float | None:
        raise AssertionError("a pid on another controller means nothing here")

    state, found = classify(text(HOLDER), ME, "controller-b", never_called)
    assert state is State.ELSEWHERE
    refused = decide(state, found, "edge", PATH, False)
    assert not refused.take and refused.message is not None
    assert "cannot tell" in refused.message and HERE in refused.message and BREAK_FLAG in refused.message
    assert decide(state, found, "edge", PATH, True).breaks


@pytest.mark.parametrize("content", ["{", "[]", '{"run_id": ""}', '{"run_id": "x"}', "\x00"])
def test_an_unreadable_lease_file_is_refused_and_breakable(content: str) -> None:
    state, found = classify(content, ME, HERE, alive)
    assert (state, found) == (State.UNREADABLE, None)
    refused = decide(state, found, "edge", PATH, False)
    assert not refused.take and refused.message and PATH in refused.message
    assert decide(state, found, "edge", PATH, True).breaks


def test_the_holder_round_trips_and_names_this_process(tmp_path: Path) -> None:
    me = controller_holder(ME, tmp_path)
    assert parse_holder(json.loads(json.dumps(me.to_json()))) == me
    assert me.controller_pid == os.getpid()
    started = process_started_s(os.getpid())
    assert started is not None and abs(started - me.pid_started_s) < 0.01
    # This process, seen from this controller, is a live holder.
    assert classify(json.dumps(me.to_json()), ME + "x", me.controller_host)[0] is State.LIVE


# -- the node side (module_utils/dit_lease_file.py) -------------------------------------------------
def node() -> ModuleType:
    return module_util("dit_lease_file")


def test_take_is_a_compare_and_swap_and_release_only_removes_our_own(tmp_path: Path) -> None:
    lease = node()
    path = str(tmp_path / "dit" / "lease.json")
    a, b = {"run_id": "run-a"}, {"run_id": "run-b"}
    assert lease.take(path, a) is True
    assert lease.take(path, a) is False  # already ours
    with pytest.raises(lease.LeaseError, match="held by run-a"):
        lease.take(path, b)
    with pytest.raises(lease.LeaseError):
        lease.take(path, b, replaces='{"run_id": "run-c"}\n')  # not the lease the controller saw
    assert lease.release(path, "run-b") is False
    assert json.loads(Path(path).read_text())["run_id"] == "run-a"
    current = lease.read_text(path)
    assert lease.take(path, b, replaces=current) is True
    assert lease.release(path, "run-b", check=True) is True and Path(path).exists()
    assert lease.release(path, "run-b") is True and not Path(path).exists()
    assert lease.release(path, "run-b") is False  # twice is harmless
    assert [p.name for p in (tmp_path / "dit").iterdir()] == []  # no temporary file left


def test_release_touches_nothing_but_a_lease_file(tmp_path: Path) -> None:
    lease = node()
    victim = tmp_path / "important.json"
    victim.write_text('{"run_id": "run-a"}')
    with pytest.raises(ValueError, match=r"lease\.json"):
        lease.release(str(victim), "run-a")
    assert victim.exists()


# -- the race: two runs both find the node free ------------------------------------------------
def run_lease_module(args: dict[str, Any]) -> dict[str, Any]:
    """library/dit_lease.py in this process, as the action plugin would have it run on the node."""
    return run_in_process(library_module("dit_lease"), args)


def _lease_action(
    tmp_path: Path, args: dict[str, Any], on_take: Any = None, check_mode: bool = False
) -> tuple[LeaseAction, list[bool], dict[str, Any]]:
    calls: list[bool] = []

    def execute_module(module_name: str, module_args: dict[str, Any], task_vars: dict[str, Any]) -> Any:
        assert module_name == "dit_lease" and "seen" not in module_args  # the plugin's, never the node's
        calls.append(bool(module_args.get("_dit_plan")))
        if on_take is not None and not module_args.get("_dit_plan"):
            on_take()
        return run_lease_module(module_args)

    task = SimpleNamespace(args=args, action="dit_lease", async_val=0, check_mode=False)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))
    action = LeaseAction(task, connection, SimpleNamespace(check_mode=check_mode), None, None)
    action._execute_module = execute_module
    task_vars = {"inventory_hostname": "device1", "dit_journal_path": str(tmp_path / "journal.jsonl")}
    return action, calls, task_vars


@pytest.mark.parametrize(
    ("seen", "want_calls"),
    [(None, [True, False]), ({"lease": None}, [False])],
    ids=["read-by-its-plan", "read-by-the-facts"],
)
def test_the_loser_of_a_race_for_a_free_node_gets_the_full_refusal(
    tmp_path: Path, seen: dict[str, Any] | None, want_calls: list[bool]
) -> None:
    """Whether its own plan call or preflight's facts call found the node free, the take meets the
    winner's lease (the compare-and-swap) and the run gets the refusal it would have got first."""
    path = tmp_path / "dit" / "lease.json"
    # The winner: a live driver on this controller host (this process, under another run id).
    winner = controller_holder("quickstart-20261201T060000Z-abababab-0badf00d", tmp_path / "runs" / "winner")
    loser = controller_holder(ME, tmp_path / "runs" / "loser")
    args = {"path": str(path), "run_id": ME, "holder": loser.to_json(), "break_stale": True}
    if seen is not None:
        args["seen"] = seen

    def winner_takes() -> None:  # the winner's take lands between this run's look and its own take
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(winner.to_json()))

    action, calls, task_vars = _lease_action(tmp_path, args, on_take=winner_takes)

    result = action.run(task_vars=task_vars)

    assert calls == want_calls  # the node was found free; the take met the winner's lease
    assert result["failed"] and result["lease_state"] == "live"
    message = result["msg"]
    refusal = decide(State.LIVE, winner, "device1", str(path), False).message
    assert message == refusal  # the very message of a run that found the winner's lease first
    for part in (
        f"node device1 is leased by run {winner.run_id}",
        f"controller {winner.controller_host}",
        f"pid {os.getpid()}",
        f"since {winner.to_json()['since']}",
        f"run directory {winner.run_dir}",
        f"wait for it or 'dit stop {winner.run_dir}'",
    ):
        assert part in message, part
    assert json.loads(path.read_text())["run_id"] == winner.run_id  # never broken: it was not reviewed


# -- the lease preflight's facts task read: the decision without a plan call -------------------
def test_a_lease_the_facts_read_is_decided_on_and_taken_in_one_module_call(tmp_path: Path) -> None:
    from dit.run.journal import Journal

    path = tmp_path / "dit" / "lease.json"
    me = controller_holder(ME, tmp_path / "runs" / "me")
    args = {"path": str(path), "run_id": ME, "holder": me.to_json(), "seen": {"lease": None}}
    planned = run_lease_module({**{k: v for k, v in args.items() if k != "seen"}, "_dit_plan": True})
    dry, calls, task_vars = _lease_action(tmp_path, args, check_mode=True)
    looked = dry.run(task_vars=task_vars)  # a dry run: what it would change, from what the facts read
    assert calls == [] and looked["changed"] is True and looked["diff"] == planned["diff"]
    assert not path.exists() and not (tmp_path / "journal.jsonl").exists()
    action, calls, task_vars = _lease_action(tmp_path, args)

    result = action.run(task_vars=task_vars)

    assert calls == [False] and not result.get("failed"), result  # no plan call: the take alone
    assert json.loads(path.read_text())["run_id"] == ME
    (record,) = Journal(tmp_path / "journal.jsonl").records()  # journaled before the take, as planned
    assert record["op"] == "lease" and record["undo"] == {"path": str(path), "run_id": ME}
    again, calls, task_vars = _lease_action(tmp_path, {**args, "seen": {"lease": path.read_text()}})
    held = again.run(task_vars=task_vars)
    assert calls == [] and held["changed"] is False and not held.get("failed")  # ours already: no call
    assert len(Journal(tmp_path / "journal.jsonl").records()) == 1  # and nothing more to undo


def test_a_live_holder_the_facts_saw_is_refused_with_no_module_call_and_nothing_journaled(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dit" / "lease.json"
    winner = controller_holder("quickstart-20261201T060000Z-abababab-0badf00d", tmp_path / "runs" / "winner")
    seen = json.dumps(winner.to_json())
    me = controller_holder(ME, tmp_path / "runs" / "me")
    args = {
        "path": str(path),
        "run_id": ME,
        "holder": me.to_json(),
        "seen": {"lease": seen},
        "break_stale": True,
    }
    action, calls, task_vars = _lease_action(tmp_path, args)

    with pytest.raises(AnsibleActionFail) as refused:
        action.run(task_vars=task_vars)

    assert (
        calls == [] and str(refused.value) == decide(State.LIVE, winner, "device1", str(path), False).message
    )
    assert not (tmp_path / "journal.jsonl").exists() and not path.exists()


@pytest.mark.parametrize(
    "found",
    [
        None,
        "ours",  # this run's complete lease
        json.dumps({"run_id": ME}),  # this run's id, not a complete holder
        "theirs",
        '{"run_id": ""}',
        "not json",
        "[1, 2]",
    ],
)
def test_the_plan_from_the_facts_read_is_the_module_s_own_plan(tmp_path: Path, found: str | None) -> None:
    """The action's plan from the lease the facts read and the module's plan mode over the same file
    agree on every content: what is journaled, whether it changes, the diff a dry run shows (the node
    side's run_id_of and the controller's named_run_id read a lease's run id alike)."""
    path = tmp_path / "dit" / "lease.json"
    me = controller_holder(ME, tmp_path / "runs" / "me")
    other = controller_holder("quickstart-20261201T060000Z-abababab-0badf00d", tmp_path / "runs" / "other")
    content = {"ours": json.dumps(me.to_json()), "theirs": json.dumps(other.to_json())}.get(str(found), found)
    if content is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    args = {"path": str(path), "run_id": ME, "holder": me.to_json()}
    planned = run_lease_module({**args, "_dit_plan": True})
    action, calls, _ = _lease_action(tmp_path, {**args, "seen": {"lease": content}})
    known = action.known_plan(dict(action._task.args), {})
    assert known is not None and calls == []
    assert {k: known[k] for k in ("changed", "current", "journal", "diff")} == {
        k: planned[k] for k in ("changed", "current", "journal", "diff")
    }
