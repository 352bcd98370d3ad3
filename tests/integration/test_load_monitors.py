"""Load generator, monitors and fake power through the real stages of a local run.

A watcher thread records which tagged processes of the run exist in each stage (from the run's
``status.json`` and the processes' environments), so the test sees them run during profiling, not just
their files afterwards.
"""

from __future__ import annotations

import io
import json
import math
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
from rich.console import Console

from dit.analysis.monitors import aggregate_monitors
from dit.run.driver import Driver, RunOptions
from dit.run.localmode import make_fake_sysfs, snapshot_tree
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.conftest import write_scenario

DEVICES = ("device1", "device2")
HOSTS = ("edge", *DEVICES)


class Watcher(threading.Thread):
    def __init__(self, runs_dir: Path) -> None:
        super().__init__(daemon=True)
        self.runs_dir = runs_dir
        self.seen: set[tuple[str, str, str]] = set()  # (stage, host, tag)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for status_file in self.runs_dir.glob("*/*/status.json"):
                try:
                    stage = json.loads(status_file.read_text()).get("stage") or ""
                except (OSError, ValueError):
                    continue
                for proc in run_processes(RunDir(status_file.parent).run_id):
                    try:
                        env = proc.environ()
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
                    self.seen.add((stage, env.get("DIT_HOST", ""), env.get("DIT_TAG", "")))
            time.sleep(0.1)


def processes_under(path: Path) -> list[tuple[int, str]]:
    """Processes whose command line names something under ``path`` (the run's node directories)."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(path) in cmdline:
            out.append((proc.pid, cmdline))
    return out


def test_load_monitors_and_power_run_during_profile_and_leave_nothing(
    scenario_dir: Path, runs_dir: Path, tmp_path: Path
) -> None:
    path = write_scenario(
        scenario_dir,
        name="loadmon",
        inference={"enabled": True, "partition_points": [0, 4], "repetitions": 3},
        optimisation={"enabled": False},
        timing={"start_lead_s": 1.0, "settle_s": 1.5},
        load={
            "device1": {"mode": "continuous", "regime": "light", "interval_s": 0.5, "mem_pct": 0.05},
            "device2": {"mode": "processes", "processes": 1},
        },
    )
    (scenario,) = load(path)
    reference = {
        role: snapshot_tree(make_fake_sysfs(tmp_path / "reference" / role / "sys", role))
        for role in ("edge", "device")
    }
    before = processes_under(runs_dir)
    watcher = Watcher(runs_dir)
    watcher.start()
    try:
        result = Driver(
            scenario, RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO()))
        ).execute()
    finally:
        watcher.done.set()
        watcher.join(timeout=5)
    assert result.state == "completed", result.error
    run_dir = result.run_dir

    # The processes ran during the profile stage, on the hosts they belong to.
    during = {(host, tag) for stage, host, tag in watcher.seen if stage == "profile"}
    for device in DEVICES:
        assert {(device, "monitor"), (device, "power"), (device, "load")} <= during, during
    assert ("edge", "monitor") in during
    assert ("edge", "load") not in during and ("edge", "power") not in during

    # Their files reached raw/<host>/ with the host prefix.
    for host in HOSTS:
        for name in ("monitor.csv", "monitor.json"):
            assert (run_dir / "raw" / host / f"{host}_{name}").is_file(), (host, name)
    for device in DEVICES:
        for name in ("load.csv", "load.json", "power.csv", "power.json"):
            assert (run_dir / "raw" / device / f"{device}_{name}").is_file(), (device, name)

    # The monitor sampled after each device's start signal (i.e. around the profile).
    for device in DEVICES:
        origin = json.loads((run_dir / "raw" / device / f"{device}_origin.json").read_text())
        trace = pd.read_csv(run_dir / "raw" / device / f"{device}_monitor.csv")
        assert (trace["t_mono_ns"] < origin["origin_mono_ns"]).any()
        assert (trace["t_mono_ns"] >= origin["origin_mono_ns"]).any()
    d1 = pd.read_csv(run_dir / "raw" / "device1" / "device1_load.csv")
    assert d1["event"].iloc[0] == "start" and (d1["event"] == "target").sum() >= 2
    assert d1["cpu_pct"].between(10, 20).all() and (d1["mem_pct"] == 0.05).all()
    # a local device stands for a Pi 4: its memory targets are a share of 4096 MiB, not of this machine
    header = json.loads((run_dir / "raw" / "device1" / "device1_load.json").read_text())
    assert header["memory_basis_bytes"] == 4096 * 1024 * 1024, header
    assert header["memory_basis_source"].startswith("board_memory_mb"), header
    assert (d1["mem_bytes"] == int(4096 * 1024 * 1024 * 0.05 / 100)).all()
    d2 = pd.read_csv(run_dir / "raw" / "device2" / "device2_load.csv")
    assert d2["event"].iloc[0] == "start" and d2["processes"].iloc[0] == 1

    # Apply waited for every load to settle (timing.settle defaults) and recorded how long per device.
    settle = json.loads((run_dir / "status.json").read_text())["settle"]
    assert set(settle) == set(DEVICES)
    assert settle["device1"]["window_s"] == 1.0 and settle["device1"]["elapsed_s"] >= 1.0
    assert settle["device1"]["reason"] in ("steady", "timeout")
    assert settle["device2"] == settle["device2"] | {"steady": True, "reason": "no duty cycle"}

    # What aggregate makes of them.
    aggregate_monitors(run_dir)
    energy = pd.read_csv(run_dir / "aggregate" / "energy.csv")
    assert sorted(energy["device"].unique()) == list(DEVICES)
    assert len(energy) == 2 * 2 * 3
    assert energy["energy_j"].map(math.isfinite).all() and (energy["energy_j"] > 0).all()
    assert (energy["mean_power_w"].between(2.7 - 1e-9, 6.4 + 1e-9)).all()
    throttling = pd.read_csv(run_dir / "aggregate" / "throttling.csv").set_index("node")
    assert not throttling.loc["device1"]["throttled_during_run"]
    assert throttling.loc["edge"]["source"] == "none"
    monitors = pd.read_csv(run_dir / "aggregate" / "monitors.csv")
    assert set(monitors["node"]) == set(HOSTS)

    # Teardown reaped them all, and the nodes are as the run found them.
    assert run_processes(RunDir(run_dir).run_id) == []
    assert processes_under(runs_dir) == before == []
    for host in HOSTS:
        role = "edge" if host == "edge" else "device"
        assert snapshot_tree(run_dir / "nodes" / host / "sys") == reference[role], host
