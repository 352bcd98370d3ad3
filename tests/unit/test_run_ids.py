"""Run ids: unique on every node even for runs started in the same second from different runs dirs."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import dit.run.rundir
from dit.run.rundir import RunDir

FROZEN = datetime(2026, 12, 1, 6, 0, 0, tzinfo=UTC)


class _FrozenClock(datetime):
    @classmethod
    def now(cls, tz: object = None) -> datetime:  # type: ignore[override]
        return FROZEN


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dit.run.rundir, "datetime", _FrozenClock)


def test_two_runs_dirs_in_the_same_second_get_different_run_ids(tmp_path: Path, frozen: None) -> None:
    a = RunDir.create(tmp_path / "A", "quickstart", "ab" * 32)
    b = RunDir.create(tmp_path / "B", "quickstart", "ab" * 32)
    assert a.path.name.startswith("20261201T060000Z-abababab")
    assert b.path.name.startswith("20261201T060000Z-abababab")
    assert a.run_id != b.run_id


def test_run_ids_are_safe_for_file_and_cgroup_names(tmp_path: Path, frozen: None) -> None:
    ids = {RunDir.create(tmp_path / f"R{i}", "ch4_validation", "0f" * 32).run_id for i in range(20)}
    assert len(ids) == 20
    for run_id in ids:
        # The cgroup is dit-<run id>-<host>; a file name component must stay well under 255 bytes.
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", run_id), run_id
        assert len(run_id) < 128


def test_the_run_id_still_reads_from_the_directory_name(tmp_path: Path) -> None:
    # Runs made before the random component keep the run id their processes and journal carry.
    old = tmp_path / "quickstart" / "20261201T060000Z-abababab"
    old.mkdir(parents=True)
    assert RunDir(old).run_id == "quickstart-20261201T060000Z-abababab"
