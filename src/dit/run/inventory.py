"""The run's inventory: generated in local mode, or the user's (``-i``) for real hosts.

Either way the stages address two groups: ``edge`` (exactly one host, the edge server) and
``devices`` (the scenario's devices, by the names the scenario uses).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.ansible_data import load_unsafe_yaml, unsafe_yaml
from dit.conditions import HostContext, local_hostvars
from dit.run.lease_decision import local_lease_dir
from dit.run.localmode import (
    LOCAL_CPU_SHARE_ENV,
    LOCAL_MEMORY_ENV,
    cpu_quota_usable,
    local_board_memory_mb,
    local_cpu_share,
    local_runtimes_dir,
    make_fake_sysfs,
)
from dit.run.rundir import DRIVER, RunDir, read_json, write_text
from dit.runtime_api.interface import NODE_DIT_DIR

EDGE = "edge"
LOCAL_INVENTORY = "inventory.yml"  # local mode's generated inventory, in the run directory
OLD_LOCAL_INVENTORY = "inventory.json"  # its name (plain JSON) before it was written unsafe
DEFAULT_REMOTE_BASE = NODE_DIT_DIR  # where run directories are made on a node (dit_remote_base)


class InventoryError(Exception):
    """The inventory does not provide what the scenario needs."""


@dataclass(frozen=True)
class RunInventory:
    """Where the stages run: the inventory source passed to Ansible and what the driver needs."""

    source: str  # a path ansible-runner passes to -i
    local: bool
    edge_host: str
    devices: tuple[str, ...]
    edge_address: str  # where devices reach the edge inference service
    hostvars: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def hosts(self) -> tuple[str, ...]:
        return (self.edge_host, *self.devices)

    @property
    def limit(self) -> str:
        return ":".join(self.hosts)

    def node_root(self, host: str, run_id: str) -> str:
        """The run's directory on ``host`` (as a path on the node): ``<dit_remote_base>/<run id>``."""
        base = str(self.hostvars.get(host, {}).get("dit_remote_base", DEFAULT_REMOTE_BASE))
        return f"{base}/{run_id}"

    def lease_dir(self, host: str) -> str:
        """Where ``host``'s lease is (as a path on the node): ``dit_lease_dir``, else its dit directory."""
        hostvars = self.hostvars.get(host, {})
        return str(hostvars.get("dit_lease_dir", hostvars.get("dit_remote_base", DEFAULT_REMOTE_BASE)))

    def source_of(self, host: str) -> str:
        """The address ``host``'s inference traffic leaves from when it must be told apart ("" else):
        in local mode each device's own loopback address (:func:`local_source_address`)."""
        return str(self.hostvars.get(host, {}).get("dit_source_address") or "")

    def address_of(self, host: str) -> str:
        """Where the other nodes reach ``host`` on the inference network."""
        if host == self.edge_host:
            return self.edge_address
        if self.local:
            return "127.0.0.1"
        hostvars = self.hostvars.get(host, {})
        return str(hostvars.get("dit_inference_address") or hostvars.get("ansible_host") or host)


def host_contexts(inv: RunInventory, run_id: str) -> dict[str, HostContext]:
    """What each host's condition builders may know besides the scenario."""
    addresses = {host: inv.address_of(host) for host in inv.hosts}
    # Local mode applies the conditions for real where this machine can (cgroups): the conditions
    # say which host variables that takes, unless the inventory sets them.
    defaults = local_hostvars() if inv.local else {}
    contexts: dict[str, HostContext] = {}
    for host in inv.hosts:
        hostvars = {**defaults, **inv.hostvars.get(host, {})}
        contexts[host] = HostContext(
            host=host,
            role="edge" if host == inv.edge_host else "device",
            local=inv.local,
            run_id=run_id,
            node_root=inv.node_root(host, run_id),
            sysfs_root=str(hostvars.get("sysfs_root", "/sys")),
            edge_host=inv.edge_host,
            edge_address=inv.edge_address,
            hostvars=hostvars,
            addresses=addresses,
        )
    return contexts


def local_cpu_split() -> tuple[list[int], list[int]]:
    """Local mode: CPU 0 for the edge server, the others for the devices (none with one CPU).

    Every node shares this machine, so without a split the devices' load and inference would slow
    the edge server's stages, which the delay model's remote term takes from its capacity profile.
    """
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(available) < 2:
        return [], []
    return available[:1], available[1:]


