"""The delay schedule (pure) and the netem-vary device command in dry-run mode."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dit.device.agent import main as agent_main
from dit.device.netem_vary import change_argv, format_ms, schedule

UNIFORM = {"kind": "uniform", "low_ms": 10, "high_ms": 30, "interval_s": 5}
SQUARE = {"kind": "square", "low_ms": 5, "high_ms": 45, "period_s": 8}
TEMPLATE = [
    "tc",
    "qdisc",
    "change",
    "dev",
    "wlan0",
    "root",
    "handle",
    "1:",
    "netem",
    "delay",
    "{delay}",
    "2ms",
]


def test_uniform_draws_every_interval_from_the_seed_and_device() -> None:
    steps = schedule(UNIFORM, 2024, "device1", 50)
    assert [s.offset_ns for s in steps[:3]] == [0, 5_000_000_000, 10_000_000_000]
    rng = random.Random("2024:device1")
    assert [s.delay_ms for s in steps] == [round(rng.uniform(10, 30) * 1000) / 1000 for _ in range(50)]
    assert all(10 <= s.delay_ms <= 30 for s in steps)
    # Repeatable, and independent per device and per seed.
    assert schedule(UNIFORM, 2024, "device1", 50) == steps
    assert [s.delay_ms for s in schedule(UNIFORM, 2024, "device2", 50)] != [s.delay_ms for s in steps]
    assert [s.delay_ms for s in schedule(UNIFORM, 2025, "device1", 50)] != [s.delay_ms for s in steps]


def test_square_alternates_low_and_high_every_half_period() -> None:
    steps = schedule(SQUARE, 1, "device1", 4)
    assert [(s.offset_ns, s.delay_ms) for s in steps] == [
        (0, 5.0),
        (4_000_000_000, 45.0),
        (8_000_000_000, 5.0),
        (12_000_000_000, 45.0),
    ]


def test_schedule_errors() -> None:
    with pytest.raises(ValueError, match="low_ms"):
        schedule({**SQUARE, "low_ms": 50}, 1, "d", 1)
    with pytest.raises(ValueError, match="no schedule"):
        schedule({"kind": "constant", "low_ms": 1, "high_ms": 2}, 1, "d", 1)


def test_change_argv_substitutes_the_delay() -> None:
    assert change_argv(TEMPLATE, 12.3456)[-3:] == ["delay", "12.346ms", "2ms"]
    assert format_ms(20) == "20ms" and format_ms(0.5) == "0.5ms"
    with pytest.raises(ValueError, match="exactly once"):
        change_argv(["tc", "qdisc"], 1.0)


def test_the_command_records_each_change_in_dry_run(tmp_path: Path) -> None:
    results, log = tmp_path / "results", tmp_path / "tc.jsonl"
    config = {
        "run_id": "r1",
        "host": "device1",
        "device": "device1",
        "seed": 7,
        "results_dir": str(results),
        "ready_file": str(tmp_path / "netem-vary.ready"),
        "variation": {"kind": "square", "low_ms": 5, "high_ms": 45, "period_s": 0.02},
        "template": TEMPLATE,
        "dry_run": True,
        "log": str(log),
        "max_steps": 4,
    }
    path = tmp_path / "netem-vary.json"
    path.write_text(json.dumps(config))
    assert agent_main(["netem-vary", "--config", str(path)]) == 0
    rows = list(csv.DictReader((results / "netem_changes.csv").open()))
    assert [r["step"] for r in rows] == ["0", "1", "2", "3"]
    assert [float(r["delay_ms"]) for r in rows] == [5, 45, 5, 45]
    assert all(r["ok"] == "1" and r["dry_run"] == "1" for r in rows)
    times = [int(r["t_mono_ns"]) for r in rows]
    assert times == sorted(times) and len(set(times)) == 4
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["argv"] for r in records] == [change_argv(TEMPLATE, d) for d in (5, 45, 5, 45)]
    assert [r["t_mono_ns"] for r in records] == times
    ready = json.loads((tmp_path / "netem-vary.ready").read_text())
    assert ready["delay_ms"] == 5


def test_a_bad_config_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"host": "d", "results_dir": str(tmp_path), "variation": UNIFORM,
                                "template": ["tc"], "dry_run": True, "log": str(tmp_path / "l")}))  # fmt: skip
    assert agent_main(["netem-vary", "--config", str(path)]) == 2


def test_sigterm_ends_the_command_at_once_as_a_clean_stop(tmp_path: Path) -> None:
    """Teardown's SIGTERM is a stop, not a failure: exit 0 (it used to die of the signal, -15)."""
    results, log, ready = tmp_path / "results", tmp_path / "tc.jsonl", tmp_path / "netem-vary.ready"
    config = {
        "run_id": "r1",
        "host": "device1",
        "results_dir": str(results),
        "ready_file": str(ready),
        "variation": {"kind": "square", "low_ms": 5, "high_ms": 45, "period_s": 600},
        "template": TEMPLATE,
        "dry_run": True,
        "log": str(log),
    }
    path = tmp_path / "netem-vary.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dit.device", "netem-vary", "--config", str(path)], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - sent < 5  # not at the next step, 300 s away
    finally:
        proc.kill()
    assert len(list(csv.DictReader((results / "netem_changes.csv").open()))) == 1


def test_with_a_control_socket_each_step_goes_to_the_link_emulator(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "emulator.sock"
    emulator = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    emulator.bind(str(path))
    results = tmp_path / "results"
    config = {
        "run_id": "r1",
        "host": "device1",
        "seed": 7,
        "results_dir": str(results),
        "variation": {"kind": "square", "low_ms": 5, "high_ms": 45, "period_s": 0.02},
        "control_socket": str(path),
        "max_steps": 3,
    }
    (tmp_path / "c.json").write_text(json.dumps(config))
    try:
        assert agent_main(["netem-vary", "--config", str(tmp_path / "c.json")]) == 0
        emulator.settimeout(1)
        sent = [json.loads(emulator.recv(256)) for _ in range(3)]
    finally:
        emulator.close()
    assert sent == [{"delay_ms": 5.0}, {"delay_ms": 45.0}, {"delay_ms": 5.0}]
    rows = list(csv.DictReader((results / "netem_changes.csv").open()))
    assert [(r["delay_ms"], r["ok"], r["dry_run"]) for r in rows] == [
        ("5", "1", "0"),
        ("45", "1", "0"),
        ("5", "1", "0"),
    ]
