"""`dit stop` signals a run's driver only when the run is running and the pid is still that driver."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from dit.cli import app
from dit.run.procs import process_identity
from dit.run.rundir import DRIVER, STATUS, STOP, RunDir, write_json


@pytest.fixture
def driver_of() -> Iterator[Callable[[Path], subprocess.Popen[bytes]]]:
    """A stand-in driver: a live process that holds a run directory open, as `dit run` holds its own."""
    started: list[subprocess.Popen[bytes]] = []

    def start(run: Path) -> subprocess.Popen[bytes]:
        fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
        try:
            started.append(subprocess.Popen(["sleep", "120"], pass_fds=(fd,)))
        finally:
            os.close(fd)
        # its identity is recorded next: wait until /proc shows the exec'd command line (on a loaded
        # machine it showed the forking interpreter's for a moment)
        deadline = time.monotonic() + 10
        while psutil.Process(started[-1].pid).cmdline() != ["sleep", "120"] and time.monotonic() < deadline:
            time.sleep(0.01)
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def fake_run(tmp_path: Path, state: str, driver: dict[str, Any]) -> Path:
    run = tmp_path / "runs" / "s" / "20260101T000000Z-0123abcd"
    run.mkdir(parents=True)
    write_json(run / STATUS, {"state": state, "stage": None, "label": "s"})
    write_json(run / DRIVER, {"host": platform.node(), "local": True, **driver})
    return run


def stop(run: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["stop", str(run), *extra])
    return result.exit_code, result.output


def test_a_finished_run_is_refused_and_the_process_in_driver_json_survives(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # the pid in driver.json was reused by an unrelated process since the run completed
    run = fake_run(tmp_path, "completed", {"pid": sleeper.pid})
    code, output = stop(run)
    assert code != 0
    assert "is not running (state completed)" in output
    assert "Traceback" not in output
    assert sleeper.poll() is None
    assert not (run / STOP).exists()


def test_a_running_run_whose_pid_is_another_process_is_refused(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # the driver died (status still says running) and its pid now names the sleeper
    recorded = process_identity(os.getpid())
    run = fake_run(tmp_path, "running", {"pid": sleeper.pid, **recorded})
    code, output = stop(run)
    assert code != 0
    assert f"pid {sleeper.pid} is now another process" in " ".join(output.split())
    assert "dit cleanup" in output
    assert sleeper.poll() is None


def test_the_verified_driver_is_signalled(
    tmp_path: Path, driver_of: Callable[[Path], subprocess.Popen[bytes]]
) -> None:
    run = fake_run(tmp_path, "running", {})
    driver = driver_of(run)
    write_json(run / DRIVER, {"host": platform.node(), "pid": driver.pid, **process_identity(driver.pid)})
    code, _output = stop(run, "--wait", "1")
    assert code != 0  # a sleep does not write status.json: it never reports "stopped"
    assert driver.wait(timeout=10) == -signal.SIGTERM
    assert (run / STOP).exists()


def test_a_process_driver_json_copied_but_not_holding_the_run_is_not_signalled(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # issue 46: driver.json copies another process's pid, start time and command line from /proc
    run = fake_run(tmp_path, "running", {"pid": sleeper.pid, **process_identity(sleeper.pid)})
    code, output = stop(run, "--wait", "0.5")
    assert code != 0
    assert f"pid {sleeper.pid} does not hold {run} open" in " ".join(output.split())
    assert "STOP file only" in output
    assert sleeper.poll() is None
    assert (run / STOP).exists()


def test_a_driver_without_a_recorded_identity_gets_only_the_stop_file(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    run = fake_run(tmp_path, "running", {"pid": sleeper.pid})
    code, output = stop(run, "--wait", "0.5")
    assert code != 0
    assert "STOP file" in output
    assert (run / STOP).exists()
    assert sleeper.poll() is None


def test_discard_results_travels_to_the_driver_in_the_stop_file(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    plain = fake_run(tmp_path / "plain", "running", {"pid": sleeper.pid})  # reached by the STOP file only
    stop(plain, "--wait", "0.5")
    assert RunDir(plain).stop_requested() and not RunDir(plain).discard_requested()
    run = fake_run(tmp_path, "running", {"pid": sleeper.pid, **process_identity(sleeper.pid)})
    stop(run, "--wait", "0.5", "--discard-results")
    assert RunDir(run).stop_requested() and RunDir(run).discard_requested()
