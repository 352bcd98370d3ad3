"""The emulated rack for real: `dit rack up`, work over SSH inside each node's cgroup, `dit rack down`.

Each test's rack has its own name, subnet and state dir, so it cannot meet a user's rack. The state
dirs sit under /var/lib/dit/tests, not /tmp: sshd (StrictModes) takes the rack's keys only from a
path whose every directory is root's and not group- or world-writable, and /tmp is world-writable.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
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
    probe = subprocess.run(["ip", "netns", "add", f"dit-rack-probe-{os.getpid()}"], capture_output=True)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", f"dit-rack-probe-{os.getpid()}"], capture_output=True)
    return None


SKIP = _usable()
pytestmark = [pytest.mark.root, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]
CGROUPS = Path("/sys/fs/cgroup")
SECURE_BASE = Path("/var/lib/dit/tests")  # root's all the way up, unlike /tmp


def secure_dir(prefix: str) -> Path:
    """A fresh directory for state dirs under :data:`SECURE_BASE` (removed by the caller)."""
    SECURE_BASE.mkdir(parents=True, exist_ok=True)
    for directory in (SECURE_BASE.parent, SECURE_BASE):
        directory.chmod(0o755)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SECURE_BASE))


@pytest.fixture
def base() -> Iterator[Path]:
    directory = secure_dir("t-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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
            "-o", "ConnectTimeout=10", "-o", f"UserKnownHostsFile={self.known_hosts}",
            f"root@{address}", command,
        ]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    @property
    def cgroup(self) -> str:
        """The rack's parent cgroup (``dit-<name>-<id>``), from ``rack.json``."""
        state = json.loads((self.state_dir / "rack.json").read_text())
        return str(state["nodes"]["edge"]["cgroup"]).split("/")[0]

    def answers(self) -> None:
        """Every node of the rack answers over SSH, from inside its own cgroup."""
        for host in self.hosts:
            result = self.ssh(host, "grep :cpu: /proc/self/cgroup")
            assert result.returncode == 0, f"{host}: {result.stderr}"
            assert f"/{self.cgroup}/{host}" in result.stdout


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


def rack_id(state_dir: Path) -> str:
    from dit.rack.plan import rack_id as plan_rack_id

    return plan_rack_id(state_dir.resolve())


def leftovers(name: str, state_dir: Path) -> list[str]:
    """Everything the rack called ``name`` in ``state_dir`` could leave behind on this machine."""
    rid = rack_id(state_dir)
    prefix = f"dit-{name}-{rid}"
    found: list[str] = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(f"{prefix}-")]
    found += [f"link {p.name}" for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"dr-{rid}-")]
    found += [f"cgroup {p}" for p in CGROUPS.glob(f"*/{prefix}")]
    found += [f"cgroup {p}" for p in CGROUPS.glob(prefix)]
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found += [
        f"process {line.strip()}"
        for line in ps.splitlines()
        if f"/{prefix}-" in line or f"{state_dir}/" in line  # nsenter's argv, sshd's config
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


def node_pids(name: str, state_dir: Path) -> set[int]:
    pids: set[int] = set()
    for procs in CGROUPS.glob(f"cpu/dit-{name}-{rack_id(state_dir)}/*/cgroup.procs"):
        pids |= {int(p) for p in procs.read_text().split()}
    return pids


@pytest.fixture(scope="module")
def rack() -> Iterator[RackHandle]:
    directory = secure_dir("t14-")
    state_dir = directory / "rack-t14"
    try:
        handle = rack_up(
            state_dir, "t14", "10.213.14", "--devices", "3", "--cpu-share", "30", "--memory-mb", "384"
        )
        yield handle
    finally:
        dit("rack", "down", "--state-dir", str(state_dir))
        shutil.rmtree(directory, ignore_errors=True)


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
        cgroup = f"{rack.cgroup}/{host}"
        assert f":cpu:/{cgroup}" in result.stdout and f":memory:/{cgroup}" in result.stdout
        assert str(hostvars["ansible_host"]) + "/24" in result.stdout
        assert "edge-reachable" in result.stdout
    quota = (CGROUPS / f"cpu/{rack.cgroup}/device2/cpu.cfs_quota_us").read_text().strip()
    period = (CGROUPS / f"cpu/{rack.cgroup}/device2/cpu.cfs_period_us").read_text().strip()
    assert (quota, period) == ("1000", "3334")  # 30 %: the kernel's minimum quota, the finest grain


def test_the_rack_s_files_are_root_s_alone_and_sshd_checks_their_modes(rack: RackHandle) -> None:
    def owner_mode(path: Path) -> tuple[int, int, str]:
        st = path.lstat()
        return st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode))

    keys = rack.state_dir / "keys"
    assert owner_mode(rack.state_dir) == (0, 0, "0o700")
    assert owner_mode(keys) == (0, 0, "0o700")
    assert owner_mode(keys / "authorized_keys") == (0, 0, "0o600")
    assert owner_mode(keys / "host_ed25519") == (0, 0, "0o600")
    assert owner_mode(keys / "controller_ed25519") == (0, 0, "0o600")
    for name in ("known_hosts", "inventory.yml", "rack.json", "nodes/device1/sshd_config"):
        assert owner_mode(rack.state_dir / name) == (0, 0, "0o644"), name
    config = (rack.state_dir / "nodes/device1/sshd_config").read_text()
    assert "StrictModes yes\n" in config and "StrictModes no" not in config


