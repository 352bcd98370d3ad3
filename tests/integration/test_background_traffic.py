"""A local pipeline run with background traffic, recorded netem shaping with a varying delay and
the optional iperf3 link test: every process real (iperf3 over loopback), tc recorded (no
sch_netem here), everything undone at teardown, the network aggregates written."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

import dit.run.driver as driver_module
from dit.analysis.links import iperf3_rate_bps
from dit.ansible_data import load_unsafe_yaml, unsafe_yaml
from dit.conditions.netem.check import aggregate_network
from dit.run.driver import Driver, RunOptions
from dit.run.inventory import RunInventory, local_inventory
from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.conftest import write_scenario

INTERVAL = re.compile(r"\]\s+\d+\.\d+-\d+\.\d+\s+sec\s+[\d.]+ \w?Bytes\s+([\d.]+) (\w?)bits/sec")


def mbits(log: str) -> list[float]:
    scale = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}
    return [float(m.group(1)) * scale[m.group(2)] for m in INTERVAL.finditer(log)]


@pytest.mark.serial  # the stream's rate is measured: alone, after the parallel pass
def test_background_stream_recorded_shaping_and_link_test(
    scenario_dir: Path, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = local_inventory

    def with_iperf3_test(run_dir: Path, devices: tuple[str, ...]) -> RunInventory:
        inventory = original(run_dir, devices)
        path = Path(inventory.source)
        data: dict[str, Any] = load_unsafe_yaml(path.read_text())
        data["all"]["children"]["devices"]["hosts"]["device1"]["dit_iperf3_test"] = True
        data["all"]["children"]["devices"]["hosts"]["device1"]["dit_iperf3_seconds"] = 1
        path.write_text(unsafe_yaml(data))
        return inventory

    monkeypatch.setattr(driver_module, "local_inventory", with_iperf3_test)
    path = write_scenario(
        scenario_dir,
        name="traffic",
        inference={"enabled": True, "partition_points": [0, 4], "repetitions": 2},
        optimisation={"enabled": False},
        timing={"start_lead_s": 1.0, "settle_s": 2.0},
        background_traffic={"device1": {"bitrate_mbit": 8}},
        network={
            "device2": {
                # the recorded tc path under test (auto would take the userspace backend as root)
                "network_backend": "netem",
                "jitter_ms": 1,
                "variation": {"kind": "square", "low_ms": 10, "high_ms": 30, "period_s": 1},
                "destinations": {"edge": {"delay_ms": 40}},
            }
        },
    )
    (scenario,) = load(path)
    result = Driver(scenario, RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO()))).execute()
    assert result.state == "completed", result.error
    run_dir = result.run_dir
    run = RunDir(run_dir)
    raw = run_dir / "raw"

    # Background traffic: the device sent at the asked bitrate, the edge's server received it.
    client_log = (raw / "device1" / "device1_background_traffic.log").read_text()
    rates = mbits(client_log)
    assert len(rates) >= 2, client_log
    assert 7.0 <= sum(rates[1:]) / len(rates[1:]) <= 9.0, rates
    # from device1's own loopback address (local mode), which its network condition would select
    inventory = load_unsafe_yaml((run_dir / "inventory.yml").read_text())
    source = inventory["all"]["children"]["devices"]["hosts"]["device1"]["dit_source_address"]
    assert source.startswith("127.") and source != "127.0.0.1"
    assert (
        f"Accepted connection from {source}" in (raw / "edge" / "edge_iperf3_server_device1.log").read_text()
    )

    # The link test: iperf3 JSON towards the edge, preferred by links.csv.
    doc = json.loads((raw / "device1" / "device1_iperf3.json").read_text())
    assert iperf3_rate_bps(doc) is not None
    links = pd.read_csv(run_dir / "aggregate" / "links.csv").set_index(["device", "target"])
    assert links.loc[("device1", "edge"), "rate_source"] == "iperf3"
    # Every link was pinged: device -> edge and device -> device.
    assert set(links.index) == {
        ("device1", "edge"),
        ("device1", "device2"),
        ("device2", "edge"),
        ("device2", "device1"),
    }
    assert links["rtt_ns_mean"].notna().all()

    # netem on device2 was recorded: the tree, the variation's changes, and the undo at teardown.
    log = [json.loads(line) for line in (run_dir / "nodes" / "device2" / f"{run.run_id}.tc.jsonl").open()]
    tree = [" ".join(r["argv"]) for r in log if r.get("source") == "dit_tc"]
    assert tree[0] == "tc qdisc replace dev lo root handle 1: htb default 1"
    assert "tc qdisc replace dev lo parent 1:1 handle 10: netem delay 10ms 1ms" in tree
    assert "tc qdisc replace dev lo parent 1:11 handle 11: netem delay 40ms" in tree
    assert (
        "tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst 127.0.0.1/32 flowid 1:11" in tree
    )
    varied = [r["argv"][-2] for r in log if r.get("source") == "netem-vary"]
    assert varied[:2] == ["10ms", "30ms"]
    assert log[-1] == {"argv": ["tc", "qdisc", "del", "dev", "lo", "root"], "undo": True}
    assert not list((run_dir / "nodes" / "device2").glob("*.state.json"))

    # The aggregates of the network: changes aligned on the origin, the self-check per link.
    aggregate_network(run_dir)
    changes = pd.read_csv(run_dir / "aggregate" / "netem_changes.csv")
    assert set(changes["device"]) == {"device2"} and len(changes) >= 2
    origin = json.loads((raw / "device2" / "device2_origin.json").read_text())
    assert (changes["t_ns"] == changes["t_mono_ns"] - origin["origin_mono_ns"]).all()
    assert list(changes["delay_ms"][:2]) == [10, 30]
    check = pd.read_csv(run_dir / "aggregate" / "netem_check.csv")
    # Every link of the shaped device: to the edge and to the other device, each against its
    # unshaped baseline measured at preflight (recorded trees: no pass/fail).
    rows = {r["target"]: r for r in check.to_dict("records")}
    assert set(rows) == {"edge", "device1"} and set(check["device"]) == {"device2"}
    row = rows["edge"]
    assert row["shaping"] == "recorded" and row["intended_delay_ms"] == 40 and row["pings"] == 10
    assert row["baseline_rtt_ms"] > 0 and pd.isna(row["pass"]) and row["tolerance_ms"] > 0
    assert row["difference_ms"] == pytest.approx(row["measured_rtt_ms"] - row["baseline_rtt_ms"] - 40)
    assert rows["device1"]["pings"] == 10 and rows["device1"]["baseline_rtt_ms"] > 0
    baseline = json.loads((raw / "device2" / "device2_ping_baseline.json").read_text())
    assert [b["target"] for b in baseline] == ["edge", "device1"]

    # Teardown: every record undone, both iperf3 processes and netem-vary reaped.
    assert Journal(run.journal).pending() == []
    tags = {r["undo"].get("tag") for r in Journal(run.journal).records() if r.get("op") == "process"}
    assert {"iperf3-client", "iperf3-server-device1", "iperf3-link-device1", "netem-vary"} <= tags
    assert run_processes(run.run_id) == []
