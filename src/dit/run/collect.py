"""The collect stage's helpers: which links it measures, and the nodes' archives unpacked into ``raw/``."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.run.errors import StageFailed
from dit.run.procs import ProcessFailure, process_failures
from dit.run.rundir import RunDir, RunDirError
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


def edge_channel(raw: Path, edge_host: str) -> dict[str, Any] | None:
    """What the edge service's summary says of its channel: ``{"authenticated", "refused_frames",
    "refused": {reason: count}}``, or None when it wrote no summary (no edge service, or it crashed).

    A refused frame is one that its key did not verify (another user of a node reaching its port, a
    device of another run): nothing in it was used, but the operator must hear of it (issue 46)."""
    path = raw / edge_host / f"{edge_host}_edge_summary.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    refused = doc.get("refused")
    return {
        "authenticated": bool(doc.get("authenticated", False)),
        "refused_frames": int(doc.get("refused_frames") or 0),
        "refused": {str(k): int(v) for k, v in refused.items()} if isinstance(refused, dict) else {},
    }


def edge_channel_warning(channel: object) -> str | None:
    """The line the user reads for :func:`edge_channel`'s record (``status.json`` → ``edge_channel``:
    the console, ``dit show``, NNPM's run page), or None when there is nothing to say."""
    if not isinstance(channel, Mapping):
        return None
    try:
        authenticated = bool(channel["authenticated"])
        count = int(channel["refused_frames"])
        why = ", ".join(f"{reason} {int(n)}" for reason, n in sorted(dict(channel["refused"]).items()))
    except (KeyError, TypeError, ValueError):
        return f"status.json: edge_channel is not a record of the edge's channel: {channel!r:.200}"
    if not authenticated:
        return "the edge service ran without the run's key: its frames were not authenticated"
    if not count:
        return None
    return (
        f"the edge service refused {count} frame{'s' if count != 1 else ''} ({why}) that the run's key did "
        "not verify: something other than this run's devices sent to its port (edge logs: raw/edge)"
    )


def report_edge_channel(run: RunDir, raw: Path, edge_host: str, warn: Callable[[str], None]) -> None:
    """:func:`edge_channel` into ``status.json`` (which ``dit show`` and NNPM read), and its warning, if
    any, to the console and run.log."""
    channel = edge_channel(raw, edge_host)
    if channel is None:
        return
    run.set_status(edge_channel=channel)
    warning = edge_channel_warning(channel)
    if warning:
        warn(warning)