@pytest.mark.serial  # the share is measured: alone, after the parallel pass
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
    failcnt = int((CGROUPS / f"memory/{rack.cgroup}/device2/memory.failcnt").read_text())
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
    # This kernel has no sch_netem: device1's 5 ms are applied by the userspace link emulator in its
    # namespace, preflight says so, and the self-check measures them against the baseline.
    assert "device1: network.device1 is applied by the userspace link emulator" in log
    assert metadata["conditions"]["device1"]["netem"]["netem_backend"] == "userspace"
    import pandas as pd

    check = pd.read_csv(run_dir / "aggregate" / "netem_check.csv")
    print(check.to_string())
    assert set(check["backend"]) == {"userspace"} and set(check["shaping"]) == {"applied"}
    assert check["pass"].all(), check.to_string()
    stats = json.loads((run_dir / "raw" / "device1" / "device1_link_emulator.json").read_text())
    assert stats["profiles"][0]["released"] > 0
    # ... in the rack's links cgroup, outside device1's CPU quota (a board's netem costs it no CPU),
    # at SCHED_FIFO on the RT budget that cgroup has
    assert any(g.endswith("/links") and "cpu" in g.split(":")[0] for g in stats["realtime"]["cgroup"]), stats
    assert stats["realtime"]["sched_fifo"] == 20, stats["realtime"]
    assert (run_dir / "aggregate" / "phases.csv").is_file()
    # The rack gives every node an RT budget, so the devices waited for the start at SCHED_FIFO.
    for device in ("device1", "device2"):
        origin = json.loads((run_dir / "raw" / device / f"{device}_origin.json").read_text())
        assert origin["start_sched"]["policy"] == "SCHED_FIFO", origin["start_sched"]
    status = json.loads((run_dir / "status.json").read_text())
    print("start lateness ns:", status.get("lateness_ns"), "load average:", os.getloadavg())


