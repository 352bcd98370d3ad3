"""The netem and background_traffic condition builders (pure: no host)."""

from __future__ import annotations

from typing import Any

import pytest

from dit.conditions import HostContext, PreflightFacts, active, build_conditions, netem, preflight_notes
from dit.conditions import background_traffic as bt
from dit.conditions.netem.tc import NetemError
from dit.scenario import loads

SCENARIO = """
name: net
model: fake
devices: [device1, device2, device3]
seed: 2024
network:
  device1:
    delay_ms: 20
    jitter_ms: 2
    destinations:
      edge: {delay_ms: 40}
      10.9.0.0/16: {rate_mbit: 5}
  device2:
    rate_mbit: 10
    variation: {kind: square, low_ms: 5, high_ms: 25, period_s: 4}
background_traffic:
  device1: {bitrate_mbit: 5}
  device3: {bitrate_mbit: 2.5, protocol: udp, target: device2}
"""


def ctx(host: str, local: bool, **hostvars: Any) -> HostContext:
    base = f"/var/lib/dit/{host}" if local else "/var/lib/dit"
    return HostContext(
        host=host,
        role="edge" if host == "edge" else "device",
        local=local,
        run_id="run-1",
        node_root=f"{base}/run-1",
        sysfs_root="/",
        edge_host="edge",
        edge_address="127.0.0.1" if local else "192.168.50.1",
        hostvars={"dit_inference_interface": "lo" if local else "wlan0", **hostvars},
    )


def contexts(local: bool) -> dict[str, HostContext]:
    return {h: ctx(h, local) for h in ("edge", "device1", "device2", "device3")}


def test_local_mode_records_netem_with_loopback_destinations() -> None:
    (scenario,) = loads(SCENARIO)
    built = build_conditions(scenario, contexts(local=True))
    assert "netem" not in built["edge"] and "netem" not in built["device3"]
    v1 = built["device1"]["netem"]
    assert v1["netem_interface"] == "lo" and v1["netem_dry_run"] is True
    assert v1["netem_log"] == "/var/lib/dit/device1/run-1.tc.jsonl"
    assert v1["netem_variation"] == {}
    argv = [" ".join(o["argv"]) for o in v1["netem_tree"]]
    assert argv[0] == "tc qdisc replace dev lo root handle 1: htb default 1"
    assert argv[2] == "tc qdisc replace dev lo parent 1:1 handle 10: netem delay 20ms 2ms"
    assert (
        "tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst 127.0.0.1/32 flowid 1:11" in argv
    )
    assert (
        "tc filter add dev lo parent 1: protocol ip prio 2 u32 match ip dst 10.9.0.0/16 flowid 1:12" in argv
    )


def test_real_nodes_shape_the_inference_interface_and_vary_on_schedule() -> None:
    (scenario,) = loads(SCENARIO.replace("target: device2", "target: edge"))
    built = build_conditions(scenario, contexts(local=False))
    v1 = built["device1"]["netem"]
    assert v1["netem_dry_run"] is False and v1["netem_log"] == ""
    assert "match ip dst 192.168.50.1/32" in " ".join(v1["netem_tree"][-2]["argv"])
    v2 = built["device2"]["netem"]
    assert [" ".join(o["argv"]) for o in v2["netem_tree"]] == [
        "tc qdisc replace dev wlan0 root handle 1: netem delay 5ms",
        "tc qdisc replace dev wlan0 parent 1:1 handle 10: tbf rate 10mbit burst 12500 latency 50ms",
    ]
    assert v2["netem_variation"] == {
        "device": "device2",
        "seed": 2024,
        "variation": {"kind": "square", "low_ms": 5, "high_ms": 25, "period_s": 4},
        "template": [
            "tc",
            "qdisc",
            "change",
            "dev",
            "wlan0",
            "root",
            "handle",
            "1:",
            "netem",
            "delay",
            "{delay}",
        ],
    }
    order = [c.name for c in active(built)]
    assert order.index("netem") < order.index("background_traffic")
    assert netem.CONDITION.order < 50 <= bt.CONDITION.order


def test_the_management_interface_is_refused_with_the_scenario_path() -> None:
    (scenario,) = loads(SCENARIO.replace("    delay_ms: 20\n", "    delay_ms: 20\n    interface: eth0\n", 1))
    hosts = contexts(local=False)
    hosts["device1"] = ctx("device1", False, dit_management_interface="eth0")
    with pytest.raises(NetemError, match=r"network.device1.interface: eth0 is the management interface"):
        build_conditions(scenario, hosts)
    hosts["device1"] = ctx("device1", False, dit_inference_interface="")
    (plain,) = loads(SCENARIO)
    with pytest.raises(NetemError, match=r"network.device1.interface: no interface to shape"):
        build_conditions(plain, hosts)


