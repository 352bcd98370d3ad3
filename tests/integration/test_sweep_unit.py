"""A sweep as one unit on its nodes (local mode): each variant gets exactly its own conditions, read back
on the node while it profiles; the last teardown leaves every node as before the sweep; a driver killed
mid-sweep is undone by `dit cleanup` of any of its variant directories; a finished variant is not run
again."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest
from rich.console import Console

from dit.conditions.cgroup_roots import cgroup_memory_root
from dit.conditions.netem.nfqueue import chain_name
from dit.run.driver import Driver, RunOptions, RunResult
from dit.run.journal import Journal
from dit.run.localmode import snapshot_tree
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.run.sweep import SWEEP_FILE, SweepUnit, run_sweep
from dit.scenario import Scenario, load
from tests.conftest import DIT, HELD, REPO, dit_env, process_tag, write_scenario
from tests.integration.leases import dit, lease_file, tiny_scenario

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("iptables") is None or not Path("/proc/net/netfilter").is_dir(),
    reason="memory limits are real cgroups and delays the userspace link emulator: root and iptables",
)

MAX_FREQ = "devices/system/cpu/cpufreq/policy0/scaling_max_freq"


def variant(directory: Path, index: int, **overrides: Any) -> Scenario:
    """One variant of the sweep 'sweep3' (the same name: one runs directory; its own file, so that
    delay, cap and limit change together, which a sweep's cartesian product cannot express)."""
    sub = directory / str(index)
    sub.mkdir()
    fields: dict[str, Any] = {
        "devices": ["device1"],
        "repetitions": 1,
        "warmup": 0,
        "inference": {"enabled": True, "partition_points": [0], "repetitions": 1},
        "optimisation": {"enabled": False},
        "edge_server": {"policy": "SJF", "profile_capacity": False},
    }
    path = write_scenario(sub, name="sweep3", **(fields | overrides))
    (scenario,) = load(path)
    return scenario


class Reading(Driver):
    """The real driver; as a variant starts profiling, what is in force on device1 is read back."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def _profile(self) -> None:
        cgroup = self.processes["device1"].cgroup
        chains = subprocess.run(
            ["iptables", "-w", "-t", "mangle", "-S"], capture_output=True, text=True
        ).stdout
        limit = None
        if isinstance(cgroup, str):
            for name in ("memory.max", "memory.limit_in_bytes"):
                if (Path(cgroup) / name).is_file():
                    limit = int((Path(cgroup) / name).read_text())
        self.seen.append(
            {
                "max_khz": Path(self.inv.hostvars["device1"]["sysfs_root"], MAX_FREQ).read_text().strip(),
                "memory_bytes": limit,
                "chain": chain_name(self.node.run_id, "device1") in chains,
                "node_run_id": self.node.run_id,
            }
        )
        super()._profile()


def run_completed(variants: list[Scenario], runs_dir: Path, driver: type[Driver]) -> list[RunDir]:
    """Run ``variants`` as `dit run` of a sweep does, each through ``driver``; every one completed."""
    options = RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO()))

    def runner(scenario: Scenario, unit: SweepUnit | None) -> tuple[Path | None, str, str | None, RunResult]:
        result = driver(scenario, options, sweep=unit).execute()
        return result.run_dir, result.state, result.error, result

    outcomes = run_sweep(variants, runs_dir, Console(file=io.StringIO()), runner)
    assert [o.state for o in outcomes] == ["completed"] * len(variants), [o.error for o in outcomes]
    return [RunDir(o.run_dir) for o in outcomes if o.run_dir is not None]


def test_three_variants_each_get_their_own_conditions_and_the_sweep_restores_everything(
    scenario_dir: Path, runs_dir: Path
) -> None:
    memory_root = Path(cgroup_memory_root())
    delay = {"device1": {"destinations": {"edge": {"delay_ms": 20}}}}
    variants = [
        variant(scenario_dir, 0, hardware={"device1": {"cpu_freq_mhz": 1200, "memory_limit_mb": 256}}, network=delay),
        # memory stays; cap and delay change
        variant(scenario_dir, 1, hardware={"device1": {"cpu_freq_mhz": 600, "memory_limit_mb": 256}},
                network={"device1": {"destinations": {"edge": {"delay_ms": 5}}}}),
        # cap stays; memory changes, no delay at all
        variant(scenario_dir, 2, hardware={"device1": {"cpu_freq_mhz": 600, "memory_limit_mb": 128}}),
    ]  # fmt: skip
    Reading.seen = []
    before_cgroups = sorted(p.name for p in memory_root.iterdir() if p.name.startswith("dit-sweep3"))

    runs = run_completed(variants, runs_dir, Reading)
    home = runs[0]

    # One unit on the nodes: one run id, one preflight (the others reuse it, and say whose it is).
    assert {s["node_run_id"] for s in Reading.seen} == {home.run_id}
    assert set(runs[0].status()["stage_ns"]) >= {"preflight", "apply", "teardown"}
    for run in runs[1:]:
        assert "preflight" not in run.status()["stage_ns"]
        meta = json.loads((run.path / "metadata.json").read_text())
        assert meta["sweep"] == {
            "home": str(home.path),
            "node_run_id": home.run_id,
            "preflight_run": str(home.path),
        }
        assert json.loads((run.path / SWEEP_FILE).read_text())["home"] == str(home.path)
        assert (run.path / "raw" / "device1" / "device1_ping_baseline.json").is_file()
        # apply (its own conditions), profile, collect and the variant's teardown (what the next variant
        # does not keep) still share one ansible-playbook start (issue 48)
        starts = sorted(p.parts[-3] for p in run.path.glob("ansible/*/artifacts/*"))
        assert starts == ["apply"], starts

    # Each variant had exactly its own conditions on the node.
    mb = 1024 * 1024
    assert [(s["max_khz"], s["memory_bytes"], s["chain"]) for s in Reading.seen] == [
        ("1200000", 256 * mb, True),
        ("600000", 256 * mb, True),
        ("600000", 128 * mb, False),
    ]
    # ... what stayed was kept, not undone and applied again
    # (the monitors too: they run on, handing each variant over to the next)
    assert runs[0].status()["sweep_kept"] == {"device1": ["memory", "monitors"], "edge": ["monitors"]}
    assert runs[1].status()["sweep_kept"] == {"device1": ["cpufreq", "monitors"], "edge": ["monitors"]}
    # ... and the network self-check of every variant with a delay measured its own delay
    for run, delay_ms in zip(runs[:2], (20, 5), strict=True):
        check = pd.read_csv(run.path / "aggregate" / "netem_check.csv")
        row = check[(check["device"] == "device1") & (check["target"] == "edge")].iloc[0]
        assert (row["shaping"], row["intended_delay_ms"], bool(row["pass"])) == ("applied", delay_ms, True)

    # Every node as before the sweep: the fake sysfs, no cgroup, no chain, no process, nothing pending.
    sysfs = home.path / "nodes" / "device1" / "sys"
    assert snapshot_tree(sysfs)[MAX_FREQ].strip() == "1800000"
    assert sorted(p.name for p in memory_root.iterdir() if p.name.startswith("dit-sweep3")) == before_cgroups
    assert Journal(home.journal).pending() == []
    assert run_processes(home.run_id) == []
    assert not (home.path / "nodes" / "device1" / home.run_id).exists()
    assert json.loads((home.path / SWEEP_FILE).read_text())["state"] == "closed"
    # each variant's results are its own: the inference of each is in its own raw/
    for run in runs:
        assert (run.path / "raw" / "device1" / "device1_inference.csv").is_file(), sorted(
            (run.path / "raw").rglob("*")
        )


class Tagged(Driver):
    """The real driver; as a variant starts profiling, the pids of the run's processes by host and tag."""

    seen: ClassVar[list[dict[tuple[str, str], int]]] = []

    def _profile(self) -> None:
        found = {}
        for proc in run_processes(self.node.run_id):
            env = proc.environ()
            found[(env.get("DIT_HOST", ""), env.get("DIT_TAG", ""))] = proc.pid
        self.seen.append(found)
        super()._profile()


def test_the_link_emulator_and_the_monitors_run_on_and_give_each_variant_its_own_figures(
    scenario_dir: Path, runs_dir: Path
) -> None:
    """Variants that differ in a runtime parameter keep the delay (the userspace link emulator and its
    rules) and the monitors in force: the same processes serve all three, and each variant's collect
    has figures counted from its own hand-over, not the sweep's start."""
    delay = {"device1": {"destinations": {"edge": {"delay_ms": 20}}}}
    # (not the seed: the emulator's loss draws are seeded from it, so a new seed is a new link)
    variants = [
        variant(
            scenario_dir,
            i,
            network=delay,
            inference={"enabled": True, "partition_points": [0], "repetitions": i + 1},
        )
        for i in range(3)
    ]
    Tagged.seen = []

    runs = run_completed(variants, runs_dir, Tagged)
    home = runs[0]

    # The same emulator and monitors in every variant; the variant's own processes are new each time.
    kept = [("device1", "link-emulator"), ("device1", "monitor"), ("edge", "monitor")]
    for key in kept:
        assert len({seen[key] for seen in Tagged.seen}) == 1, (key, Tagged.seen)
    assert len({seen[("edge", "edge")] for seen in Tagged.seen}) == 3
    for run in runs[:2]:
        assert run.status()["sweep_kept"] == {"device1": ["monitors", "netem"], "edge": ["monitors"]}
        # nothing of them applied again: only the directory and the variant's own processes
        assert "Start the link emulator" not in (runs[runs.index(run) + 1].path / "run.log").read_text()

    # Each variant's figures are its own: the emulator counted afresh from its hand-over, the monitor's
    # rows began anew, and the self-check measured the delay in every variant.
    previous_end = 0
    last_row = 0
    for run in runs:
        raw = run.path / "raw"
        stats = json.loads((raw / "device1" / "device1_link_emulator.json").read_text())
        assert stats["started_mono_ns"] > previous_end and stats["state"] == "running"
        assert 0 < sum(p["packets"] for p in stats["profiles"]) < 200
        previous_end = stats["written_mono_ns"]
        rows = pd.read_csv(raw / "device1" / "device1_monitor.csv")
        assert len(rows) > 0 and int(rows["t_mono_ns"].iloc[0]) > last_row
        last_row = int(rows["t_mono_ns"].iloc[-1])
        check = pd.read_csv(run.path / "aggregate" / "netem_check.csv")
        row = check[(check["device"] == "device1") & (check["target"] == "edge")].iloc[0]
        assert (row["shaping"], row["intended_delay_ms"], bool(row["pass"])) == ("applied", 20, True)

    # The last teardown stopped them and undid everything.
    listed = subprocess.run(["iptables", "-w", "-t", "mangle", "-S"], capture_output=True, text=True).stdout
    assert chain_name(home.run_id, "device1") not in listed
    assert Journal(home.journal).pending() == []
    assert run_processes(home.run_id) == []
    assert not (home.path / "nodes" / "device1" / home.run_id).exists()


def sweep_scenario(directory: Path) -> Path:
    # The first variant profiles at once, the second is held in its profile stage to be killed during it
    # (HELD: its agents sleep till a start instant ten minutes ahead); its cap and memory limit are the
    # first's, kept in force between them (the home's journal).
    return write_scenario(
        directory,
        name="killed",
        warmup=0,
        repetitions=1,
        inference={"enabled": False},
        optimisation={"enabled": False},
        hardware={"device1": {"cpu_freq_mhz": 1200, "memory_limit_mb": 256}},
        sweep={"path": "timing.start_lead_s", "values": [1, HELD["start_lead_s"]]},
    )


def test_sigkill_mid_sweep_then_cleanup_of_any_variant_leaves_nothing(
    scenario_dir: Path, runs_dir: Path
) -> None:
    proc = subprocess.Popen(
        [*DIT, "run", str(sweep_scenario(scenario_dir)), "--runs-dir", str(runs_dir)],
        cwd=REPO,
        env=dit_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # a bound, not a measurement: the second variant's profile, on a loaded machine
        deadline = time.monotonic() + 900
        second: RunDir | None = None
        while time.monotonic() < deadline:
            found = sorted(runs_dir.glob("*/*/status.json"))
            if len(found) == 2:
                second = RunDir(found[1].parent)
                home = RunDir(found[0].parent)
                agents = [p for p in run_processes(home.run_id) if process_tag(p) == "profile"]
                if second.status().get("stage") == "profile" and len(agents) == 2:
                    break
            assert proc.poll() is None, "the sweep ended before its second variant profiled"
            time.sleep(0.1)
        else:
            raise AssertionError("the sweep's second variant never reached its profile stage")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert second is not None
    first = home = RunDir(sorted(runs_dir.glob("*/*/status.json"))[0].parent)  # the unit's home
    assert run_processes(home.run_id), "the agents outlive their driver: only the journal knows them"
    assert Journal(home.journal).pending()
    memory_root = Path(cgroup_memory_root())
    assert (memory_root / f"dit-{home.run_id}-device1").is_dir()
    assert {"cpufreq", "memory"} <= set(home.status()["sweep_kept"]["device1"])  # in force for the second
    lease = lease_file()
    assert json.loads(lease.read_text())["run_id"] == home.run_id

    # dit cleanup of the second variant's directory (not the home) undoes the whole unit
    cleanup = dit("cleanup", str(second.path), timeout=300)
    assert cleanup.returncode == 0, cleanup.stderr + cleanup.stdout
    assert run_processes(home.run_id) == []
    assert Journal(home.journal).pending() == []
    assert not (memory_root / f"dit-{home.run_id}-device1").exists()
    assert not lease.exists()
    sysfs = home.path / "nodes" / "device1" / "sys"
    assert snapshot_tree(sysfs)[MAX_FREQ].strip() == "1800000"
    for host in ("edge", "device1", "device2"):
        assert not (home.path / "nodes" / host / home.run_id).exists()
    # what the second variant's nodes held is in its raw/, fetched by cleanup; both say how they ended
    assert (second.path / "raw" / "device1" / "device1_monitor.csv").is_file()
    assert (home.path / "raw" / "device1" / "device1_monitor.csv").is_file()  # collected as it completed
    assert second.status()["state"] == "failed"
    assert first.status()["state"] == "completed"
    # cleaning up again, from the other variant this time, is harmless
    again = dit("cleanup", str(first.path), timeout=300)
    assert again.returncode == 0, again.stderr + again.stdout


def test_a_sweep_run_again_skips_its_completed_variants(scenario_dir: Path, runs_dir: Path) -> None:
    path = tiny_scenario(scenario_dir, name="resumed", sweep={"path": "seed", "values": [1, 2]})
    argv = ("run", str(path), "--runs-dir", str(runs_dir))
    first = dit(*argv)
    assert first.returncode == 0, first.stderr + first.stdout
    made = sorted(runs_dir.glob("resumed/*/status.json"))
    assert len(made) == 2
    again = dit(*argv)
    assert again.returncode == 0, again.stderr + again.stdout
    assert sorted(runs_dir.glob("resumed/*/status.json")) == made  # nothing ran
    assert again.stderr.count("already finished in") == 2, again.stderr