def test_a_live_runs_leases_refuse_a_second_run_over_ssh_naming_the_holder(
    rack: RackHandle, tmp_path: Path
) -> None:
    """Per-node leases across SSH (issue 35 item 5). A running quickstart holds the edge, device1 and
    device2: here its leases are written as its driver writes them, this test's process standing for
    that driver (a live pid on this controller, which is what makes a lease live). A second run sharing
    device1 is refused naming the holder; a run on device3 alone, disjoint from the first's devices, is
    refused too, on the edge: a rack's edge serves one run at a time (docs/leases.md). Neither refused
    run changes anything: the holder's leases are the same bytes, no lease of theirs is left behind."""
    from dit.report.labels import run_outcome
    from dit.run.journal import Journal
    from dit.run.lease_decision import controller_holder
    from dit.run.rundir import RunDir
    from tests.conftest import write_scenario

    holder = controller_holder("quickstart-20261204T150000Z-6d522e53-0a0b0c0d", tmp_path / "held-run")
    lease = {h: Path(str(rack.hosts[h]["dit_remote_base"])) / "lease.json" for h in rack.hosts}
    held = ("edge", "device1", "device2")
    for host in held:
        lease[host].parent.mkdir(parents=True, exist_ok=True)
        lease[host].write_text(json.dumps(holder.to_json()), encoding="utf-8")
    before = {h: lease[h].read_bytes() for h in held}
    lone = write_scenario(tmp_path, name="lone", devices=["device3"], repetitions=1, warmup=0,
                          inference={"enabled": False}, optimisation={"enabled": False})  # fmt: skip
    try:
        for scenario, runs, refusing in (
            ("scenarios/quickstart.yaml", tmp_path / "shared", "device1"),
            (str(lone), tmp_path / "disjoint", "edge"),
        ):
            result = dit("run", scenario, "-i", str(rack.inventory), "--runs-dir", str(runs), timeout=900)
            message = " ".join(result.stderr.split())
            assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
            assert f"node {refusing} is leased by {holder.describe()}, which is still running" in message
            (status,) = runs.glob("*/*/status.json")
            run = RunDir(status.parent)
            assert run.status()["state"] == "failed" and run.status()["teardown"]["ok"] is True
            assert (run_outcome(run.status()) or "").startswith(
                "Refused by a node's lease during the preflight"
            )
            # it may have taken a free node's lease meanwhile; only leases, and all released
            records = Journal(run.journal).records()
            assert all(r.get("op") == "lease" or "undone" in r for r in records), records
            assert Journal(run.journal).pending() == []
            assert {h: lease[h].read_bytes() for h in held} == before  # the holder's leases untouched
            assert not lease["device3"].exists()
            assert not any(Path(str(v["dit_remote_base"]), run.run_id).exists() for v in rack.hosts.values())
    finally:
        for host in held:
            lease[host].unlink(missing_ok=True)


def test_dit_cleanup_after_the_driver_is_killed_removes_the_rules_and_the_link_emulator(
    rack: RackHandle, tmp_path: Path
) -> None:
    """kill -9 of the driver once the link emulator runs; ``dit cleanup`` replays the journal."""
    runs = tmp_path / "runs"
    driver = subprocess.Popen(
        [*DIT, "run", "scenarios/quickstart.yaml", "-i", str(rack.inventory), "--runs-dir", str(runs)],
        cwd=REPO, env=dit_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    from dit.conditions.netem.nfqueue import chain_name

    namespaces = [
        line.split()[0]
        for line in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True
        ).stdout.splitlines()
        if line.startswith(f"dit-{rack.name}-")
    ]

    def rules() -> str:
        return "".join(
            subprocess.run(["ip", "netns", "exec", ns, "iptables", "-w", "-t", "mangle", "-S"],
                           capture_output=True, text=True).stdout
            for ns in namespaces
        )  # fmt: skip

    chain = ""
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and driver.poll() is None:
            found = list((runs / "quickstart").glob("*")) if (runs / "quickstart").is_dir() else []
            if found and not chain:
                chain = chain_name(f"quickstart-{found[0].name}", "device1")
            if chain and chain in rules():
                break  # the emulator runs and the rules are in: the middle of apply
            time.sleep(0.2)
        assert driver.poll() is None, "the run ended before its rules were seen"
    finally:
        driver.kill()
        driver.wait(timeout=30)
    (run_dir,) = (runs / "quickstart").iterdir()
    assert chain in rules() and "NFQUEUE" in rules()
    # this run's emulator only (another test's may run beside it under ./dev test's parallel pass)
    emulator = f"{run_dir.parent.name}-{run_dir.name}/.*link-emulator.json"
    assert subprocess.run(["pgrep", "-f", emulator], capture_output=True).returncode == 0
    cleanup = dit("cleanup", str(run_dir), timeout=600)
    assert cleanup.returncode == 0, cleanup.stdout[-3000:] + cleanup.stderr[-3000:]
    assert chain not in rules() and "NFQUEUE" not in rules()
    assert subprocess.run(["pgrep", "-f", emulator], capture_output=True).returncode == 1


def test_rack_down_leaves_nothing(base: Path) -> None:
    handle = rack_up(base / "rack-t15", "t15", "10.213.15", "--devices", "2")
    busy = handle.ssh("device1", "nohup sleep 600 >/dev/null 2>&1 & echo started")
    assert busy.stdout.strip() == "started"
    pids = node_pids("t15", handle.state_dir)
    assert len(pids) >= 4 and leftovers("t15", handle.state_dir)  # 3 sshd and the sleep, at least
    result = dit("rack", "down", "--state-dir", str(handle.state_dir))
    assert result.returncode == 0, result.stderr
    assert leftovers("t15", handle.state_dir) == []
    assert not handle.state_dir.exists()
    for pid in pids:
        assert not running(pid), f"pid {pid} survived rack down"


