"""The emulated rack's executor without a host: what it journals when a creation fails or finds its
object taken, and which state dirs it refuses (dit.rack.executor)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dit.rack import executor
from dit.rack.executor import Rack, check_state_dir, journal_of
from dit.rack.plan import RackError, RackSpec, Step, bridge_name


def _rack(tmp_path: Path) -> Rack:
    return Rack(RackSpec(state_dir=tmp_path / "rack", devices=1))


def _bridge(rack: Rack) -> Step:
    bridge = bridge_name(rack.spec)
    return Step("controller", "link", {"link": bridge}, ("ip", "link", "add", bridge, "type", "bridge"))


def test_a_creation_whose_command_failed_is_not_left_for_the_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ip link add` failing ("File exists": another rack's bridge) made nothing: rolling back must
    not delete the link of that name."""
    rack = _rack(tmp_path)
    rack.spec.state_dir.mkdir()

    def fail(argv: Sequence[str]) -> None:
        raise RackError(f"{' '.join(argv)}: RTNETLINK answers: File exists")

    monkeypatch.setattr(executor, "_exists", lambda step: False)
    monkeypatch.setattr(executor, "_run", fail)
    with pytest.raises(RackError, match="File exists"):
        rack._take(_bridge(rack))
    journal = journal_of(rack.spec.state_dir)
    assert len(journal.records()) == 2  # journaled before, then closed as undone
    assert journal.pending() == []


def test_an_object_that_exists_already_is_refused_and_never_journaled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rack = _rack(tmp_path)
    rack.spec.state_dir.mkdir()
    ran: list[Sequence[str]] = []
    monkeypatch.setattr(executor, "_exists", lambda step: True)
    monkeypatch.setattr(executor, "_run", ran.append)
    with pytest.raises(RackError, match="not touched"):
        rack._take(_bridge(rack))
    assert ran == [] and journal_of(rack.spec.state_dir).records() == []


def test_a_created_object_stays_pending_for_rack_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rack = _rack(tmp_path)
    rack.spec.state_dir.mkdir()
    monkeypatch.setattr(executor, "_exists", lambda step: False)
    monkeypatch.setattr(executor, "_run", lambda argv: None)
    rack._take(_bridge(rack))
    (pending,) = journal_of(rack.spec.state_dir).pending()
    assert pending.undo == {"link": bridge_name(rack.spec)}


def test_a_state_dir_below_a_world_writable_directory_is_refused_naming_it(tmp_path: Path) -> None:
    # tmp_path is below /tmp (mode 1777): sshd's StrictModes would refuse the rack's keys there.
    world = next(p for p in tmp_path.parents if p.stat().st_mode & 0o002)
    with pytest.raises(RackError) as refused:
        check_state_dir(tmp_path / "rack", building=True)
    assert f"{world} above it" in str(refused.value) and "StrictModes" in str(refused.value)
