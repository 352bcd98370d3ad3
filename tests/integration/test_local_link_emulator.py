"""Local mode applies a device's delay for real: the userspace link emulator selects the device by its
own loopback source address, so device1's 30 ms towards the edge reaches its pings and its inference
traffic and not device2's; teardown removes the rules and the emulator.

One local run (the fake model, two devices, two partition points), asserted several ways. Root and
iptables are needed (the userspace backend's own requirements); elsewhere local mode records the
netem commands, as the background-traffic test shows.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from dit.conditions.netem.nfqueue import chain_name
from dit.run.driver import Driver, RunOptions
from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.conftest import write_scenario

DELAY_MS = 30

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("iptables") is None or not Path("/proc/net/netfilter").is_dir(),
    reason="the userspace backend needs root, iptables and nfnetlink",
)


def test_a_local_device_s_delay_reaches_its_own_packets_only(scenario_dir: Path, runs_dir: Path) -> None:
    path = write_scenario(
        scenario_dir,
        name="local-delay",
        inference={"enabled": True, "partition_points": [0, 4], "repetitions": 2},
        optimisation={"enabled": False},
        network={"device1": {"destinations": {"edge": {"delay_ms": DELAY_MS}}}},
    )
    (scenario,) = load(path)
    result = Driver(scenario, RunOptions(runs_root=runs_dir, console=Console(file=io.StringIO()))).execute()
    assert result.state == "completed", result.error
    run_dir = result.run_dir
    run = RunDir(run_dir)
    metadata = json.loads((run_dir / "metadata.json").read_text())

    # The userspace backend applied it (auto, local mode), with device1's own source address.
    built = metadata["conditions"]["device1"]["netem"]
    assert built["netem_backend"] == "userspace"
    source = built["netem_userspace"]["rules"][0][2].removesuffix("/32")
    assert built["netem_userspace"]["rules"][0] == ["!", "-s", f"{source}/32", "-j", "RETURN"]
    assert source.startswith("127.") and source != "127.0.0.1"

    # The pings carry the delay from device1 only: the links' RTT and the self-check against the
    # unshaped preflight baseline (lower bounds only: a loaded machine adds, never removes, time).
    links = pd.read_csv(run_dir / "aggregate" / "links.csv").set_index(["device", "target"])
    device1_ms = links.loc[("device1", "edge"), "rtt_ns_mean"] / 1e6
    device2_ms = links.loc[("device2", "edge"), "rtt_ns_mean"] / 1e6
    assert device1_ms >= DELAY_MS - 0.5 and device2_ms < device1_ms - DELAY_MS / 2, (device1_ms, device2_ms)
    pings = json.loads((run_dir / "raw" / "device1" / "device1_ping_baseline.json").read_text())
    assert pings[0]["target"] == "edge" and pings[0]["argv"][-3:-1] == ["-I", source]
    check = pd.read_csv(run_dir / "aggregate" / "netem_check.csv")
    row = check[(check["device"] == "device1") & (check["target"] == "edge")].iloc[0]
    assert (row["shaping"], row["backend"], row["intended_delay_ms"]) == ("applied", "userspace", DELAY_MS)
    assert row["measured_rtt_ms"] - row["baseline_rtt_ms"] >= DELAY_MS - 0.5
    assert row["emulator"] != "dead"
    # device2 is pinged at its own address, which device1's rule towards the edge does not select
    other = check[(check["device"] == "device1") & (check["target"] == "device2")].iloc[0]
    assert other["intended_delay_ms"] == 0 and other["address"] != "127.0.0.1"
    assert other["measured_rtt_ms"] < DELAY_MS / 2

    # The inference traffic too: device1's request to the edge waits for its delay (its transmission
    # phase runs to the edge's ACK, which is not delayed); device2's does not.
    phases = pd.read_csv(run_dir / "aggregate" / "phases.csv")
    offloaded = phases[phases["partition_point"] == 0].groupby("host")["transmission_ns"].min() / 1e6
    assert offloaded["device1"] >= DELAY_MS - 0.5 and offloaded["device2"] < DELAY_MS / 2, offloaded

    # The emulator's own record: every held packet counted, none lost to a full queue.
    stats = json.loads((run_dir / "raw" / "device1" / "device1_link_emulator.json").read_text())
    assert json.dumps(stats)  # collected
    assert sum(p["packets"] for p in stats["profiles"]) > 0

    # Teardown: the chain, its jump and the emulator are gone.
    listed = subprocess.run(
        ["iptables", "-w", "-t", "mangle", "-S"], capture_output=True, text=True, check=True
    )
    assert chain_name(run.run_id, "device1") not in listed.stdout
    assert Journal(run.journal).pending() == []
    assert run_processes(run.run_id) == []
