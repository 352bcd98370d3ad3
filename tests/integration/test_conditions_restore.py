"""Hardware conditions through the real driver stages (local mode): applied, idempotent, and
restored exactly — after a completed apply and after an apply that failed half-way.

The driver runs preflight, apply and teardown for real (profile, collect, aggregate and optimise
are skipped: they touch no condition). Before apply and after teardown every touched state is
snapshotted: the fake sysfs tree of every node and this machine's memory cgroups of the run.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dit.conditions.cgroup_roots import cgroup_memory_root
from dit.run.ansible_exec import StageOutcome
from dit.run.driver import Driver, RunOptions, RunResult
from dit.run.journal import Journal
from dit.run.localmode import snapshot_tree
from dit.run.procs import pid_alive
from dit.scenario import load
from tests.conftest import write_scenario

MY_MODULES = ("dit_sysfs", "dit_cgroup")


def _memory_root() -> Path:
    if os.geteuid() != 0:
        pytest.skip("the memory condition creates real cgroups: needs root")
    root = Path(cgroup_memory_root())
    if not (root / "cgroup.controllers").exists() and not (root / "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup memory controller at {root}")
    return root


class ApplyOnly(Driver):
    """The real driver, stopping after apply: snapshots around it, optionally applies twice and
    leaves a journaled run process in a device's cgroup, as the load generator would."""

    def __init__(self, *args: Any, reapply: bool = False, linger: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reapply = reapply
        self.linger = linger
        self.applied: list[
            StageOutcome
        ] = []  # every stage outcome, in order (Driver.outcomes keeps the last per stage)
        self.before: dict[str, Any] = {}
        self.during: dict[str, Any] = {}
        self.lingering: subprocess.Popen[bytes] | None = None

    def snapshot(self) -> dict[str, Any]:
        trees = {h: snapshot_tree(Path(self.inv.hostvars[h]["sysfs_root"])) for h in self.inv.hosts}
        root = Path(cgroup_memory_root())
        mine = sorted(p.name for p in root.iterdir() if p.is_dir() and self.run.run_id in p.name)
        return {"sysfs": trees, "cgroups": mine}

    def _stage(
        self, stage: str, extravars: dict[str, Any], render_context: dict[str, Any] | None = None
    ) -> StageOutcome:
        outcome = super()._stage(stage, extravars, render_context)
        self.applied.append(outcome)
        return outcome

    def _apply(self) -> None:
        self.before = self.snapshot()
        try:
            super()._apply()
            if self.reapply:
                super()._apply()
            if self.linger is not None:
                self._start_lingering(self.linger)
        finally:
            self.during = self.snapshot()

    def _start_lingering(self, host: str) -> None:
        """A tagged run process inside ``host``'s cgroup, journaled first (as dit_proc does)."""
        cgroup = self.processes[host].cgroup
        assert cgroup is not None
        tag = {"run_id": self.run.run_id, "host": host, "tag": "linger"}
        Journal(self.run.journal).record_changes(host, [{"op": "process", "undo": tag}], source="test")

        def join() -> None:
            Path(cgroup, "cgroup.procs").write_text(str(os.getpid()), encoding="ascii")

        self.lingering = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            env={**os.environ, "DIT_RUN_ID": self.run.run_id, "DIT_HOST": host, "DIT_TAG": "linger"},
            start_new_session=True,
            preexec_fn=join,  # noqa: PLW1509 - only joins the cgroup
        )

    def _profile(self) -> None:
        pass

    def _collect(self) -> None:
        pass

    def _aggregate(self) -> None:
        pass

    def _optimise(self) -> dict[str, Any] | None:
        return None


def run(path: Path, runs_dir: Path, **kwargs: Any) -> tuple[ApplyOnly, RunResult]:
    (scenario,) = load(path)
    driver = ApplyOnly(
        scenario, RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO())), **kwargs
    )
    result = driver.execute()
    if driver.lingering is not None:
        driver.lingering.wait(timeout=30)
    return driver, result


def read(tree: dict[str, str], policy: int, name: str) -> str:
    return tree[f"devices/system/cpu/cpufreq/policy{policy}/{name}"].strip()


