"""A device process that dies during a run degrades the run (issue 10, item 7).

The device zipapp is built from the package files at run time; the test swaps the monitor and power
modules in that archive for versions that fail on one device after a few samples (the monitor exits 3
after writing to stderr, the power trace kills itself with SIGKILL), so the real processes start, report
ready and then die while the run goes on, exactly as a crashing sampler would.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console

from dit.device import build
from dit.run.driver import Driver, RunOptions
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.conftest import write_scenario

MONITOR_FAULT = """

_dit_real_run_monitor = run_monitor


def run_monitor(raw):  # injected by tests/integration/test_process_exit.py
    if raw.get("host") != "device1":
        return _dit_real_run_monitor(raw)
    import sys

    _dit_real_run_monitor({**raw, "duration_s": 0.3})
    print("injected fault: the thermal sensor went away", file=sys.stderr, flush=True)
    return 3
"""

POWER_FAULT = """

_dit_real_run_power = run_power


def run_power(cfg, bus_factory=open_smbus):  # injected by tests/integration/test_process_exit.py
    if cfg.get("host") != "device2":
        return _dit_real_run_power(cfg, bus_factory)
    import signal

    _dit_real_run_power({**cfg, "duration_s": 0.3}, bus_factory)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _faulty_sources(tmp: Path, real: object) -> object:
    def sources(extra_packages: Sequence[str]) -> list[tuple[str, Path]]:
        out = []
        for arcname, source in real(extra_packages):  # type: ignore[operator]
            fault = {"dit/device/monitor.py": MONITOR_FAULT, "dit/device/power.py": POWER_FAULT}.get(arcname)
            if fault is None:
                out.append((arcname, source))
                continue
            patched = tmp / arcname.replace("/", "_")
            patched.write_text(source.read_text(encoding="utf-8") + fault, encoding="utf-8")
            out.append((arcname, patched))
        return out

    return sources


def test_a_device_process_that_dies_degrades_the_run_with_its_stderr(
    scenario_dir: Path, runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    monkeypatch.setattr(build, "_sources", _faulty_sources(patches, build._sources))
    path = write_scenario(
        scenario_dir,
        name="procdeath",
        inference={"enabled": True, "partition_points": [0, 4], "repetitions": 2},
        optimisation={"enabled": False},
        timing={"start_lead_s": 1.0, "settle_s": 1.0},
    )
    (scenario,) = load(path)
    console = io.StringIO()
    result = Driver(scenario, RunOptions(runs_root=runs_dir, console=Console(file=console))).execute()

    assert result.state == "degraded", result.error
    assert result.error is not None
    assert "device1: monitor exited with code 3" in result.error
    assert "device2: power ended without an exit code" in result.error
    status = RunDir(result.run_dir).status()
    assert status["state"] == "degraded"
    by_node = {(f["node"], f["process"]): f for f in status["degraded"]}
    assert set(by_node) == {("device1", "monitor"), ("device2", "power")}
    assert by_node["device1", "monitor"]["exit_code"] == 3
    assert by_node["device1", "monitor"]["state"] == "exited"
    assert "injected fault: the thermal sensor went away" in by_node["device1", "monitor"]["stderr_tail"]
    assert by_node["device2", "power"]["state"] == "vanished"
    assert by_node["device2", "power"]["exit_code"] is None

    # The process's stderr is in run.log (followed live), and so is the reason.
    log = (result.run_dir / "run.log").read_text(encoding="utf-8")
    assert "device1 stderr [monitor] injected fault: the thermal sensor went away" in log
    assert "device1: monitor exited with code 3" in log
    assert "run degraded" in log

    # The other processes are fine and say so; the records reached raw/.
    states = json.loads((result.run_dir / "raw" / "device2" / "device2_processes.json").read_text())
    assert {e["tag"]: e["state"] for e in states}["monitor"] == "running"
    assert not [e for e in states if e["tag"] == "monitor" and e["failed"]]

    # Everything measured is still there, and teardown still reaped everything.
    assert (result.run_dir / "aggregate" / "phases.csv").is_file()
    assert run_processes(RunDir(result.run_dir).run_id) == []
