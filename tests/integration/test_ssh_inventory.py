"""`dit run -i INVENTORY`: the same stages against hosts reached over SSH.

Each host is a network namespace with its own address on a bridge and its own sshd (Debian's
openssh-server). The filesystem is shared, so every host gets its own `dit_remote_base`; the
clock is shared too (`dit_shared_clock`). The edge service listens inside the edge namespace and
the devices reach it across the bridge, exactly as the boards reach the edge server over Wi-Fi.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dit.journal import Journal
from dit.localmode import make_fake_sysfs
from dit.procs import run_processes
from dit.rundir import RunDir
from tests.conftest import DIT, REPO, dit_env, write_scenario

SSHD = "/usr/sbin/sshd"
BRIDGE = "ditbr-test"
SUBNET = "10.231.7"
HOSTS = {"edge": 10, "device1": 11, "device2": 12}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not Path(SSHD).exists():
        return "needs openssh-server (./dev installs it as root)"
    if shutil.which("ip") is None:
        return "needs iproute2"
    probe = subprocess.run(["ip", "netns", "add", "dit-probe"], capture_output=True)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", "dit-probe"], capture_output=True)
    return None


@pytest.fixture
def ssh_hosts(tmp_path: Path) -> Iterator[dict[str, str]]:
    reason = _usable()
    if reason:
        pytest.skip(reason)
    key = tmp_path / "id_ed25519"
    hostkey = tmp_path / "hostkey"
    for path in (key, hostkey):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    authorized = tmp_path / "authorized_keys"
    authorized.write_text(Path(f"{key}.pub").read_text())
    authorized.chmod(0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    daemons: list[subprocess.Popen[bytes]] = []
    addresses: dict[str, str] = {}
    try:
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        for host, octet in HOSTS.items():
            ns, outer, inner = f"dit-t-{host}", f"dt{octet}o", f"dt{octet}i"
            address = f"{SUBNET}.{octet}"
            ip("netns", "add", ns)
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", outer, "master", BRIDGE)
            ip("link", "set", outer, "up")
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            ip("-n", ns, "link", "set", inner, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            config = tmp_path / f"sshd-{host}.conf"
            config.write_text(
                f"ListenAddress {address}\nPort 22\nHostKey {hostkey}\nPidFile {tmp_path}/sshd-{host}.pid\n"
                f"AuthorizedKeysFile {authorized}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "AcceptEnv LANG LC_*\nSubsystem sftp internal-sftp\n"
            )
            daemons.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=(tmp_path / f"sshd-{host}.log").open("wb"),
                )
            )
            addresses[host] = address
        ssh = ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        for address in addresses.values():
            deadline = time.monotonic() + 20
            while subprocess.run([*ssh, f"root@{address}", "true"], capture_output=True).returncode != 0:
                assert time.monotonic() < deadline, f"sshd on {address} did not come up"
                time.sleep(0.2)
        yield {"key": str(key), **addresses}
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.wait(timeout=10)
        for host, octet in HOSTS.items():
            subprocess.run(["ip", "netns", "del", f"dit-t-{host}"], capture_output=True)
            subprocess.run(["ip", "link", "del", f"dt{octet}o"], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def write_inventory(directory: Path, hosts: dict[str, str]) -> Path:
    def host(name: str) -> dict[str, object]:
        base = directory / "nodes" / name
        return {
            "ansible_host": hosts[name],
            "dit_remote_base": str(base),
            "sysfs_root": str(make_fake_sysfs(base / "sys", "edge" if name == "edge" else "device")),
        }

    inventory = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": hosts["key"],
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                "ansible_python_interpreter": sys.executable,
                "dit_python": sys.executable,
                "dit_shared_clock": True,
            },
            "children": {
                "edge": {"hosts": {"edge": host("edge") | {"dit_inference_address": hosts["edge"]}}},
                "devices": {"hosts": {d: host(d) for d in ("device1", "device2")}},
            },
        }
    }
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def test_stages_run_over_ssh_across_namespaces(ssh_hosts: dict[str, str], tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path, ssh_hosts)
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
        ping = json.loads((run_dir / "raw" / device / f"{device}_ping.json").read_text())
        assert ping["address"] == ssh_hosts["edge"]
        assert ping["received"] == 10
    log = (run_dir / "run.log").read_text()
    assert f"edge service listening on {ssh_hosts['edge']}:" in log
    assert (run_dir / "aggregate" / "phases.csv").is_file()
    assert Journal(run.journal).pending() == []
    assert run_processes(run.run_id) == []
    for host in HOSTS:
        assert not (tmp_path / "nodes" / host / run.run_id).exists()
