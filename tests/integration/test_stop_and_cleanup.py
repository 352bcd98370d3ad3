"""A run stopped with `dit stop`, or whose driver is killed with SIGKILL mid-profile, leaves nothing
on the nodes, and every result the nodes held is in the run's raw/."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from pathlib import Path

import psutil

from dit.report.labels import run_outcome
from dit.run.console import STAGES
from dit.run.journal import Journal, collected_name
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, HELD, REPO, dit_env, process_tag, write_scenario
from tests.integration.leases import assert_refused_and_untouched, dit, lease_file, only_run, tiny_scenario


def slow_scenario(directory: Path) -> Path:
    return write_scenario(directory, name="slow", timing=HELD)


def start_run(scenario: Path, runs_dir: Path) -> tuple[subprocess.Popen[bytes], RunDir]:
    proc = subprocess.Popen(
        [*DIT, "run", str(scenario), "--runs-dir", str(runs_dir)],
        cwd=REPO,
        env=dit_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # a bound, not a measurement: preflight and apply took 120 s at load average 11 (two suites at once)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = list(runs_dir.glob("*/*/status.json"))
        if found:
            run = RunDir(found[0].parent)
            agents = [p for p in run_processes(run.run_id) if process_tag(p) == "profile"]
            if run.status().get("stage") == "profile" and len(agents) == 2:
                return proc, run
        assert proc.poll() is None, "the run ended before its profile stage"
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the run never reached its profile stage")


def node_results(run: RunDir) -> dict[str, dict[str, int]]:
    """Every node's ``results/`` and ``logs/`` files (``results/<name>``: size in bytes)."""
    found: dict[str, dict[str, int]] = {}
    for host in ("edge", "device1", "device2"):
        root = run.path / "nodes" / host / run.run_id
        found[host] = {
            f"{sub}/{path.name}": path.stat().st_size
            for sub in ("results", "logs")
            for path in sorted((root / sub).glob("*"))
            if path.is_file()
        }
    return found


def assert_clean(run: RunDir) -> None:
    assert run_processes(run.run_id) == []
    assert Journal(run.journal).pending() == []
    for host in ("edge", "device1", "device2"):
        assert not (run.path / "nodes" / host / run.run_id).exists()


def test_sigkill_mid_profile_then_cleanup(scenario_dir: Path, runs_dir: Path) -> None:
    proc, run = start_run(slow_scenario(scenario_dir), runs_dir)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # The stages that ended before the kill left their wall times in status.json.
    stage_ns = run.status().get("stage_ns", {})
    assert set(stage_ns) == {"preflight", "apply"}, stage_ns
    assert all(isinstance(ns, int) and ns > 0 for ns in stage_ns.values())
    # The device agents and the edge service outlive their driver: only the journal knows them.
    survivors = run_processes(run.run_id)
    assert {process_tag(p) for p in survivors} >= {"profile", "edge"}
    assert Journal(run.journal).pending()
    lease = Path(os.environ["DIT_LOCAL_LEASE_DIR"]) / "lease.json"
    assert json.loads(lease.read_text())["run_id"] == run.run_id  # the dead driver still holds it
    # What every node holds that collect never fetched (preflight's ping baseline is in raw/ already).
    on_nodes = node_results(run)
    for host in ("device1", "device2"):
        assert (run.path / "raw" / host / f"{host}_ping_baseline.json").is_file()
        assert {"results/monitor.csv", "logs/monitor.status.json"} <= set(on_nodes[host]), on_nodes[host]

    cleanup = subprocess.run(
        [*DIT, "cleanup", str(run.path)], cwd=REPO, env=dit_env(), capture_output=True, text=True, timeout=180
    )
    assert cleanup.returncode == 0, cleanup.stderr + cleanup.stdout
    assert_clean(run)
    # ... all of it is in raw/ now, named as collect names it, and at least as long as it was.
    for host, files in on_nodes.items():
        for path, size in files.items():
            kept = collected_name(run.path / "raw", host, path)
            assert kept.is_file() and kept.stat().st_size >= size, (host, path)
    assert "without being fetched" not in cleanup.stderr + cleanup.stdout
    assert not lease.exists()  # dit cleanup released it (journal record 'lease')
    for p in survivors:
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    # Cleaning up twice is harmless.
    again = subprocess.run(
        [*DIT, "cleanup", str(run.path)], cwd=REPO, env=dit_env(), capture_output=True, timeout=180
    )
    assert again.returncode == 0


def test_a_held_run_refuses_a_second_run_and_cleanup_then_dit_stop_tears_it_down(
    scenario_dir: Path, tmp_path: Path
) -> None:
    """One running run, three things asserted about it (each once its own test with its own run):
    a second run on the machine is refused by the lease and changes nothing; ``dit cleanup`` refuses
    while its driver runs; ``dit stop`` tears it down, releases the lease, and the next run proceeds.

    The SIGTERM that ``dit stop`` sends is the signal the driver gets from a user's ``kill`` too.
    """
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

        not_now = dit("cleanup", str(first.path))
        assert not_now.returncode != 0
        assert "still running" in not_now.stderr
        assert first.status()["state"] == "running"

        stop = dit("stop", str(first.path))
        assert stop.returncode == 0, stop.stderr
        assert "STOP file only" not in stop.stderr  # the driver holds its run directory: it is signalled
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=180)
    status = first.status()
    assert status["state"] == "stopped"
    assert status["teardown"]["ok"] is True
    # the stage it stopped in is kept, and said (issue 36): not "no inference ran (a benchmark)"
    assert status["ended_stage"] in STAGES
    assert status["error"] == "stopped by dit stop"  # its request file, then SIGTERM: the user stopped it
    assert (run_outcome(status) or "").startswith(
        f"Stopped by the user (dit stop or NNPM's Stop) at the {status['ended_stage']} stage"
    )
    assert_clean(first)
    assert not lease_file().exists()
    after = dit("run", str(tiny_scenario(scenario_dir)), "--runs-dir", str(tmp_path / "runs-c"))
    assert after.returncode == 0, after.stderr[-3000:]
    assert not lease_file().exists()