def test_rack_down_after_rack_up_was_killed_half_way(base: Path) -> None:
    state_dir = base / "rack-t16"
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
    assert leftovers("t16", state_dir), "the kill came too late to leave anything behind"
    result = dit("rack", "down", "--state-dir", str(state_dir))
    assert result.returncode == 0, result.stderr
    time.sleep(0.5)  # an sshd started just before the kill is reaped by then
    assert leftovers("t16", state_dir) == []
    assert not state_dir.exists()


def test_nnpm_shows_the_rack_nodes_on_the_map_probing_green(rack: RackHandle) -> None:
    from dit.web.services.nodes import Inventory
    from dit.web.services.probe import Target, ping

    nodes = Inventory(rack.inventory).nodes()
    assert sorted(n.name for n in nodes) == ["device1", "device2", "device3", "edge"]
    assert all(n.lat is not None and n.lon is not None for n in nodes)
    assert len({(n.lat, n.lon) for n in nodes}) == len(nodes)  # distinct markers
    for node in nodes:
        result = asyncio.run(ping(Target(node.name, node.address)))
        assert result.ok, result.detail


def controller_link(subnet: str) -> str | None:
    """The host link that carries a rack's controller address ``<subnet>.1`` (its bridge)."""
    links = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout)
    for link in links:
        if any(a.get("local") == f"{subnet}.1" for a in link.get("addr_info", [])):
            return str(link["ifname"])
    return None


def test_a_state_dir_another_user_prepared_is_refused_before_anything_is_built(base: Path) -> None:
    foreign = base / "foreign"
    (foreign / "keys").mkdir(parents=True)
    planted = foreign / "keys" / "authorized_keys"
    planted.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlantedByAnotherUser other@host\n")
    planted.chmod(0o666)
    for path in (foreign, foreign / "keys", planted):
        os.chown(path, 65534, 65534)
    foreign.chmod(0o755)
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # root's, but group-writable
    under_tmp = Path(tempfile.mkdtemp(prefix="dit-rack-t18-")) / "rack"  # /tmp: world-writable
    cases = [(foreign, f"{foreign}", ("65534", "0755")), (shared, f"{shared}", ("0775",))]
    cases.append((under_tmp, "/tmp", ("1777",)))
    try:
        for state_dir, named, details in cases:
            argv = ["rack", "up", "--devices", "1", "--name", "t18", "--subnet", "10.213.18"]
            result = dit(*argv, "--state-dir", str(state_dir))
            assert result.returncode == 1, result.stdout + result.stderr
            message = " ".join(result.stderr.split())  # the console wraps long lines
            assert named in message and all(d in message for d in details), message
            assert "Traceback" not in result.stderr
            assert leftovers("t18", state_dir) == []
        assert planted.read_text().startswith("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlanted")
        assert stat.S_IMODE(planted.stat().st_mode) == 0o666 and planted.stat().st_uid == 65534
        assert not (foreign / "journal.jsonl").exists() and not (shared / "journal.jsonl").exists()
    finally:
        for state_dir, _, _ in cases:  # the code before the fix built a rack in each
            dit("rack", "down", "--state-dir", str(state_dir))
        shutil.rmtree(under_tmp.parent, ignore_errors=True)


