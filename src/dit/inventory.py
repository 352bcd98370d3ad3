"""The run's inventory: generated in local mode, or the user's (``-i``) for real hosts.

Either way the stages address two groups: ``edge`` (exactly one host, the edge server) and
``devices`` (the scenario's devices, by the names the scenario uses).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.localmode import make_fake_sysfs

EDGE = "edge"


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

    def address_of(self, host: str) -> str:
        """Where the other nodes reach ``host`` on the inference network."""
        if host == self.edge_host:
            return self.edge_address
        if self.local:
            return "127.0.0.1"
        hostvars = self.hostvars.get(host, {})
        return str(hostvars.get("dit_inference_address") or hostvars.get("ansible_host") or host)


def local_cpu_split() -> tuple[list[int], list[int]]:
    """Local mode: CPU 0 for the edge server, the others for the devices (none with one CPU).

    Every node shares this machine, so without a split the devices' load and inference would slow
    the edge server's stages, which the delay model's remote term takes from its capacity profile.
    """
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(available) < 2:
        return [], []
    return available[:1], available[1:]


def local_inventory(run_dir: Path, devices: tuple[str, ...]) -> RunInventory:
    """Generate the local-mode inventory: one directory per node under ``run_dir/nodes``."""
    nodes = run_dir / "nodes"
    python = sys.executable

    def host(name: str, role: str) -> dict[str, Any]:
        base = nodes / name
        sysfs = make_fake_sysfs(base / "sys", role)
        return {
            "dit_remote_base": str(base),
            "sysfs_root": str(sysfs),
            "dit_role": role,
        }

    edge_vars = host(EDGE, "edge") | {"dit_edge_bind": "127.0.0.1", "dit_inference_address": "127.0.0.1"}
    device_vars = {name: host(name, "device") | {"dit_inference_interface": "lo"} for name in devices}
    edge_cpus, device_cpus = local_cpu_split()
    if edge_cpus:
        edge_vars["dit_cpu_affinity"] = edge_cpus
        for name in devices:
            device_vars[name]["dit_cpu_affinity"] = device_cpus
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
    path = run_dir / "inventory.json"
    path.write_text(json.dumps(inventory, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    # as ansible-inventory reports a user inventory's: the group's variables merged into each host's
    hostvars = {host: {**common, **values} for host, values in {EDGE: edge_vars, **device_vars}.items()}
    return RunInventory(str(path), True, EDGE, devices, "127.0.0.1", hostvars)


def load_inventory(source: str, devices: tuple[str, ...] | None) -> RunInventory:
    """Read a user inventory with ``ansible-inventory --list`` and check it serves the scenario.

    ``devices=None`` takes every host of group ``devices`` (a runtime check of the whole rack).
    """
    exe = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
    proc = subprocess.run([exe, "-i", source, "--list"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InventoryError(f"inventory {source}: ansible-inventory failed: {proc.stderr.strip()}")
    data = json.loads(proc.stdout)
    hostvars: dict[str, dict[str, Any]] = data.get("_meta", {}).get("hostvars", {})

    def group_hosts(name: str) -> list[str]:
        group = data.get(name, {})
        hosts = list(group.get("hosts", []))
        for child in group.get("children", []):
            hosts.extend(group_hosts(child))
        return hosts

    edges = group_hosts("edge")
    if len(edges) != 1:
        raise InventoryError(
            f"inventory {source}: group 'edge' must hold exactly one host, found {edges or 'none'}"
        )
    members = set(group_hosts("devices"))
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
