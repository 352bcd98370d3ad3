"""The emulated rack for real: `dit rack up`, work over SSH inside each node's cgroup, `dit rack down`.

Each test's rack has its own name, subnet and state dir, so it cannot meet a user's rack.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import DIT, REPO, dit_env


def _usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, cgroups)"
    if not Path("/usr/sbin/sshd").exists():
        return "needs openssh-server"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = subprocess.run(["ip", "netns", "add", "dit-rack-probe"], capture_output=True)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", "dit-rack-probe"], capture_output=True)
    return None


SKIP = _usable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]
CGROUPS = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class RackHandle:
    name: str
    state_dir: Path
    inventory: Path
    hosts: dict[str, dict[str, object]]
    key: str
    known_hosts: str

    def ssh(self, host: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        address = str(self.hosts[host]["ansible_host"])
        argv = [
            "ssh", "-i", self.key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", f"root@{address}", command,
        ]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def dit(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DIT, *args], cwd=REPO, env=dit_env(), capture_output=True, text=True, timeout=timeout
    )


def rack_up(state_dir: Path, name: str, subnet: str, *extra: str) -> RackHandle:
    result = dit("rack", "up", "--name", name, "--subnet", subnet, "--state-dir", str(state_dir), *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    inventory = state_dir / "inventory.yml"
    doc = yaml.safe_load(inventory.read_text())
    groups = doc["all"]["children"]
    hosts = {**groups["edge"]["hosts"], **groups["devices"]["hosts"]}
    return RackHandle(
        name,
        state_dir,
        inventory,
        hosts,
        doc["all"]["vars"]["ansible_ssh_private_key_file"],
        str(state_dir / "known_hosts"),
    )


def leftovers(name: str) -> list[str]:
    """Everything a rack called ``name`` could leave behind on this machine."""
    found: list[str] = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(f"dit-{name}-")]
    found += [f"link {p.name}" for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"dr-{name}-")]
    found += [f"cgroup {p}" for p in CGROUPS.glob(f"*/dit-{name}")]
    found += [f"cgroup {p}" for p in CGROUPS.glob(f"dit-{name}")]
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found += [
        f"process {line.strip()}"
        for line in ps.splitlines()
        if f"/dit-{name}-" in line or f"rack-{name}/" in line
    ]
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: a killed process whose parent (here PID 1) has not reaped it yet
    is a zombie, which runs nothing and holds no resources but its pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def node_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for procs in CGROUPS.glob(f"cpu/dit-{name}/*/cgroup.procs"):
        pids |= {int(p) for p in procs.read_text().split()}
    return pids


@pytest.fixture(scope="module")
def rack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RackHandle]:
    state_dir = tmp_path_factory.mktemp("rack") / "rack-t14"
    handle = rack_up(
        state_dir, "t14", "10.213.14", "--devices", "3", "--cpu-share", "30", "--memory-mb", "384"
    )
    try:
        yield handle
    finally:
        dit("rack", "down", "--state-dir", str(state_dir))


def test_rack_up_three_devices_each_in_its_namespace_and_cgroup(rack: RackHandle) -> None:
    assert list(rack.hosts) == ["edge", "device1", "device2", "device3"]
    status = dit("rack", "status", "--state-dir", str(rack.state_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    assert "missing" not in status.stdout
    edge = str(rack.hosts["edge"]["dit_inference_address"])
    for host, hostvars in rack.hosts.items():
        result = rack.ssh(
            host,
            "grep -E ':(cpu|memory|cpuset):' /proc/self/cgroup; ip -br addr show inf0; "
            f"ping -c 1 -W 2 {edge} >/dev/null && echo edge-reachable",
        )
        assert result.returncode == 0, result.stderr
        assert f":cpu:/dit-t14/{host}" in result.stdout and f":memory:/dit-t14/{host}" in result.stdout
        assert str(hostvars["ansible_host"]) + "/24" in result.stdout
        assert "edge-reachable" in result.stdout
    quota = (CGROUPS / "cpu/dit-t14/device2/cpu.cfs_quota_us").read_text().strip()
    period = (CGROUPS / "cpu/dit-t14/device2/cpu.cfs_period_us").read_text().strip()
    assert (quota, period) == ("1000", "3334")  # 30 %: the kernel's minimum quota, the finest grain


def test_a_busy_loop_gets_its_cpu_share(rack: RackHandle) -> None:
    """CPU time over wall time of a busy loop started over SSH inside device1's 30 % quota."""
    loop = (
        "python3 -c 'import time\n"
        "w0, c0 = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - w0 < 6: pass\n"
        "print((time.process_time() - c0) / (time.monotonic() - w0))'"
    )
    result = rack.ssh("device1", loop)
    assert result.returncode == 0, result.stderr
    share = float(result.stdout.strip())
    load = os.getloadavg()[0]
    assert 0.28 <= share <= 0.32, f"busy loop got {share:.3f} of a CPU in a 30 % share (load {load:.2f})"


