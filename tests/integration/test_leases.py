"""Node leases in local mode: a second run on the same machine is refused while the first holds it."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from pathlib import Path

from dit.run.journal import Journal
from dit.run.lease_decision import BREAK_FLAG, process_started_s
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, dit_env, write_scenario
from tests.integration.test_stop_and_cleanup import slow_scenario, start_run


def lease_file() -> Path:
    return Path(os.environ["DIT_LOCAL_LEASE_DIR"]) / "lease.json"


def dit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DIT, *args], cwd=REPO, env=dit_env(), capture_output=True, text=True, timeout=600, check=False
    )


def only_run(runs_dir: Path) -> RunDir:
    (status,) = runs_dir.glob("*/*/status.json")
    return RunDir(status.parent)


def tiny_scenario(directory: Path) -> Path:
    """The smallest complete local run (one device, one profiling pass, no inference, no optimisation):
    the tests below need a run that takes and releases the lease, not its measurements."""
    return write_scenario(
        directory,
        name="tiny",
        devices=["device1"],
        repetitions=1,
        warmup=0,
        inference={"enabled": False},
        optimisation={"enabled": False},
    )


def assert_refused_and_untouched(run: RunDir, before: bytes) -> None:
    """Refused in preflight: no change journaled, no node directory, no process, the lease intact."""
    status = run.status()
    assert status["state"] == "failed" and status["teardown"]["ok"] is True
    assert Journal(run.journal).records() == []
    assert not any((run.path / "nodes").glob(f"*/{run.run_id}"))
    assert run_processes(run.run_id) == []
    assert lease_file().read_bytes() == before


def test_a_second_run_is_refused_while_the_first_holds_the_machine(
    scenario_dir: Path, tmp_path: Path
) -> None:
    proc, first = start_run(slow_scenario(scenario_dir), tmp_path / "runs-a")
    try:
        held = json.loads(lease_file().read_text())
        assert held["run_id"] == first.run_id and held["controller_pid"] == proc.pid
        before = lease_file().read_bytes()
        quick = write_scenario(scenario_dir, name="quick")
        refused = dit("run", str(quick), "--runs-dir", str(tmp_path / "runs-b"))
        assert refused.returncode == 1
        message = " ".join(refused.stderr.split())
        for part in (f"is leased by run {first.run_id}", f"pid {proc.pid}", platform.node(), "still running"):
            assert part in message, part
        assert_refused_and_untouched(only_run(tmp_path / "runs-b"), before)
        assert first.status()["state"] == "running"  # the holder went on undisturbed
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    assert first.status()["state"] == "stopped" and not lease_file().exists()
    after = dit("run", str(tiny_scenario(scenario_dir)), "--runs-dir", str(tmp_path / "runs-c"))
    assert after.returncode == 0, after.stderr[-3000:]
    assert not lease_file().exists()


def test_a_stale_lease_is_reported_refused_and_broken_only_with_the_flag(
    scenario_dir: Path, tmp_path: Path
) -> None:
    # The holder: a process of this machine that has exited (its pid names nothing now).
    dead = subprocess.Popen(["true"])
    started = process_started_s(dead.pid)
    dead.wait()
    stale = {
        "run_id": "crashed-20261201T060000Z-abababab-0123abcd",
        "controller_host": platform.node(),
        "controller_pid": dead.pid,
        "pid_started_s": started or time.time(),
        "since_wall_ns": time.time_ns() - 3_600_000_000_000,
        "run_dir": str(tmp_path / "gone"),
    }
    lease_file().parent.mkdir(parents=True, exist_ok=True)
    lease_file().write_text(json.dumps(stale))
    before = lease_file().read_bytes()
    quick = write_scenario(scenario_dir, name="quick")

    refused = dit("run", str(quick), "--runs-dir", str(tmp_path / "runs-b"))
    assert refused.returncode == 1
    message = " ".join(refused.stderr.split())
    for part in (
        stale["run_id"],
        "driver is gone",
        f"pid {dead.pid}",
        BREAK_FLAG,
        f"dit cleanup {stale['run_dir']}",
    ):
        assert part in message, part
    assert_refused_and_untouched(only_run(tmp_path / "runs-b"), before)

    broken = dit("run", str(tiny_scenario(scenario_dir)), "--runs-dir", str(tmp_path / "runs-c"), BREAK_FLAG)
    assert broken.returncode == 0, broken.stderr[-3000:]
    run = only_run(tmp_path / "runs-c")
    assert "breaking the lease" in run.log.read_text() and stale["run_id"] in run.log.read_text()
    leases = [c for c in Journal(run.journal).records() if c.get("op") == "lease"]
    assert leases and all(c["undo"] == {"path": str(lease_file()), "run_id": run.run_id} for c in leases)
    assert Journal(run.journal).pending() == []
    assert not lease_file().exists()  # released at teardown: nothing of the crashed run is restored
