"""A third-party runtime installs with pip and just works, in local mode.

The fixture package (tests/fixtures/runtime_pkg, runtime ``echo``) is installed with pip, offline, into a
temporary ``--target`` directory put on PYTHONPATH of the ``dit`` subprocesses, so the venv is untouched:
schema merged, readiness, an action, a run through all seven stages, results parsed, processes reaped.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, install_fixture_package, process_tag
from tests.conftest import dit_with_site as dit
from tests.conftest import env_with_site as env_with


@pytest.fixture(scope="module")
def runtime_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = install_fixture_package("runtime_pkg", tmp_path_factory.mktemp("runtime"))
    assert (site / "dit_echo_runtime-0.1.0.dist-info" / "entry_points.txt").is_file()
    return site


def echo_scenario(directory: Path, **block: object) -> Path:
    # no model, no inference block: the echo runtime brings its own work and runs none of the testbed's
    doc = {
        "name": "echo",
        "devices": ["device1", "device2"],
        "repetitions": 1,
        "seed": 3,
        "timing": {"start_lead_s": 1.0},
        "runtime": {"name": "echo", **block},  # no port: the workers take the ports the testbed sets aside
    }
    path = directory / "echo.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_not_installed_in_this_process() -> None:
    from dit.runtime_api import registry

    assert "echo" not in registry.installed()


def test_the_echo_runtime_runs_end_to_end(runtime_site: Path, tmp_path: Path) -> None:
    listing = dit(runtime_site, "runtimes")
    assert listing.returncode == 0, listing.stderr
    assert "echo" in listing.stdout and "payload_bytes, rounds" in listing.stdout

    bad = echo_scenario(tmp_path, placement="gredy")
    refused = dit(runtime_site, "validate", str(bad))
    assert refused.returncode == 2
    assert "runtime.placement: 'gredy' is not one of round_robin, greedy" in refused.stderr
    # the runtime's own check of its block against the scenario, before any run starts
    stray = dit(runtime_site, "validate", str(echo_scenario(tmp_path, workers=["device1", "device9"])))
    assert stray.returncode == 2
    assert (
        "runtime.workers[1]: 'device9' is not a device of the scenario (devices: device1, device2)"
        in stray.stderr
    )

    ready = dit(runtime_site, "runtimes", "check", "--runtime", "echo")
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert "python ok (3." in ready.stdout and "tcp ok (listens)" in ready.stdout

    action = dit(
        runtime_site, "runtimes", "act", "echo", "say", "--set", "message=hello-from-echo", "--set", "count=2"
    )
    assert action.returncode == 0, action.stdout + action.stderr
    assert action.stdout.count("stdout hello-from-echo") == 4  # twice on the edge and on device1
    wrong = dit(runtime_site, "runtimes", "act", "echo", "say", "--set", "count=9")
    assert wrong.returncode == 2
    assert "count: 9 is greater than 5" in wrong.stderr and "message: is required" in wrong.stderr

    scenario = echo_scenario(tmp_path, rounds=4, payload_bytes=256)
    done = dit(runtime_site, "run", str(scenario), "--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs" / "echo").iterdir()
    status = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
    assert status["state"] == "completed"
    assert status["skipped"] == {"optimise": "no optimiser for runtime echo"}
    assert set(status["stage_ns"]) >= {"preflight", "apply", "profile", "collect", "aggregate", "teardown"}
    metadata = json.loads((run_dir / "metadata.json").read_text(encoding="utf-8"))
    assert metadata["runtime"]["name"] == "echo" and metadata["runtime"]["block"]["rounds"] == 4
    assert metadata["model"] is None and "model" not in metadata["scenario"]["document"]
    # two local devices (both 127.0.0.1) got ports of their own, recorded; the workers listened on them
    ports = metadata["runtime_ports"]
    assert set(ports) == {"edge", "device1", "device2"}
    every = [port for node in ports.values() for port in node]
    assert len(every) == 12 and len(set(every)) == 12

    with (run_dir / "aggregate" / "echo_rtt.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["device"], r["round_trips"]) for r in rows] == [("device1", "4"), ("device2", "4")]
    assert all(0 < int(r["rtt_min_ns"]) <= int(r["rtt_mean_ns"]) <= int(r["rtt_max_ns"]) for r in rows)
    summary = json.loads((run_dir / "aggregate" / "summary.json").read_text(encoding="utf-8"))
    values = {v["name"]: v for v in summary["values"]}
    assert summary["runtime"] == "echo"
    assert (values["round_trips"]["value"], values["payload"]["value"], values["payload"]["unit"]) == (
        8,
        256,
        "bytes",
    )
    assert values["rtt_mean"]["unit"] == "ms" and values["rtt_mean"]["value"] > 0

    # each worker echoed every round (its own raw file), the processes' output is in run.log
    for device in ("device1", "device2"):
        worker = json.loads(
            (run_dir / "raw" / device / f"{device}_echo_worker.json").read_text(encoding="utf-8")
        )
        assert worker == {"echoed": 4}
    log = (run_dir / "run.log").read_text(encoding="utf-8")
    assert "[echo-controller] 4 rounds to 2 workers" in log
    assert "[echo-worker] echoed 4 messages" in log
    assert "optimise skipped: no optimiser for runtime echo" in log
    assert "edge service not started: runtime echo does not use it" in log
    assert "echo: payload = 256 bytes" in log and "echo: round_trips = 8" in log
    assert run_processes(RunDir(run_dir).run_id) == []
    # the report says why the optimise stage did not run, from status.json (issue 33 item 5)
    from dit.report.build import build_report

    assert "optimise: skipped (no optimiser for runtime echo)" in build_report(run_dir)


def test_a_failing_readiness_check_is_reported_with_its_reason(runtime_site: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.json"
    python = sys.executable
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": python},
                    "children": {
                        "edge": {"hosts": {"edge": {"dit_python": python}}},
                        "devices": {"hosts": {"board1": {"dit_python": str(tmp_path / "no-python")}}},
                    },
                }
            }
        ),
        encoding="utf-8",
    )
    checked = dit(runtime_site, "runtimes", "check", "--runtime", "echo", "-i", str(inventory))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = {line.split("│")[1].strip(): line for line in checked.stdout.splitlines() if line.count("│") >= 4}
    assert "ok" in lines["edge"] and "failed" not in lines["edge"]
    assert "failed" in lines["board1"] and "python FAILED" in lines["board1"]
    assert "python:" in lines["board1"] and "no-python" in lines["board1"]  # the reason names the program


def test_sigkill_of_the_driver_then_cleanup_reaps_the_runtimes_processes(
    runtime_site: Path, tmp_path: Path
) -> None:
    scenario = echo_scenario(tmp_path, rounds=100000, interval_ms=20)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [*DIT, "run", str(scenario), "--runs-dir", str(runs)],
        cwd=REPO,
        env=env_with(runtime_site),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    run: RunDir | None = None
    while time.monotonic() < deadline:
        found = list(runs.glob("*/*/status.json"))
        if found:
            run = RunDir(found[0].parent)
            tags = sorted((process_tag(p) or "") for p in run_processes(run.run_id))
            if tags.count("echo-worker") == 2 and "echo-controller" in tags:
                break
        assert proc.poll() is None, "the run ended before the runtime's processes started"
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError("the runtime's processes never started")
    assert run is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    survivors = {process_tag(p) for p in run_processes(run.run_id)}
    assert {"echo-worker", "echo-controller"} <= survivors  # nothing reaped them yet
    cleaned = dit(runtime_site, "cleanup", str(run.path))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert run_processes(run.run_id) == []
    assert Journal(run.journal).pending() == []