def test_a_device_destination_needs_an_address_outside_local_mode() -> None:
    (scenario,) = loads(SCENARIO.replace("edge: {delay_ms: 40}", "device2: {delay_ms: 40}"))
    with pytest.raises(
        NetemError, match=r"network.device1.destinations.device2: cannot resolve host 'device2'"
    ):
        build_conditions(scenario, contexts(local=False))
    assert build_conditions(scenario, contexts(local=True))["device1"]["netem"]


def test_background_traffic_servers_on_the_target_and_clients_on_the_devices() -> None:
    (scenario,) = loads(SCENARIO)
    with pytest.raises(NetemError, match=r"background_traffic.device3.target: cannot resolve host 'device2'"):
        build_conditions(scenario, contexts(local=False))
    built = build_conditions(
        loads(SCENARIO.replace("target: device2", "target: edge"))[0], contexts(local=False)
    )
    edge = built["edge"]["background_traffic"]
    assert edge["background_traffic_client"] == {}
    server, udp_server = edge["background_traffic_servers"]
    assert udp_server["port"] == 5303 and udp_server["tag"] == "iperf3-server-device3"
    assert server["argv"] == [
        "iperf3", "-s", "-B", "192.168.50.1", "-p", "5301", "-i", "1", "--forceflush",
        "--logfile", "/var/lib/dit/run-1/results/iperf3_server_device1.log",
    ]  # fmt: skip
    client = built["device1"]["background_traffic"]["background_traffic_client"]
    assert client["argv"] == [
        "iperf3", "-c", "192.168.50.1", "-p", "5301", "-b", "5M", "-t", "86400", "-i", "1", "--forceflush",
        "--logfile", "/var/lib/dit/run-1/results/background_traffic.log",
    ]  # fmt: skip
    # device3 sends UDP to device2 (index 2 -> port 5303), whose address is only known locally.
    hosts = contexts(local=True)
    local = build_conditions(scenario, hosts)
    base = bt.port_base(hosts["device3"])
    assert 20000 <= base < 32000 and base == bt.port_base(hosts["device2"])
    (srv,) = local["device2"]["background_traffic"]["background_traffic_servers"]
    assert srv["port"] == base + 2 and srv["bind"] == "127.0.0.1"
    udp = local["device3"]["background_traffic"]["background_traffic_client"]
    assert udp["argv"][:8] == ["iperf3", "-c", "127.0.0.1", "-u", "-p", str(base + 2), "-b", "2.5M"]
    assert (
        "background_traffic" not in local["device2"]
        or not local["device2"]["background_traffic"]["background_traffic_client"]
    )


def test_dry_run_netem_records_only_the_trees_that_need_netem() -> None:
    """The emulated rack on a kernel without sch_netem: rate caps are real, delays recorded."""
    (scenario,) = loads(SCENARIO.replace("target: device2", "target: edge"))
    hosts = ("edge", "device1", "device2", "device3")
    built = build_conditions(scenario, {h: ctx(h, local=False, dit_tc_dry_run="netem") for h in hosts})
    assert built["device1"]["netem"]["netem_dry_run"] is True  # delay + jitter: needs sch_netem
    assert built["device1"]["netem"]["netem_log"] == "/var/lib/dit/run-1.tc.jsonl"
    assert built["device2"]["netem"]["netem_dry_run"] is True  # a varying delay too
    rate_only_text = SCENARIO.replace("variation: {kind: square, low_ms: 5, high_ms: 25, period_s: 4}", "")
    (rate_only,) = loads(rate_only_text.replace("target: device2", "target: edge"))
    hosts = ("edge", "device2")
    built = build_conditions(rate_only, {h: ctx(h, local=False, dit_tc_dry_run="netem") for h in hosts})
    assert built["device2"]["netem"]["netem_dry_run"] is False  # tbf alone: real


def test_the_netem_preflight_says_when_the_tree_is_recorded_instead() -> None:
    (scenario,) = loads(SCENARIO)
    facts = PreflightFacts(
        scenario,
        nodes={"device1": {"kernel": "6.1-test", "netem": {"available": False, "reason": "not built"}}},
        built={},
        hostvars={"device1": {"dit_tc_dry_run": "netem"}},
        local=False,
    )
    assert netem.preflight(facts) is None
    (note,) = netem.preflight_notes(facts)
    assert "device1" in note and "kernel 6.1-test has no sch_netem" in note
    assert "records the netem commands" in note
    assert preflight_notes(facts) == [note]  # what the driver logs as a preflight warning


def test_a_local_device_s_background_stream_leaves_from_its_own_address() -> None:
    """Local mode: iperf3 binds the device's own loopback address, which its network condition selects."""
    (scenario,) = loads(SCENARIO.replace("target: device2", "target: edge"))
    hosts = contexts(local=True) | {"device1": ctx("device1", local=True, dit_source_address="127.9.8.2")}
    built = build_conditions(scenario, hosts)
    assert built["device1"]["background_traffic"]["background_traffic_client"]["argv"][-2:] == [
        "-B",
        "127.9.8.2",
    ]
    assert "-B" not in built["device3"]["background_traffic"]["background_traffic_client"]["argv"]
