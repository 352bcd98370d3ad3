"""Node leases in local mode: a stale lease is reported, refused, and broken only with the flag.

A second run refused while a live run holds the machine is asserted on the held run of
test_stop_and_cleanup.py (one run serves that, ``dit cleanup``'s refusal and ``dit stop``)."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

from dit.run.journal import Journal
from dit.run.lease_decision import BREAK_FLAG, process_started_s
from tests.conftest import write_scenario
from tests.integration.leases import assert_refused_and_untouched, dit, lease_file, only_run, tiny_scenario


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
