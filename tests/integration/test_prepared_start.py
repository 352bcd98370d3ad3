"""The two-phase start, for real: agents that take longer to prepare than the lead still start on time.

The fake model's ``build_delay_s`` stands in for TensorFlow's import and model build under load (45 s
measured with ch4's load processes). With the one-phase start the instant was picked before the agents
started, ``start_lead_s`` ahead, so every agent reached it ``build_delay_s - start_lead_s`` late (here
4 s); the instant is now picked once every agent has prepared.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from dit.run.driver import Driver, RunOptions
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.conftest import write_scenario

# The lead still has to cover one Ansible task (the one that tells the nodes the instant): about 1 s
# on a quiet 2-core machine, 3-4 s at a load average of 10. A fixed 2 s lead failed there; the lead is
# now at least twice the time the prepare task took to reach the slowest node, plus 0.5 s, so a lead
# far too short for that task is the test.
BUILD_DELAY_S = 5.0
LEAD_S = 0.01


@pytest.mark.serial  # starts on time: alone, after the parallel pass
@pytest.mark.slow  # a whole local run with two 5 s model builds (about 35 s; 90 s at load 10)
def test_agents_that_prepare_longer_than_the_lead_start_on_time(scenario_dir: Path, runs_dir: Path) -> None:
    path = write_scenario(
        scenario_dir,
        name="prepared",
        model={"name": "fake", "params": {"profile": "tiny", "build_delay_s": BUILD_DELAY_S}},
        repetitions=1,
        warmup=0,
        inference={"enabled": False},
        optimisation={"enabled": False},
        timing={"start_lead_s": LEAD_S},
    )
    (scenario,) = load(path)
    result = Driver(scenario, RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO()))).execute()
    assert result.state == "completed", result.error
    run = RunDir(result.run_dir)
    status = run.status()
    lateness = status["lateness_ns"]
    print("start lateness ns:", lateness, "load average:", os.getloadavg())
    assert set(lateness) == {"device1", "device2"}
    # Generous on a shared machine; the one-phase start gave >= BUILD_DELAY_S - LEAD_S here, and the
    # configured 10 ms lead alone a start task that reached the nodes after the instant.
    assert all(0 <= ns < 50_000_000 for ns in lateness.values()), lateness
    margins = {d: w["start_margin_ns"] for d, w in status["start_wait"].items()}
    print("start task ahead of the instant, ns:", margins)
    assert set(margins) == {"device1", "device2"} and all(m > 0 for m in margins.values()), margins
    origins = [
        json.loads((run.path / "raw" / d / f"{d}_origin.json").read_text()) for d in ("device1", "device2")
    ]
    assert origins[0]["start_at_ns"] == origins[1]["start_at_ns"]
    for origin in origins:
        assert origin["start_sched"]["start_from"] == "file"
        # Prepared (model built) before the instant was picked, so it waited at least the lead: here
        # the derived one, at least 0.5 s more than the configured 10 ms.
        assert origin["prepared_to_start_ns"] >= 500_000_000
    metadata = json.loads((run.path / "metadata.json").read_text())
    assert metadata["start_wait"]["device1"]["prepared_to_start_ns"] == origins[0]["prepared_to_start_ns"]
