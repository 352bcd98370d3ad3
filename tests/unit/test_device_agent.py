"""The device agent: the timed start, profile command outputs, config errors, stdlib-only imports."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dit.device import agent

TINY = {"name": "fake", "builder": "dit.device.fakemodel:build", "params": {"profile": "tiny"}, "seed": 1}
SRC = Path(__file__).resolve().parents[2] / "src"


def write(tmp: Path, cfg: dict[str, Any]) -> Path:
    path = tmp / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def profile_cfg(tmp: Path, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "run_id": "run-7",
        "host": "device1",
        "start_at_ns": time.time_ns() + 50_000_000,
        "model": TINY,
        "repetitions": 3,
        "warmup": 1,
        "inference": {"enabled": False},
        "results_dir": str(tmp / "out"),
        "threads": 2,
    }
    cfg.update(over)
    return cfg


def test_sleep_until_spins_only_at_the_end() -> None:
    now = [0]
    sleeps: list[float] = []

    def clock() -> int:
        now[0] += 100_000  # each read: +0.1 ms
        return now[0]

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += int(s * 1e9)

    orig = agent.time.sleep
    agent.time.sleep = fake_sleep
    try:
        agent.sleep_until(1_000_000_000, clock=clock)
    finally:
        agent.time.sleep = orig
    assert now[0] >= 1_000_000_000
    assert len(sleeps) >= 1 and sum(sleeps) < 1.0  # one coarse sleep, then ~2 ms of spinning
    agent.sleep_until(0)  # already past: returns at once


def test_the_start_instant_comes_from_the_profile_stage_when_the_config_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIT_RUN_ID", raising=False)
    start_at = time.time_ns() + 50_000_000
    monkeypatch.setenv("DIT_START_AT_NS", str(start_at))
    cfg = profile_cfg(tmp_path)
    del cfg["start_at_ns"]
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == 0
    origin = json.loads((tmp_path / "out" / "origin.json").read_text())
    assert origin["start_at_ns"] == start_at
    assert origin["lateness_ns"] == origin["origin_wall_ns"] - start_at >= 0
    monkeypatch.setenv("DIT_START_AT_NS", "soon")
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == agent.EXIT_CONFIG


def test_profile_command_writes_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIT_RUN_ID", raising=False)
    cfg = profile_cfg(tmp_path)
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == 0
    out = tmp_path / "out"
    origin = json.loads((out / "origin.json").read_text())
    assert set(origin) == {"host", "run_id", "start_at_ns", "origin_wall_ns", "origin_mono_ns", "lateness_ns"}
    assert origin["lateness_ns"] == origin["origin_wall_ns"] - cfg["start_at_ns"] >= 0
    with open(out / "layers.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 5 and all(int(r["start_ns"]) >= 0 for r in rows)
    done = json.loads((out / "done.json").read_text())
    assert done["status"] == "ok" and done["profile"]["warmup"] == 1 and done["threads"] == 2
    assert done["inference"] == {"enabled": False}
    assert json.loads((out / "profile_summary.json").read_text())["warmup"] == 1
    assert not (out / "inference.csv").exists()
    assert os.environ["DIT_RUN_ID"] == "run-7" and os.environ["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"model": {"name": "alexnet"}}, "model.builder: is required"),
        ({"threads": 0}, "threads: 0 is not a positive integer"),
        ({"start_at_ns": "soon"}, "start_at_ns"),
        (
            {"inference": {"enabled": True, "vectors": [[0, 9]], "device_index": 1, "edge": {}}},
            r"\[0\]\[1\]: 9 is outside 0..4",
        ),
        (
            {"inference": {"enabled": True, "vectors": [[0]], "device_index": 0}},
            "inference.edge: is required",
        ),
        ({"repetitions": -1}, "repetitions: -1 is less than 0"),
    ],
)
def test_config_errors_exit_2_and_name_the_field(
    tmp_path: Path, over: dict[str, Any], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = profile_cfg(tmp_path, **over)
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == agent.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "config error" in err
    assert re.search(match, err), err
    assert json.loads((tmp_path / "out" / "error.json").read_text())["kind"] == "config"


def test_missing_config_file(tmp_path: Path) -> None:
    assert agent.main(["profile", "--config", str(tmp_path / "nope.json")]) == agent.EXIT_CONFIG


def test_device_package_imports_only_the_standard_library() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import dit.device.agent, dit.device.edge, dit.device.client, dit.device.profiler,"
        " dit.device.fakemodel, dit.device.protocol, dit.device.build, dit.device.common;"
        "top = {m.split('.')[0] for m in sys.modules};"
        "bad = sorted(top - set(sys.stdlib_module_names) - {'dit', '__main__'});"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(SRC)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
