"""A run's node stages share one ansible-playbook start (issue 48): preflight, apply, profile, collect and,
after a completed run, teardown play in one, handed over by the driver between them; a failed or stopped
run's teardown has a start of its own. A gate that refuses at a hand-over stops the playbook before apply
touches a node, and a driver killed while its playbook waits at a hand-over leaves no ansible-playbook
behind."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import ansible_runner
import psutil
import pytest
from rich.console import Console

from dit.run import ansible_exec
from dit.run import preflight as gates
from dit.run.driver import Driver, RunOptions
from dit.run.errors import StageFailed
from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.conftest import DIT, REPO, dit_env, write_scenario

NODE_STAGES = ("preflight", "apply", "profile", "collect", "teardown")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ansible-runner launch of the run engine, by the playbook it ran (a recording wrapper)."""
    seen: list[str] = []
    real = ansible_runner.run

    def recording(**kwargs: Any) -> Any:
        seen.append(str(kwargs["playbook"]))
        return real(**kwargs)

    monkeypatch.setattr(ansible_exec.ansible_runner, "run", recording)
    return seen


def test_a_completed_run_starts_ansible_once_and_every_stage_keeps_its_playbook_and_variables(
    scenario_dir: Path, runs_dir: Path, launches: list[str]
) -> None:
    scenario_path = write_scenario(scenario_dir, load={"device2": {"mode": "light"}})
    (scenario,) = load(scenario_path)
    driver = Driver(scenario, RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO())))
    result = driver.execute()
    assert result.state == "completed", result.error
    # before issue 48: one launch per stage, preflight.yml ... teardown.yml (five); then two (chain.yml and
    # teardown.yml); now teardown is handed over in the same playbook after aggregate and optimise
    assert launches == ["chain.yml"], launches
    assert set(NODE_STAGES) <= set(result.stage_ns), result.stage_ns
    assert all(driver.outcomes[stage].ok for stage in NODE_STAGES[:-1])
    run = RunDir(result.run_dir)
    # teardown undid every change and reaped every process from within the session
    assert run.status()["teardown"]["ok"] is True and Journal(run.journal).pending() == []
    assert not any(
        (run.path / "nodes" / host / run.run_id).exists() for host in ("edge", "device1", "device2")
    )
    for stage in NODE_STAGES:  # what each stage ran and was handed, kept as before
        assert (result.run_dir / "ansible" / stage / "project" / f"{stage}.yml").is_file(), stage
        assert (result.run_dir / "ansible" / stage / "env" / "extravars").is_file(), stage
    # the load condition was handed to apply after preflight: its settle record is read from apply's results
    assert RunDir(result.run_dir).status().get("settle"), RunDir(result.run_dir).status()
    assert run_processes(RunDir(result.run_dir).run_id) == []


def test_a_gate_refusing_at_the_hand_over_stops_the_playbook_before_apply(
    scenario_dir: Path, runs_dir: Path, launches: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object) -> None:
        raise StageFailed("preflight: NTP gate refused to start: device1: clock offset 9 ms exceeds 1.0 ms")

    monkeypatch.setattr(gates, "ntp_gate", refuse)
    (scenario,) = load(write_scenario(scenario_dir))
    driver = Driver(scenario, RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO())))
    result = driver.execute()
    assert result.state == "failed"
    assert result.error is not None and "NTP gate refused" in result.error
    assert "apply" not in driver.outcomes and "apply" not in result.stage_ns
    assert launches == ["chain.yml", "teardown.yml"], launches
    run = RunDir(result.run_dir)
    # apply never ran: no node run directory was made, only the lease was taken (and released)
    assert [r["op"] for r in Journal(run.journal).records() if "op" in r] == ["lease"] * 3
    for host in ("edge", "device1", "device2"):
        assert not (run.path / "nodes" / host / run.run_id).exists(), host
    assert Journal(run.journal).pending() == []
    assert run.status()["teardown"]["ok"] is True


def _playbooks_of(run_path: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "ansible-playbook" in cmdline and str(run_path) in cmdline:
            found.append(proc)
    return found


def test_a_driver_killed_while_its_playbook_waits_at_a_hand_over_leaves_no_playbook(
    scenario_dir: Path, runs_dir: Path
) -> None:
    # timing.settle_s: the driver waits after apply, its playbook at the hand-over to profile
    scenario = write_scenario(scenario_dir, name="settling", timing={"start_lead_s": 1.0, "settle_s": 600})
    proc = subprocess.Popen(
        [*DIT, "run", str(scenario), "--runs-dir", str(runs_dir)],
        cwd=REPO,
        env=dit_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300  # a bound, not a measurement
    run: RunDir | None = None
    while time.monotonic() < deadline:
        found = list(runs_dir.glob("*/*/status.json"))
        if found:
            run = RunDir(found[0].parent)
            if "apply" in run.status().get("stage_ns", {}) and _playbooks_of(run.path):
                break
        assert proc.poll() is None, "the run ended before it settled"
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError("the run never reached its settle wait")
    assert run is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while _playbooks_of(run.path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _playbooks_of(run.path) == [], "the playbook still waits for a driver that is gone"
    cleanup = subprocess.run(
        [*DIT, "cleanup", str(run.path)], cwd=REPO, env=dit_env(), capture_output=True, text=True, timeout=180
    )
    assert cleanup.returncode == 0, cleanup.stderr + cleanup.stdout
    assert run_processes(run.run_id) == []
    assert Journal(run.journal).pending() == []