LOCAL_SOURCE_NETWORK = ipaddress.ip_network("127.0.0.0/8")  # all of it is loopback on Linux


def local_source_address(run_dir: Path, index: int) -> str:
    """Local mode's source address of the ``index``-th device: ``127.A.B.(index + 2)``.

    Every local node is this machine, so without its own source address one device's packets could
    not be told from another's (the userspace link emulator's rules select a device by it). ``A.B``
    comes from the run directory, so two local runs at once never share an address and one run's
    iptables rules never select another run's packets; 127.0.0.1 (the edge) and 127.0.0.0/16 stay
    clear of it.
    """
    if not 0 <= index < 250:
        raise InventoryError(
            f"local mode gives at most 250 devices their own loopback address, not {index + 1}"
        )
    digest = int.from_bytes(hashlib.sha256(str(run_dir.resolve()).encode()).digest()[:2], "big")
    second = 1 + digest % 255
    return str(LOCAL_SOURCE_NETWORK.network_address + (second << 16) + ((digest >> 8) << 8) + index + 2)


def local_inventory(run_dir: Path, devices: tuple[str, ...]) -> RunInventory:
    """Generate the local-mode inventory: one directory per node under ``run_dir/nodes``."""
    nodes = run_dir / "nodes"
    python = sys.executable
    lease_dir = local_lease_dir()  # refused first, before any node directory is made, if not root's alone

    def host(name: str, role: str) -> dict[str, Any]:
        base = nodes / name
        sysfs = make_fake_sysfs(base / "sys", role)
        return {
            "dit_remote_base": str(base),
            "sysfs_root": str(sysfs),
            "dit_role": role,
            # The nodes are this machine: one lease for all of them, shared by every local run. A host
            # variable, not a group one, so that RunInventory.hostvars (teardown's undo scope) has it.
            "dit_lease_dir": lease_dir,
            # one directory of external runtimes' venvs for every node on this machine (dit runtimes install)
            "dit_runtimes_dir": local_runtimes_dir(),
        }

    edge_vars = host(EDGE, "edge") | {"dit_edge_bind": "127.0.0.1", "dit_inference_address": "127.0.0.1"}
    device_vars = {
        name: host(name, "device")
        | {"dit_inference_interface": "lo", "dit_source_address": local_source_address(run_dir, index)}
        for index, name in enumerate(devices)
    }
    edge_cpus, device_cpus = local_cpu_split()
    if edge_cpus:
        edge_vars["dit_cpu_affinity"] = edge_cpus
    # Each device its own CPU cgroup (dit.conditions.cpu_share) when DIT_LOCAL_CPU_SHARE asks for it
    # (auto, the default: an equal split of the devices' CPUs, or a percentage of one CPU; or off).
    share = local_cpu_share(
        os.environ.get(LOCAL_CPU_SHARE_ENV),
        bool(devices) and cpu_quota_usable(),
        len(device_cpus) or 1,
        len(devices),
    )
    # The memory of the board each device stands for: the basis of its load's memory targets.
    board = local_board_memory_mb(os.environ.get(LOCAL_MEMORY_ENV))
    for name in devices:
        if edge_cpus:
            device_vars[name]["dit_cpu_affinity"] = device_cpus
        if share is not None:
            device_vars[name]["dit_cpu_share_default_pct"] = share
        if board is not None:
            device_vars[name]["load_board_memory_mb"] = board
    common: dict[str, Any] = {
        "ansible_connection": "local",
        "ansible_python_interpreter": python,
        "dit_python": python,
        "dit_local_mode": True,
    }
    inventory = {
        "all": {
            "vars": common,
            "children": {
                "edge": {"hosts": {EDGE: edge_vars}},
                "devices": {"hosts": device_vars},
            },
        }
    }
    # paths under the runs directory are the user's text: written unsafe, never rendered by Ansible
    path = run_dir / LOCAL_INVENTORY
    write_text(path, unsafe_yaml(inventory))  # the interpreter root runs on every node: never through a link
    # as ansible-inventory reports a user inventory's: the group's variables merged into each host's
    hostvars = {host: {**common, **values} for host, values in {EDGE: edge_vars, **device_vars}.items()}
    return RunInventory(str(path), True, EDGE, devices, "127.0.0.1", hostvars)


ANSIBLE_INVENTORY_TIMEOUT_S = 60.0  # a dynamic inventory plugin that hangs must not hang a run or NNPM


