"""Background traffic (``background_traffic.<device>``): an iperf3 stream for the whole run.

For every device with a block, an iperf3 server runs on the target host (the edge server by
default, or another node of the run) on its own port, and an iperf3 client on the device sends
to it at ``bitrate_mbit`` (``-b``, TCP paced or UDP) for up to a day (``-t 86400``, iperf3's
maximum): teardown reaps both tagged processes. Both log one line per second into the node's
results directory with ``--forceflush`` (``background_traffic.log`` on the device,
``iperf3_server_<device>.log`` on the server), so collect fetches what was sent during the run.

Ports: ``5301 + i`` on real nodes (``i`` is the device's index in the scenario), so a firewall
can allow a fixed range; in local mode every node is this machine and parallel runs must not
collide, so the base is drawn from the run id in 20000..31999 (below the ephemeral range). A
target that is not a node of the run must run its own server on that port.

Order 60: after the edge service starts, so its capacity profile runs without the traffic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from dit.conditions import Condition, HostContext
from dit.conditions.netem import resolve_address
from dit.scenario import Scenario
from dit.scenario.errors import Report

CONDITION = Condition(
    name="background_traffic",
    role="background_traffic",
    order=60,
    variables=("background_traffic_servers", "background_traffic_client"),
)

REAL_PORT_BASE = 5301
LOCAL_PORT_RANGE = (20000, 12000)  # base drawn in 20000 .. 31999
DURATION_S = 86400  # iperf3's longest test; the run's teardown ends it


def check_block(block: str, dev: str, conf: Mapping[str, Any], err: Report) -> None:
    """``background_traffic.<device>``: the stream goes to another host."""
    if conf.get("target") == dev:
        err([block, dev, "target"], "a device cannot send background traffic to itself")


def port_base(ctx: HostContext) -> int:
    if not ctx.local:
        return REAL_PORT_BASE
    low, span = LOCAL_PORT_RANGE
    return low + int(hashlib.sha256(ctx.run_id.encode("utf-8")).hexdigest(), 16) % span


def _host_address(target: str, ctx: HostContext, where: str) -> str:
    return resolve_address(target, ctx, where).split("/")[0]


def _target(scenario: Scenario, device: str, conf: Mapping[str, Any]) -> str:
    return str(conf.get("target") or "edge")


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    base = port_base(ctx)
    results = f"{ctx.node_root}/results"
    nodes = {ctx.edge_host, *scenario.devices}
    servers: list[dict[str, Any]] = []
    client: dict[str, Any] = {}
    for index, device in enumerate(scenario.devices):
        conf = scenario.background_traffic.get(device)
        if not conf:
            continue
        target = _target(scenario, device, conf)
        port = base + index
        where = f"background_traffic.{device}.target"
        if target == host and target in nodes:
            bind = _host_address(target, ctx, where)
            servers.append(
                {
                    "device": device,
                    "tag": f"iperf3-server-{device}",
                    "port": port,
                    "bind": bind,
                    "argv": ["iperf3", "-s", "-B", bind, "-p", str(port), "-i", "1", "--forceflush",
                             "--logfile", f"{results}/iperf3_server_{device}.log"],
                }
            )  # fmt: skip
        if device == host:
            address = _host_address(target, ctx, where) if target in nodes else target
            bitrate = float(conf["bitrate_mbit"])
            protocol = str(conf.get("protocol", "tcp"))
            argv = ["iperf3", "-c", address, "-p", str(port), "-b", f"{bitrate:g}M", "-t", str(DURATION_S),
                    "-i", "1", "--forceflush", "--logfile", f"{results}/background_traffic.log"]  # fmt: skip
            if protocol == "udp":
                argv.insert(3, "-u")
            source = str(ctx.hostvars.get("dit_source_address") or "") if ctx.local else ""
            if source:  # local mode: from the device's own address, which its network condition selects
                argv += ["-B", source]
            client = {
                "tag": "iperf3-client",
                "target": target,
                "address": address,
                "port": port,
                "bitrate_mbit": bitrate,
                "protocol": protocol,
                "log": f"{results}/background_traffic.log",
                "argv": argv,
            }
    if not servers and not client:
        return None
    return {"background_traffic_servers": servers, "background_traffic_client": client}