def test_caps_pinning_and_memory_limit_are_applied_idempotently_and_restored_exactly(
    scenario_dir: Path, runs_dir: Path
) -> None:
    root = _memory_root()
    path = write_scenario(
        scenario_dir,
        name="hwrestore",
        inference={"enabled": False},
        optimisation={"enabled": False},
        edge_server={"policy": "SJF", "nominal_frequency": True, "profile_capacity": False},
        hardware={
            "device1": {"cpu_freq_mhz": 1200, "governor": "performance", "memory_limit_mb": 256},
            "device2": {"cpu_freq_mhz": 600},
        },
    )
    driver, result = run(path, runs_dir, reapply=True, linger="device1")
    assert result.state == "completed", result.error
    run_id = driver.run.run_id

    # During the run: every condition was in place.
    during = driver.during["sysfs"]
    assert (
        read(during["device1"], 0, "scaling_max_freq"),
        read(during["device1"], 0, "scaling_governor"),
    ) == (
        "1200000",
        "performance",
    )
    assert read(during["device2"], 0, "scaling_max_freq") == "600000"
    assert read(during["device2"], 0, "scaling_governor") == "ondemand"  # not asked: untouched
    for policy in range(4):
        assert read(during["edge"], policy, "scaling_max_freq") == "3600000"
        assert read(during["edge"], policy, "scaling_min_freq") == "3600000"
    assert during["edge"]["devices/system/cpu/intel_pstate/no_turbo"].strip() == "1"
    cgroup = f"dit-{run_id}-device1"
    assert driver.during["cgroups"] == [cgroup]
    assert driver.processes["device1"].cgroup == str(root / cgroup)

    # The second apply of the same scenario changed nothing (the modules of these conditions).
    first, second = (o for o in driver.applied if o.stage == "apply")
    mine = [e for events in second.results.values() for e in events if e.action in MY_MODULES]
    assert {(e.host, e.action) for e in mine} == {
        ("device1", "dit_sysfs"),
        ("device1", "dit_cgroup"),
        ("device2", "dit_sysfs"),
        ("edge", "dit_sysfs"),
    }
    assert all(e.status == "ok" for e in mine), [(e.host, e.action, e.status) for e in mine]
    assert all(
        e.status == "changed" for events in first.results.values() for e in events if e.action in MY_MODULES
    )

    # After teardown: exactly as before, the lingering process was reaped before its cgroup went.
    assert driver.snapshot() == driver.before
    assert driver.before["cgroups"] == []
    assert driver.lingering is not None and driver.lingering.returncode == -signal.SIGTERM
    assert not pid_alive(driver.lingering.pid)
    assert Journal(driver.run.journal).pending() == []
    metadata_nodes = json.loads((driver.run.path / "metadata.json").read_text())["nodes"]
    assert metadata_nodes["device1"]["memory_controller"] in ("v1", "v2")


def test_a_failure_half_way_through_apply_undoes_what_was_applied(scenario_dir: Path, runs_dir: Path) -> None:
    _memory_root()
    path = write_scenario(
        scenario_dir,
        name="hwfail",
        inference={"enabled": False},
        optimisation={"enabled": False},
        edge_server={"policy": "SJF", "nominal_frequency": True, "profile_capacity": False},
        hardware={
            "device1": {"cpu_freq_mhz": 1200, "memory_limit_mb": 128},
            "device2": {"cpu_freq_mhz": 2000},  # a 1.8 GHz board cannot run at 2 GHz
        },
    )
    driver, result = run(path, runs_dir)
    assert result.state == "failed"
    assert "hardware.device2.cpu_freq_mhz: 2000 MHz is above cpuinfo_max_freq 1800 MHz" in str(result.error)

    # device1's cap, its cgroup and the edge pinning had been applied before the failure ...
    assert read(driver.during["sysfs"]["device1"], 0, "scaling_max_freq") == "1200000"
    assert driver.during["cgroups"] == [f"dit-{driver.run.run_id}-device1"]
    assert driver.during["sysfs"]["device2"] == driver.before["sysfs"]["device2"]  # refused: untouched
    # ... and teardown undid all of it.
    assert driver.snapshot() == driver.before
    assert Journal(driver.run.journal).pending() == []
