"""The collect stage's helpers: which links it measures, and the nodes' archives unpacked into ``raw/``."""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.run.errors import StageFailed
from dit.run.procs import ProcessFailure, process_failures
from dit.run.rundir import RunDirError
from dit.scenario import Scenario
from dit.trusted import write_file_nofollow

#: Offset of the device-to-device iperf3 servers from the collect stage's iperf3 port base (the edge's
#: servers use base + device index): the server on device i listens on base + 500 + i.
IPERF3_D2D_PORT_OFFSET = 500


def link_targets(
    devices: Iterable[str],
    addresses: Mapping[str, str],
    edge_host: str,
    sources: Mapping[str, str] | None = None,
) -> dict[str, list[dict[str, str]]]:
    """``{device: [{"target", "address"}]}``: each device's link to the edge server (named ``edge``,
    as the analysis names it), then to every other device, in scenario order. A device with a source
    address (``sources``: local mode's own loopback address) pings from it (``source``), so its
    network condition applies to the pings as to its inference traffic, and is pinged at it, so a
    destination rule towards the edge (127.0.0.1, every local node's address) does not select it."""
    names = list(devices)
    own = dict(sources or {})
    out: dict[str, list[dict[str, str]]] = {}
    for device in names:
        links = [{"target": "edge", "address": addresses[edge_host]}]
        links += [
            {"target": other, "address": own.get(other) or addresses[other]}
            for other in names
            if other != device
        ]
        source = own.get(device)
        out[device] = [{**link, "source": source} for link in links] if source else links
    return out


def throughput_testers(scenario: Scenario) -> list[str]:
    """The devices whose links the collect stage measures with iperf3 (``measure_throughput``)."""
    return [d for d in scenario.devices if scenario.network.get(d, {}).get("measure_throughput")]


def iperf3_device_links(
    testers: Iterable[str], devices: Iterable[str], addresses: Mapping[str, str]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """The device-to-device iperf3 tests of the collect stage: ``(clients, servers)``.

    ``clients[tester]`` lists ``{"target", "address", "port_offset"}`` for every other device of the
    scenario (in scenario order); ``servers[device]`` is ``{"address", "port_offset"}`` for every
    device some tester measures towards. Each target runs one server and the testers take turns
    (the playbook runs one test at a time), so a port per target suffices.
    """
    names = list(devices)
    chosen = [t for t in names if t in set(testers)]
    clients: dict[str, list[dict[str, Any]]] = {}
    servers: dict[str, dict[str, Any]] = {}
    for tester in chosen:
        for target in names:
            if target == tester:
                continue
            offset = IPERF3_D2D_PORT_OFFSET + names.index(target)
            clients.setdefault(tester, []).append(
                {"target": target, "address": addresses[target], "port_offset": offset}
            )
            servers[target] = {"address": addresses[target], "port_offset": offset}
    return clients, servers


def iperf3_vars(scenario: Scenario, addresses: Mapping[str, str]) -> dict[str, Any]:
    """The collect stage's iperf3 variables: the testers, and their device-to-device clients and servers."""
    testers = throughput_testers(scenario)
    clients, servers = iperf3_device_links(testers, scenario.devices, addresses)
    return {
        "dit_iperf3_devices": testers,
        "dit_iperf3_d2d_clients": clients,
        "dit_iperf3_d2d_servers": servers,
    }


def extract_collected(raw_dir: Path, host: str) -> list[str]:
    """Unpack ``raw/<host>.tar.gz`` (members already prefixed with the host) into ``raw/<host>/``."""
    archive = raw_dir / f"{host}.tar.gz"
    dest = raw_dir / host
    dest.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            sub, _, name = member.name.partition("/")
            target_dir = dest if sub == "results" else dest / sub
            target_dir.mkdir(parents=True, exist_ok=True)
            if "/" in name or name.startswith(".") or not name.startswith(f"{host}_"):
                raise StageFailed(f"collect: unexpected member {member.name!r} in {archive}")
            source = tar.extractfile(member)
            if source is None:
                continue
            # Whole or absent: teardown takes a file in raw/ for fetched and removes the node's copy.
            target = target_dir / name
            try:
                write_file_nofollow(target, source.read())
            except OSError as exc:
                raise RunDirError(target, "write", exc) from None
            names.append(str(target.relative_to(raw_dir)))
    archive.unlink()
    return names


def collected(raw: Path, hosts: Sequence[str]) -> list[ProcessFailure]:
    """After the collect stage: every host's packed results unpacked into ``raw/<host>/``, and the
    device processes that failed (their ``processes.json`` records)."""
    for host in hosts:
        extract_collected(raw, host)
    return process_failures(raw, hosts)
