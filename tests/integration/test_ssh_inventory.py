"""`dit run -i INVENTORY`: the same stages against hosts reached over SSH.

The hosts are an emulated rack (`dit rack up`, :mod:`dit.rack`): each a network namespace with its
own address on a bridge and its own sshd (Debian's openssh-server). The filesystem is shared, so
every host gets its own `dit_remote_base`; the clock is shared too (`dit_shared_clock`). The edge
service listens inside the edge namespace and the devices reach it across the bridge, exactly as
the boards reach the edge server over Wi-Fi.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, dit_env, write_scenario

SSHD = "/usr/sbin/sshd"


def _usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not Path(SSHD).exists():
        return "needs openssh-server (./dev installs it as root)"
    if shutil.which("ip") is None:
        return "needs iproute2"
    probe = subprocess.run(["ip", "netns", "add", f"dit-probe-{os.getpid()}"], capture_output=True)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", f"dit-probe-{os.getpid()}"], capture_output=True)
    return None


@pytest.fixture
def rack_inventory(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """An emulated rack of an edge and two devices (`dit rack up`), removed again afterwards."""
    reason = _usable()
    if reason:
        pytest.skip(reason)
    # Not under tmp_path: sshd (StrictModes) takes the rack's keys only below directories that are
    # root's alone, and /tmp is world-writable (docs/rack.md).
    base = Path("/var/lib/dit/tests")
    base.mkdir(parents=True, exist_ok=True)
    for directory in (base.parent, base):
        directory.chmod(0o755)
    state_dir = Path(tempfile.mkdtemp(prefix="tssh-", dir=base)) / "rack"
    up = [
        *DIT,
        "rack",
        "up",
        "--devices",
        "2",
        "--name",
        "tssh",
        "--subnet",
        "10.231.7",
        "--state-dir",
        str(state_dir),
    ]
    result = subprocess.run(up, cwd=REPO, env=dit_env(), capture_output=True, text=True, timeout=300)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        inventory = state_dir / "inventory.yml"
        groups = yaml.safe_load(inventory.read_text())["all"]["children"]
        hosts = {**groups["edge"]["hosts"], **groups["devices"]["hosts"]}
        yield (
            inventory,
            {name: str(h["dit_remote_base"]) for name, h in hosts.items()}
            | {"edge_address": str(hosts["edge"]["dit_inference_address"])},
        )
    finally:
        down = [*DIT, "rack", "down", "--state-dir", str(state_dir)]
        subprocess.run(down, cwd=REPO, env=dit_env(), capture_output=True, timeout=300)
        shutil.rmtree(state_dir.parent, ignore_errors=True)


def test_stages_run_over_ssh_across_namespaces(
    rack_inventory: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    inventory, hosts = rack_inventory
    scenario = write_scenario(tmp_path, name="sshrun")
    runs = tmp_path / "runs"
    result = subprocess.run(
        [*DIT, "run", str(scenario), "-i", str(inventory), "--runs-dir", str(runs)],
        cwd=REPO,
        env=dit_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (run_dir,) = (runs / "sshrun").iterdir()
    run = RunDir(run_dir)
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["mode"] == "inventory"
    assert {n["ntp"]["source"] for n in metadata["nodes"].values()} == {"shared"}
    # The devices pinged the edge server across the bridge, not loopback.
    for device in ("device1", "device2"):
        pings = json.loads((run_dir / "raw" / device / f"{device}_ping.json").read_text())
        to_edge = next(p for p in pings if p["target"] == "edge")  # one record per link of the device
        assert to_edge["address"] == hosts["edge_address"]
        assert to_edge["received"] == 10
    log = (run_dir / "run.log").read_text()
    assert f"edge service listening on {hosts['edge_address']}:" in log
    assert (run_dir / "aggregate" / "phases.csv").is_file()
    # the run's key reached every host over SSH as in local mode: the frames were signed and verified
    status = json.loads((run_dir / "status.json").read_text())
    assert status["edge_channel"] == {"authenticated": True, "refused_frames": 0, "refused": {}}
    assert Journal(run.journal).pending() == []
    assert run_processes(run.run_id) == []
    for host in ("edge", "device1", "device2"):
        assert not Path(hosts[host], run.run_id).exists()
