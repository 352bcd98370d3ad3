"""The device zipapp: deterministic bytes, and it runs edge + profile under an isolated interpreter."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from dit.device.build import ZIPAPP_NAME, build_zipapp

SPEC = {
    "name": "fake",
    "builder": "dit.device.fakemodel:build",
    "params": {"profile": "alexnet", "scale": 0.2},
    "seed": 9,
}


def test_zipapp_is_deterministic(tmp_path: Path) -> None:
    a = build_zipapp(tmp_path / "a")
    time.sleep(1.1)  # a different wall second must not change a byte
    b = build_zipapp(tmp_path / "b")
    assert a.name == b.name == ZIPAPP_NAME
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    names = zipfile.ZipFile(a).namelist()
    assert names == sorted(names)
    assert "__main__.py" in names and "dit/__init__.py" in names and "dit/device/edge.py" in names
    assert not any(n.startswith("dit/models/") or "__pycache__" in n for n in names)
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in zipfile.ZipFile(a).infolist())
    with_models = build_zipapp(tmp_path / "c" / "custom.pyz", extra_packages=["dit.models"])
    assert with_models.name == "custom.pyz"
    assert "dit/models/__init__.py" in zipfile.ZipFile(with_models).namelist()


def test_zipapp_runs_edge_and_profile_isolated(tmp_path: Path) -> None:
    """``python -I -S``: no site-packages at all, so this proves the device side is stdlib-only."""
    pyz = build_zipapp(tmp_path)
    iso = [sys.executable, "-I", "-S", str(pyz)]
    edge_cfg = {
        "run_id": "zip-run",
        "host": "edge",
        "policy": "SJF",
        "admission": "batch",
        "devices": ["device1"],
        "model": SPEC,
        "profile": {"repetitions": 1, "warmup": 0},
        "results_dir": str(tmp_path / "edge"),
        "ready_file": str(tmp_path / "ready.json"),
    }
    (tmp_path / "edge.json").write_text(json.dumps(edge_cfg))
    edge = subprocess.Popen([*iso, "edge", "--config", str(tmp_path / "edge.json")], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready.json").exists():
            assert edge.poll() is None and time.monotonic() < deadline, "edge did not start"
            time.sleep(0.02)
        port = json.loads((tmp_path / "ready.json").read_text())["port"]
        dev_cfg = {
            "run_id": "zip-run",
            "host": "device1",
            "start_at_ns": time.time_ns() + 100_000_000,
            "model": SPEC,
            "repetitions": 2,
            "warmup": 1,
            "inference": {
                "enabled": True,
                "vectors": [[0], [5], [11]],
                "device_index": 0,
                "repetitions": 2,
                "edge": {"host": "127.0.0.1", "port": port},
                "equivalence": {"enabled": True, "tolerance": 0.0},
            },
            "results_dir": str(tmp_path / "device1"),
            "threads": None,
        }
        (tmp_path / "dev.json").write_text(json.dumps(dev_cfg))
        dev = subprocess.run(
            [*iso, "profile", "--config", str(tmp_path / "dev.json")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert dev.returncode == 0, dev.stderr
    finally:
        edge.send_signal(signal.SIGTERM)
        _, err = edge.communicate(timeout=60)
    assert edge.returncode == 0, err
    with open(tmp_path / "device1" / "inference.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["partition_point"]) for r in rows] == [0, 0, 5, 5, 11, 11]
    assert all(float(r["max_abs_diff"]) == 0.0 for r in rows)
    done = json.loads((tmp_path / "device1" / "done.json").read_text())
    assert done["inference"]["records"] == 6
    with open(tmp_path / "edge" / "edge_requests.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 4


def test_equivalence_mismatch_exits_non_zero(tmp_path: Path) -> None:
    """A device whose model differs from the edge's (another seed) fails the equivalence check."""
    edge_cfg = {
        "run_id": "eq",
        "policy": "RR",
        "admission": "immediate",
        "devices": ["device1"],
        "model": {**SPEC, "seed": 1},
        "results_dir": str(tmp_path / "edge"),
        "ready_file": str(tmp_path / "ready.json"),
    }
    (tmp_path / "edge.json").write_text(json.dumps(edge_cfg))
    edge = subprocess.Popen(
        [sys.executable, "-m", "dit.device", "edge", "--config", str(tmp_path / "edge.json")]
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready.json").exists():
            assert edge.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        port = json.loads((tmp_path / "ready.json").read_text())["port"]
        dev_cfg = {
            "run_id": "eq",
            "host": "device1",
            "start_at_ns": None,
            "model": {**SPEC, "seed": 2},
            "repetitions": 1,
            "inference": {
                "enabled": True,
                "vectors": [[3]],
                "device_index": 0,
                "edge": {"host": "127.0.0.1", "port": port},
                "equivalence": {"enabled": True, "tolerance": 0.5},
            },
            "results_dir": str(tmp_path / "dev"),
        }
        (tmp_path / "dev.json").write_text(json.dumps(dev_cfg))
        dev = subprocess.run(
            [sys.executable, "-m", "dit.device", "profile", "--config", str(tmp_path / "dev.json")],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        edge.send_signal(signal.SIGTERM)
        edge.wait(60)
    assert dev.returncode == 3
    assert "model 'fake' at partition point 3: max abs difference" in dev.stderr
    assert json.loads((tmp_path / "dev" / "error.json").read_text())["kind"] == "equivalence"
    assert not (tmp_path / "dev" / "done.json").exists()


def test_extra_packages_carry_their_package_data(tmp_path: Path) -> None:
    # The model catalogue (catalogue.json) is read by the real adapters on the boards.
    pyz = build_zipapp(tmp_path, extra_packages=["dit/models"])
    names = zipfile.ZipFile(pyz).namelist()
    assert "dit/models/catalogue.json" in names
    assert not [n for n in names if n.endswith(".pyc")]