def test_the_memory_limit_is_enforced(rack: RackHandle) -> None:
    # The node sees its own limit where the load generator looks for it (its cgroup under /sys).
    own = rack.ssh(
        "device2",
        "cat /sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3)/memory.limit_in_bytes",
    )
    assert own.stdout.strip() == str(384 << 20), own.stderr
    allocate = 'python3 -c \'b = bytearray({mb} << 20); b[::4096] = b"x" * len(b[::4096]); print("ok")\''
    small = rack.ssh("device2", allocate.format(mb=64))
    assert small.returncode == 0 and small.stdout.strip() == "ok", small.stderr
    big = rack.ssh("device2", allocate.format(mb=512))
    assert big.returncode != 0 and "ok" not in big.stdout
    failcnt = int((CGROUPS / "memory/dit-t14/device2/memory.failcnt").read_text())
    assert failcnt > 0


def test_the_quickstart_runs_over_ssh_on_the_rack(rack: RackHandle, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = dit(
        "run", "scenarios/quickstart.yaml", "-i", str(rack.inventory), "--runs-dir", str(runs), timeout=1500
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = (runs / "quickstart").iterdir()
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["mode"] == "inventory"
    pings = json.loads((run_dir / "raw" / "device1" / "device1_ping.json").read_text())
    to_edge = next(p for p in pings if p["target"] == "edge")  # one record per link of the device
    assert to_edge["address"] == rack.hosts["edge"]["dit_inference_address"]
    assert {p["target"] for p in pings} == {"edge", "device2"}
    log = (run_dir / "run.log").read_text()
    # This kernel has no sch_netem: device1's 5 ms are recorded, and preflight says so.
    assert "device1: kernel" in log and "has no sch_netem" in log
    assert (run_dir / "aggregate" / "phases.csv").is_file()
    # The rack gives every node an RT budget, so the devices waited for the start at SCHED_FIFO.
    for device in ("device1", "device2"):
        origin = json.loads((run_dir / "raw" / device / f"{device}_origin.json").read_text())
        assert origin["start_sched"]["policy"] == "SCHED_FIFO", origin["start_sched"]
    status = json.loads((run_dir / "status.json").read_text())
    print("start lateness ns:", status.get("lateness_ns"), "load average:", os.getloadavg())


def test_rack_down_leaves_nothing(tmp_path: Path) -> None:
    handle = rack_up(tmp_path / "rack-t15", "t15", "10.213.15", "--devices", "2")
    busy = handle.ssh("device1", "nohup sleep 600 >/dev/null 2>&1 & echo started")
    assert busy.stdout.strip() == "started"
    pids = node_pids("t15")
    assert len(pids) >= 4 and leftovers("t15")  # 3 sshd and the sleep, at least
    result = dit("rack", "down", "--state-dir", str(handle.state_dir))
    assert result.returncode == 0, result.stderr
    assert leftovers("t15") == []
    assert not handle.state_dir.exists()
    for pid in pids:
        assert not running(pid), f"pid {pid} survived rack down"


def test_rack_down_after_rack_up_was_killed_half_way(tmp_path: Path) -> None:
    state_dir = tmp_path / "rack-t16"
    argv = [*DIT, "rack", "up", "--name", "t16", "--subnet", "10.213.16", "--state-dir", str(state_dir)]
    up = subprocess.Popen(argv, cwd=REPO, env=dit_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = state_dir / "journal.jsonl"
    deadline = time.monotonic() + 60
    # Kill it once the first sshd is journaled: namespaces, links and cgroups exist, sshd may run.
    while not (journal.exists() and '"op":"sshd"' in journal.read_text()):
        assert up.poll() is None and time.monotonic() < deadline, "rack up ended before it was killed"
        time.sleep(0.01)
    up.send_signal(signal.SIGKILL)
    up.wait()
    assert leftovers("t16"), "the kill came too late to leave anything behind"
    result = dit("rack", "down", "--state-dir", str(state_dir))
    assert result.returncode == 0, result.stderr
    time.sleep(0.5)  # an sshd started just before the kill is reaped by then
    assert leftovers("t16") == []
    assert not state_dir.exists()


def test_nnpm_shows_the_rack_nodes_on_the_map_probing_green(rack: RackHandle) -> None:
    from dit.web.nodes import Inventory
    from dit.web.probe import Target, ping

    nodes = Inventory(rack.inventory).nodes()
    assert sorted(n.name for n in nodes) == ["device1", "device2", "device3", "edge"]
    assert all(n.lat is not None and n.lon is not None for n in nodes)
    assert len({(n.lat, n.lon) for n in nodes}) == len(nodes)  # distinct markers
    for node in nodes:
        result = asyncio.run(ping(Target(node.name, node.address)))
        assert result.ok, result.detail