@dataclass(frozen=True)
class InventoryListing:
    """What ``ansible-inventory --list`` says about a source: groups, their children, host variables."""

    source: str
    data: dict[str, Any]

    @property
    def hostvars(self) -> dict[str, dict[str, Any]]:
        meta = self.data.get("_meta")
        found = meta.get("hostvars") if isinstance(meta, dict) else None
        return found if isinstance(found, dict) else {}

    def members(self, group: str) -> list[str]:
        """The hosts of ``group`` and of its children, in order, each once (a cycle of groups ends)."""
        hosts: list[str] = []
        seen: set[str] = set()
        pending = [group]
        while pending:
            name = pending.pop(0)
            if name in seen:
                continue
            seen.add(name)
            entry = self.data.get(name)
            if not isinstance(entry, dict):
                continue
            hosts.extend(str(h) for h in entry.get("hosts", []) if str(h) not in hosts)
            pending.extend(str(child) for child in entry.get("children", []))
        return hosts

    def hosts(self) -> list[str]:
        """Every host: the members of ``all`` and any host that only has variables."""
        return sorted(set(self.members("all")) | set(self.hostvars))


def list_inventory(source: str) -> InventoryListing:
    """Run ``ansible-inventory -i SOURCE --list`` (within :data:`ANSIBLE_INVENTORY_TIMEOUT_S`)."""
    exe = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
    timeout_s = ANSIBLE_INVENTORY_TIMEOUT_S
    try:
        proc = subprocess.run(
            [exe, "-i", source, "--list"], capture_output=True, text=True, check=False, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise InventoryError(
            f"inventory {source}: ansible-inventory did not answer within {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise InventoryError(f"inventory {source}: cannot run ansible-inventory: {exc}") from None
    if proc.returncode != 0:
        raise InventoryError(f"inventory {source}: ansible-inventory failed: {proc.stderr.strip()[:2000]}")
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise InventoryError(f"inventory {source}: ansible-inventory's output is not JSON") from None
    if not isinstance(data, dict):
        raise InventoryError(f"inventory {source}: ansible-inventory's output is not a JSON object")
    return InventoryListing(source, data)


def load_inventory(source: str, devices: tuple[str, ...] | None) -> RunInventory:
    """Read a user inventory with ``ansible-inventory --list`` and check it serves the scenario.

    ``devices=None`` takes every host of group ``devices`` (a runtime check of the whole rack).
    """
    listing = list_inventory(source)
    hostvars = listing.hostvars
    edges = listing.members("edge")
    if len(edges) != 1:
        raise InventoryError(
            f"inventory {source}: group 'edge' must hold exactly one host, found {edges or 'none'}"
        )
    members = set(listing.members("devices"))
    if devices is None:
        devices = tuple(sorted(members))
    missing = [d for d in devices if d not in members]
    if missing:
        raise InventoryError(
            f"inventory {source}: devices {', '.join(missing)} of the scenario are not in group 'devices'"
        )
    edge = edges[0]
    edge_vars = hostvars.get(edge, {})
    address = str(edge_vars.get("dit_inference_address") or edge_vars.get("ansible_host") or edge)
    return RunInventory(str(Path(source).resolve()), False, edge, devices, address, hostvars)


def inventory_of(run: RunDir) -> RunInventory:
    """The inventory a finished or crashed run used (for ``dit cleanup``)."""
    info = read_json(run.path / DRIVER)
    scenario = _run_devices(run)
    if info.get("local", True):
        path = run.path / LOCAL_INVENTORY
        if not path.exists() and (run.path / OLD_LOCAL_INVENTORY).exists():
            path = run.path / OLD_LOCAL_INVENTORY  # a run made before the inventory was written unsafe
        data = load_unsafe_yaml(path.read_text(encoding="utf-8"))
        children = data["all"]["children"]
        common = data["all"].get("vars", {})
        hosts = {**children["edge"]["hosts"], **children["devices"]["hosts"]}
        hostvars = {host: {**common, **values} for host, values in hosts.items()}
        return RunInventory(str(path), True, EDGE, scenario, "127.0.0.1", hostvars)
    return load_inventory(str(info["inventory"]), scenario)


def _run_devices(run: RunDir) -> tuple[str, ...]:
    """The devices of the run's resolved scenario."""
    from dit.analysis.run import LoadedRun

    return LoadedRun(run.path).devices
