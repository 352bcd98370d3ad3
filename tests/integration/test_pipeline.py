"""The whole local pipeline, for real: Ansible stages, device agents, edge service, teardown."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from dit.run.driver import Driver, RunOptions
from dit.run.inventory import local_cpu_split
from dit.run.journal import Journal
from dit.run.localmode import cpu_quota_usable, default_cpu_share_pct
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.conftest import write_scenario

PHASES = ["local_ns", "transmission_ns", "barrier_ns", "queue_ns", "remote_ns", "return_ns"]


def run_local(path: Path, runs_dir: Path) -> list[Path]:
    dirs = []
    for scenario in load(path):
        quiet = Console(file=io.StringIO())
        result = Driver(scenario, RunOptions(runs_root=runs_dir, console=quiet)).execute()
        assert result.state == "completed", result.error
        dirs.append(result.run_dir)
    return dirs


def test_local_pipeline_runs_all_stages_and_leaves_nothing(
    scenario_dir: Path, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # local mode's default (the suite turns the per-device CPU cgroups off elsewhere: tests/conftest.py)
    monkeypatch.delenv("DIT_LOCAL_CPU_SHARE")
    path = write_scenario(scenario_dir)
    (run_dir,) = run_local(path, runs_dir)
    run = RunDir(run_dir)

    # The run directory holds what the issue names.
    for name in (
        "scenario.yaml",
        "metadata.json",
        "journal.jsonl",
        "run.log",
        "status.json",
        "inventory.yml",
    ):
        assert (run_dir / name).is_file(), name
    for host in ("edge", "device1", "device2"):
        assert (run_dir / "raw" / host / f"{host}_snapshot.json").is_file()
        assert (run_dir / "ansible" / "apply" / "project" / "apply.yml").is_file()
    for device in ("device1", "device2"):
        for suffix in ("layers.csv", "inference.csv", "origin.json", "ping.json"):
            assert (run_dir / "raw" / device / f"{device}_{suffix}").is_file(), suffix
    for name in ("layers.csv", "feasibility.csv", "links.csv", "phases.csv"):
        assert (run_dir / "aggregate" / name).is_file(), name
    assert list((run_dir / "optimise").glob("greedy-total_delay-SJF.json"))

    # Metadata is written before anything on any node changed (but the lease preflight takes first).
    metadata = json.loads((run_dir / "metadata.json").read_text())
    records = Journal(run.journal).records()
    # One machine: whichever host took the lease first journaled it; the others found it theirs.
    assert {r["host"] for r in records if r.get("op") == "lease"} <= {"edge", "device1", "device2"}
    assert any(r.get("op") == "lease" for r in records)
    first_change = min(r["t_wall_ns"] for r in records if "id" in r and r["op"] != "lease")
    assert metadata["written_wall_ns"] < first_change
    assert metadata["scenario"]["hash"] == next(iter(load(path))).hash
    assert set(metadata["nodes"]) == {"edge", "device1", "device2"}
    # each device in its own CPU cgroup by default where this machine can make one (root, cpu controller)
    shares = {d: metadata["conditions"].get(d, {}).get("cpu_share") for d in ("device1", "device2")}
    if cpu_quota_usable():
        device_cpus = len(local_cpu_split()[1]) or 1
        for device, share in shares.items():
            assert share is not None, device
            pct = default_cpu_share_pct(device_cpus, 2)
            assert share["cgroup_cpu_quota_us"] == share["cgroup_cpu_period_us"] * pct // 100, share
        assert shares["device1"]["cgroup_cpu_path"] != shares["device2"]["cgroup_cpu_path"]
    else:
        assert shares == {"device1": None, "device2": None}
    assert all(n["ntp"]["source"] == "local" for n in metadata["nodes"].values())
    assert metadata["versions"]["ansible-core"]

    # Integer-ns phases that add up exactly per request; every vector, repetition and device.
    phases = pd.read_csv(run_dir / "aggregate" / "phases.csv")
    assert len(phases) == 2 * 3 * 3
    for column in [*PHASES, "total_ns"]:
        assert pd.api.types.is_integer_dtype(phases[column]), column
        assert (phases[column] >= 0).all(), column
    assert (phases[PHASES].sum(axis=1) == phases["total_ns"]).all()
    local_only = phases[phases["partition_point"] == 4]
    assert (local_only[PHASES[1:]] == 0).all().all()

    # Start lateness of every device was measured against the common instant.
    status = run.status()
    assert status["state"] == "completed"
    assert set(status["lateness_ns"]) == {"device1", "device2"}
    origins = [
        json.loads((run_dir / "raw" / d / f"{d}_origin.json").read_text()) for d in ("device1", "device2")
    ]
    assert origins[0]["start_at_ns"] == origins[1]["start_at_ns"]

    # Every device process was alive when collect checked it: nothing degraded the run (issue 10, item 7).
    assert status["degraded"] == []
    for host in ("edge", "device1", "device2"):
        records = json.loads((run_dir / "raw" / host / f"{host}_processes.json").read_text())
        assert "monitor" in {r["tag"] for r in records}, host
        assert [r for r in records if r["failed"]] == [], host
        # Background processes still run; the agent of the two-phase start keeps a status record too.
        ended = {r["tag"]: r["exit_code"] for r in records if r["state"] != "running"}
        # the edge service is stopped by collect, cleanly, once the devices have collected
        assert ended == ({"edge": 0} if host == "edge" else {"profile": 0}), host
    # ... so what it writes as it stops is fetched, and teardown drops no result unfetched.
    summary = json.loads((run_dir / "raw" / "edge" / "edge_edge_summary.json").read_text())
    assert summary["completed_requests"] == 2 * 2 * 3  # 2 devices, points 0 and 2, 3 repetitions (4 is local)
    assert summary["unfinished_rounds"] == []
    assert status["teardown"]["warnings"] == []

    # Teardown: journal fully replayed, node run dirs gone, no process of the run left.
    assert Journal(run.journal).pending() == []
    assert not any((run_dir / "nodes" / h / run.run_id).exists() for h in ("edge", "device1", "device2"))
    assert run_processes(run.run_id) == []
    # ... and no CPU cgroup of the run
    assert not [s for s in shares.values() if s is not None and Path(s["cgroup_cpu_path"]).exists()]
    # The fake /sys of every node is exactly as the run found it.
    assert (run_dir / "nodes" / "device1" / "sys").is_dir()


@pytest.mark.serial  # compares queueing times: alone, after the parallel pass
def test_policies_show_their_queueing_difference(scenario_dir: Path, runs_dir: Path) -> None:
    """device1 offloads a long job (p=1 of 4), device2 a short one (p=3): SJF serves device2 first,
    RR interleaves them so that device1's queueing includes device2's stage and vice versa."""
    path = write_scenario(
        scenario_dir,
        name="policies",
        model={"name": "fake", "params": {"stages": [{"work": 40, "output_bytes": 64}] * 4}},
        inference={"enabled": True, "partition_points": [[1, 3]], "repetitions": 4},
        sweep={"path": "edge_server.policy", "values": ["RR", "SJF"]},
        optimisation={"enabled": False},
    )
    rr_dir, sjf_dir = run_local(path, runs_dir)

    def server(run_dir: Path) -> pd.DataFrame:
        frame = pd.read_csv(run_dir / "raw" / "edge" / "edge_edge_requests.csv")
        return frame.set_index(["repetition", "device"]).sort_index()

    rr, sjf = server(rr_dir), server(sjf_dir)
    for rep in range(4):
        # SJF: device2's single remaining stage runs first; device1 waits for it.
        assert sjf.loc[(rep, "device2"), "done_ns"] < sjf.loc[(rep, "device1"), "done_ns"]
        assert sjf.loc[(rep, "device2"), "queue_ns"] < sjf.loc[(rep, "device1"), "queue_ns"]
        assert sjf.loc[(rep, "device1"), "queue_ns"] >= 0.5 * sjf.loc[(rep, "device2"), "remote_ns"]
        # RR: device1's first stage runs before device2's only stage (device order), so device2
        # queues behind one of device1's stages, and device1 still finishes last.
        assert rr.loc[(rep, "device2"), "done_ns"] < rr.loc[(rep, "device1"), "done_ns"]
        assert rr.loc[(rep, "device2"), "queue_ns"] >= 0.5 * (rr.loc[(rep, "device1"), "remote_ns"] / 3)
        assert rr.loc[(rep, "device2"), "queue_ns"] > sjf.loc[(rep, "device2"), "queue_ns"]
