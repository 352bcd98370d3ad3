"""The controller's side of the edge channel's key (issue 46, item 3): a new 0600 key per run, named in
the edge service's config, and the refusals the edge counted made into what the user reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dit.device.protocol import KEY_FILE, read_key
from dit.run import profile
from dit.run.collect import edge_channel, edge_channel_warning
from dit.scenario import expand
from tests.unit.test_runtimes import BASE


def test_each_run_gets_its_own_private_key(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first, second = profile.write_run_key(one), profile.write_run_key(two)
    assert first == one / KEY_FILE
    assert os.stat(first).st_mode & 0o777 == 0o600
    assert len(read_key(first)) == 32
    assert read_key(first) != read_key(second)


def test_a_planted_link_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / KEY_FILE).symlink_to(victim)
    profile.write_run_key(tmp_path / "d")
    assert victim.read_text() == "root's\n"
    assert not (tmp_path / "d" / KEY_FILE).is_symlink()


def test_the_edge_config_names_the_key_file() -> None:
    (scenario,) = expand(dict(BASE))
    cfg = profile.edge_config(scenario, "r1", {}, None, "/var/lib/dit/r1")
    assert cfg["key_file"] == "/var/lib/dit/r1/edge.key"


def _summary(tmp_path: Path, doc: dict[str, object]) -> Path:
    (tmp_path / "edge").mkdir(exist_ok=True)
    (tmp_path / "edge" / "edge_edge_summary.json").write_text(json.dumps(doc))
    return tmp_path


@pytest.mark.parametrize(
    ("doc", "record", "warning"),
    [
        (
            {"authenticated": True, "refused_frames": 0, "refused": {}},
            {"authenticated": True, "refused_frames": 0, "refused": {}},
            None,
        ),
        (
            {"authenticated": True, "refused_frames": 3, "refused": {"unsigned": 2, "bad_mac": 1}},
            {"authenticated": True, "refused_frames": 3, "refused": {"unsigned": 2, "bad_mac": 1}},
            "the edge service refused 3 frames (bad_mac 1, unsigned 2) that the run's key did not verify",
        ),
        (  # an edge service of before the key: it said nothing of its channel
            {"completed_requests": 4},
            {"authenticated": False, "refused_frames": 0, "refused": {}},
            "the edge service ran without the run's key",
        ),
    ],
)
def test_the_refusals_reach_the_user(
    tmp_path: Path, doc: dict[str, object], record: dict[str, object], warning: str | None
) -> None:
    channel = edge_channel(_summary(tmp_path, doc), "edge")
    assert channel == record
    said = edge_channel_warning(channel)
    assert said == warning if warning is None else said is not None and said.startswith(warning)


def test_no_summary_no_record(tmp_path: Path) -> None:
    assert edge_channel(tmp_path, "edge") is None


@pytest.mark.parametrize(
    "channel",
    [None, "x", {"authenticated": True}, {"authenticated": True, "refused_frames": "many", "refused": {}}],
)
def test_a_malformed_record_is_said_not_raised(channel: object) -> None:
    said = edge_channel_warning(channel)
    assert said is None if not isinstance(channel, dict) else said is not None and "not a record" in said