def test_rack_down_refuses_journal_records_reaching_outside_the_rack(base: Path) -> None:
    """A journal rewritten by someone else: every record naming something the rack could not have
    made is refused and reported, never undone; the journal stays for a look."""
    state_dir = base / "rack-t19"
    state_dir.mkdir(mode=0o700)
    victim_dir = base / "victim"
    victim_dir.mkdir()
    cgroup = CGROUPS / "cpu" / "dit-victim-t19"
    forged = [
        {"op": "dir", "undo": {"rmdir": str(victim_dir)}},
        {"op": "cgroup", "undo": {"dirs": [str(cgroup)]}},
        {"op": "link", "undo": {"link": "dit-victim19"}},
        {"op": "netns", "undo": {"netns": "dit-victim-t19"}},
        {"op": "sshd", "undo": {"procs": [str(cgroup / "cgroup.procs")]}},
        {"op": "cgroup", "undo": {"dirs": [f"{CGROUPS}/cpu/dit-t19-{rack_id(state_dir)}/../dit-victim-t19"]}},
    ]
    own = {"op": "link", "undo": {"link": f"dr-{rack_id(state_dir)}-br"}}  # this rack's: allowed
    lines = [
        json.dumps({"id": f"forged{i}", "host": "controller", "source": "dit rack", "t_wall_ns": 0, **r})
        for i, r in enumerate([own, *forged])
    ]
    (state_dir / "journal.jsonl").write_text("".join(f"{line}\n" for line in lines))
    try:
        cgroup.mkdir()
        subprocess.run(["ip", "link", "add", "dit-victim19", "type", "bridge"], check=True)
        subprocess.run(["ip", "netns", "add", "dit-victim-t19"], check=True)
        result = dit("rack", "down", "--state-dir", str(state_dir))
        assert result.returncode == 1, result.stdout + result.stderr
        message = " ".join(result.stderr.split())
        assert f"{len(forged)} journal record" in message, message
        assert all(f"forged{i}" in message for i in range(1, len(forged) + 1)), message
        assert "forged0" not in message and "Traceback" not in message
        assert victim_dir.is_dir() and cgroup.is_dir()
        assert Path("/sys/class/net/dit-victim19").exists() and Path("/run/netns/dit-victim-t19").exists()
        assert (state_dir / "journal.jsonl").is_file()  # the refused records stay pending
    finally:
        subprocess.run(["ip", "netns", "del", "dit-victim-t19"], capture_output=True)
        subprocess.run(["ip", "link", "del", "dit-victim19"], capture_output=True)
        if cgroup.is_dir():
            cgroup.rmdir()


def test_a_second_rack_on_the_first_one_s_subnet_is_refused_and_the_first_still_answers(
    rack: RackHandle, base: Path
) -> None:
    bridge = controller_link("10.213.14")
    assert bridge is not None
    other = base / "rack-second"
    argv = ["rack", "up", "--devices", "1", "--name", "t14", "--subnet", "10.213.14"]
    result = dit(*argv, "--state-dir", str(other))
    assert result.returncode == 1, result.stdout + result.stderr
    message = " ".join(result.stderr.split())
    assert "10.213.14.0/24" in message and bridge in message and str(rack.state_dir) in message, message
    assert "Traceback" not in message
    # Checked before any SSH: without its bridge, the first rack's addresses would route elsewhere.
    assert controller_link("10.213.14") == bridge
    rack.answers()
    status = dit("rack", "status", "--state-dir", str(rack.state_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    assert not (other / "journal.jsonl").exists()


def test_a_second_rack_beside_the_first_works_and_leaves_the_first_alone(
    rack: RackHandle, base: Path
) -> None:
    # Same --name, another state dir and subnet: every name differs by the state dir's id.
    second = rack_up(base / "rack-second", "t14", "10.213.17", "--devices", "1")
    try:
        assert second.cgroup != rack.cgroup
        second.answers()
        rack.answers()
        for handle in (rack, second):
            status = dit("rack", "status", "--state-dir", str(handle.state_dir))
            assert status.returncode == 0, status.stdout + status.stderr
    finally:
        down = dit("rack", "down", "--state-dir", str(second.state_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers("t14", second.state_dir) == []
    assert controller_link("10.213.14") is not None
    rack.answers()


def test_rack_status_reports_a_node_that_stopped_answering(rack: RackHandle) -> None:
    """A node whose sshd hangs still has its namespace, cgroup and listening socket (the kernel
    completes the TCP handshake): only a login over the bridge finds it broken."""
    pid = int((rack.state_dir / "nodes" / "device3" / "sshd.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        status = dit("rack", "status", "--state-dir", str(rack.state_dir))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status.returncode == 1, status.stdout + status.stderr
    table = [line.split() for line in status.stdout.splitlines()]
    rows = {cells[1]: " ".join(cells) for cells in table if len(cells) > 1 and cells[1] in rack.hosts}
    assert "no answer" in rows["device3"], status.stdout
    assert all("no answer" not in rows[h] for h in ("edge", "device1", "device2")), status.stdout
    again = dit("rack", "status", "--state-dir", str(rack.state_dir))
    assert again.returncode == 0, again.stdout + again.stderr
