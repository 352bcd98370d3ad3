"""The network condition's userspace backend (pure): iptables rules, queues, the backend choice."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dit.conditions import PreflightFacts, build_conditions, netem, resolve_conditions
from dit.conditions.netem import backend, shaping
from dit.conditions.netem.nfqueue import (
    QUEUES_PER_NODE,
    build_userspace,
    chain_name,
    choose_backend,
    queue_base,
    rate_only,
)
from dit.conditions.netem.tc import NetemError
from dit.runtime_api import registry
from dit.scenario import loads
from tests.unit.test_conditions_network import SCENARIO, ctx

NO_NETEM = {"kernel": "6.1-test", "netem": {"available": False, "reason": "not built"}}
NFQUEUE = {"available": True, "source": "nfnetlink_queue loaded", "iptables": "/usr/sbin/iptables"}


def test_rules_select_destinations_as_the_tc_filters_do() -> None:
    block = {
        "delay_ms": 20,
        "jitter_ms": 2,
        "destinations": {"edge": {"delay_ms": 40, "loss_pct": 10}, "10.9.0.0/16": {"rate_mbit": 5}},
    }
    plan = build_userspace(
        block,
        "wlan0",
        device="device1",
        run_id="r1",
        destinations={"edge": "10.9.0.1", "10.9.0.0/16": "10.9.0.0/16"},
    )
    base = queue_base("r1", "device1")
    assert plan["chain"] == chain_name("r1", "device1") and len(plan["chain"]) <= 28
    # most specific first: the edge's /32 before the /16 (which is rate only: RETURN, no delay)
    assert plan["rules"] == [
        ["-d", "10.9.0.1/32", "-j", "NFQUEUE", "--queue-num", str(base + 1)],
        ["-d", "10.9.0.0/16", "-j", "RETURN"],
        ["-j", "NFQUEUE", "--queue-num", str(base)],
    ]
    assert plan["jump"] == ["-o", "wlan0", "-j", plan["chain"]]
    assert [
        (q["queue"], q["name"], q["delay_ms"], q["jitter_ms"], q["loss_pct"]) for q in plan["queues"]
    ] == [
        (base, "main", 20.0, 2.0, 0.0),
        (base + 1, "edge", 40.0, 0.0, 10.0),
    ]
    assert all("--queue-bypass" not in rule for rule in plan["rules"])  # fail closed
    assert base >= 1024 and base + QUEUES_PER_NODE <= 65536
    assert queue_base("r1", "device2") != base and chain_name("r2", "device1") != plan["chain"]


def test_a_varying_delay_starts_at_its_first_step_and_ipv6_is_refused() -> None:
    square = {"variation": {"kind": "square", "low_ms": 5, "high_ms": 25, "period_s": 4}}
    plan = build_userspace(square, "wlan0", device="d", run_id="r")
    assert plan["queues"][0]["delay_ms"] == 5 and plan["rules"][-1][:2] == ["-j", "NFQUEUE"]
    with pytest.raises(NetemError, match=r"network.d.destinations.v6: .*IPv6"):
        build_userspace({"destinations": {"v6": {"delay_ms": 1}}}, "wlan0", device="d", run_id="r",
                        destinations={"v6": "fd00::1"})  # fmt: skip


def test_the_emulator_s_queues_carry_the_loss_correlation_and_the_rate_part_drops_it() -> None:
    square = {"kind": "square", "low_ms": 5, "high_ms": 25, "period_s": 4}
    block = {
        "loss_pct": 10,
        "loss_correlation_pct": 50,
        "variation": square,
        "rate_mbit": 20,
        "destinations": {"edge": {"loss_pct": 1, "loss_correlation_pct": 25, "rate_mbit": 5}},
    }
    plan = build_userspace(block, "wlan0", device="d", run_id="r", destinations={"edge": "10.9.0.1"})
    assert [(q["name"], q["delay_ms"], q["loss_pct"], q["loss_correlation_pct"]) for q in plan["queues"]] == [
        ("main", 5.0, 10.0, 50.0),  # the varying main profile keeps its correlation
        ("edge", 0.0, 1.0, 25.0),
    ]
    assert rate_only(block) == {"rate_mbit": 20, "destinations": {"edge": {"rate_mbit": 5}}}


def test_a_scenario_s_loss_correlation_reaches_both_backends_and_survives_the_variation() -> None:
    """From the scenario through the builder and the backend choice: netem gets ``loss 10% 50%`` in its
    tree and in the change template netem-vary runs at every step; the userspace backend's queue gets
    the correlation, and its variation only ever changes the delay (the control socket's message)."""
    (scenario,) = loads(
        "name: c\nmodel: fake\ndevices: [device1]\nseed: 7\nnetwork:\n  device1:\n    loss_pct: 10\n"
        "    loss_correlation_pct: 50\n    variation: {kind: square, low_ms: 5, high_ms: 25, period_s: 4}\n"
    )
    built = build_conditions(scenario, {"device1": ctx("device1", local=False)})

    def settled(node: dict[str, Any]) -> dict[str, Any]:
        facts = PreflightFacts(scenario, {"device1": node}, built, {"device1": {}}, local=False)
        return resolve_conditions(facts)["device1"]["netem"]  # type: ignore[no-any-return]

    with_netem = settled({"netem": {"available": True}})
    assert with_netem["netem_backend"] == "netem"
    assert with_netem["netem_tree"][0]["argv"][-5:] == ["delay", "5ms", "loss", "10%", "50%"]
    assert with_netem["netem_variation"]["template"][-5:] == ["delay", "{delay}", "loss", "10%", "50%"]
    userspace = settled({**NO_NETEM, "nfqueue": NFQUEUE})
    assert userspace["netem_backend"] == "userspace"
    (queue,) = userspace["netem_userspace"]["queues"]
    assert (queue["delay_ms"], queue["loss_pct"], queue["loss_correlation_pct"]) == (5.0, 10.0, 50.0)
    assert "template" not in userspace["netem_variation"] and userspace["netem_variation"]["control_socket"]


def test_rate_only_keeps_what_tbf_and_htb_shape() -> None:
    block = {
        "delay_ms": 5,
        "rate_mbit": 10,
        "variation": {"kind": "square"},
        "destinations": {"a": {"loss_pct": 1, "rate_mbit": 2}},
    }
    assert rate_only(block) == {"rate_mbit": 10, "destinations": {"a": {"rate_mbit": 2}}}


def test_auto_takes_netem_where_the_kernel_has_it_else_userspace() -> None:
    assert choose_backend("auto", {"netem": {"available": True}})[0] == "netem"
    assert choose_backend("auto", {"netem": {"available": None}})[0] == "netem"
    assert choose_backend("auto", {**NO_NETEM, "nfqueue": NFQUEUE})[0] == "userspace"
    assert choose_backend("auto", {**NO_NETEM, "nfqueue": {"available": False}})[0] == "netem"
    assert choose_backend("netem", {**NO_NETEM, "nfqueue": NFQUEUE})[0] == "netem"


def _resolved(nodes: dict[str, Any], **hostvars: Any) -> tuple[Any, dict[str, Any]]:
    (scenario,) = loads(SCENARIO.replace("target: device2", "target: edge"))
    hosts = ("edge", "device1", "device2", "device3")
    built = build_conditions(scenario, {h: ctx(h, local=False, **hostvars) for h in hosts})
    facts = PreflightFacts(scenario, nodes, built, {h: hostvars for h in hosts}, local=False)
    return scenario, resolve_conditions(facts)


def test_resolve_applies_the_userspace_backend_without_sch_netem() -> None:
    scenario, built = _resolved({h: {**NO_NETEM, "nfqueue": NFQUEUE} for h in ("device1", "device2")},
                                dit_tc_dry_run="netem")  # fmt: skip
    d1, d2 = built["device1"]["netem"], built["device2"]["netem"]
    assert d1["netem_backend"] == "userspace" and d1["netem_dry_run"] is False
    kinds = [o["expect"].get("kind") for o in d1["netem_tree"]]
    assert "netem" not in kinds and "htb" in kinds  # the /16 rate cap stays on htb, for real
    assert d1["netem_userspace"]["queues"][0]["delay_ms"] == 20
    # device2 varies its delay: netem-vary now drives the emulator's control socket, not tc
    assert "template" not in d2["netem_variation"]
    assert d2["netem_variation"]["control_socket"] == "/var/lib/dit/run-1/link-emulator.sock"
    assert [o["expect"]["kind"] for o in d2["netem_tree"]] == ["tbf"]
    facts = PreflightFacts(scenario, {"device1": NO_NETEM, "device2": NO_NETEM}, built, {}, local=False)
    assert netem.preflight(facts) is None  # no sch_netem, yet nothing to refuse: userspace applies it
    metadata = {"conditions": built, "mode": "inventory"}
    assert (backend(metadata, "device1"), shaping(metadata, "device1")) == ("userspace", "applied")
    assert backend(metadata, "device3") == ""


def test_resolve_keeps_netem_where_the_kernel_has_it_or_when_asked() -> None:
    _, built = _resolved(
        {h: {"netem": {"available": True}, "nfqueue": NFQUEUE} for h in ("device1", "device2")}
    )
    assert built["device1"]["netem"]["netem_backend"] == "netem"
    assert built["device1"]["netem"]["netem_userspace"] == {}
    _, asked = _resolved({h: {**NO_NETEM, "nfqueue": NFQUEUE} for h in ("device1", "device2")},
                         dit_network_backend="netem")  # fmt: skip
    assert asked["device1"]["netem"]["netem_backend"] == "netem"


def test_local_mode_refuses_an_explicit_userspace_backend() -> None:
    (scenario,) = loads(
        SCENARIO.replace("    jitter_ms: 2\n", "    jitter_ms: 2\n    network_backend: userspace\n")
    )
    with pytest.raises(
        NetemError, match=r"network\.device1\.network_backend: userspace is not available in local mode"
    ):
        build_conditions(scenario, {"device1": ctx("device1", local=True)})


def test_rate_only_without_any_cap_leaves_no_tree() -> None:
    assert rate_only({"destinations": {"a": {"delay_ms": 20}, "b": {"loss_pct": 10}}}) == {}
    assert rate_only({"rate_mbit": 5, "destinations": {"a": {"delay_ms": 20}}}) == {
        "rate_mbit": 5,
        "destinations": {"a": {}},
    }


def test_a_rate_only_block_is_netem_s_without_a_choice_to_settle() -> None:
    (scenario,) = loads("name: r\nmodel: fake\ndevices: [device1]\nnetwork:\n  device1: {rate_mbit: 10}\n")
    variables = netem.build(scenario, "device1", ctx("device1", local=False))
    assert variables is not None
    assert (variables["netem_backend"], variables["netem_userspace"]) == ("netem", {})


def test_preflight_refuses_the_userspace_backend_where_iptables_is_missing() -> None:
    no_iptables = {"available": False, "reason": "iptables is not installed (provisioning installs it)"}
    scenario, built = _resolved({h: {**NO_NETEM, "nfqueue": no_iptables} for h in ("device1", "device2")},
                                dit_network_backend="userspace")  # fmt: skip
    assert built["device1"]["netem"]["netem_backend"] == "userspace"
    nodes = {h: {**NO_NETEM, "nfqueue": no_iptables} for h in ("device1", "device2")}
    refusal = netem.preflight(PreflightFacts(scenario, nodes, built, {}, local=False))
    assert refusal is not None and "device1: network.device1 needs the userspace backend" in refusal
    assert "iptables is not installed" in refusal


def test_a_source_address_confines_the_chain_to_the_device_s_own_packets() -> None:
    plan = build_userspace({"delay_ms": 20}, "lo", device="device1", run_id="r", source="127.9.8.2",
                           destinations={})  # fmt: skip
    # every local device's chain hangs off -o lo: another address returns before any queue
    assert plan["rules"][0] == ["!", "-s", "127.9.8.2/32", "-j", "RETURN"]
    assert plan["rules"][1][:2] == ["-j", "NFQUEUE"] and len(plan["rules"]) == 2
    assert plan["jump"] == ["-o", "lo", "-j", plan["chain"]]
    with pytest.raises(NetemError, match=r"source address '127\.0\.0\.0/8' is not one IPv4 address"):
        build_userspace({"delay_ms": 20}, "lo", device="device1", run_id="r", source="127.0.0.0/8")


def test_local_mode_auto_takes_the_userspace_backend_wherever_it_runs() -> None:
    with_netem = {"netem": {"available": True}, "nfqueue": NFQUEUE}
    assert choose_backend("auto", with_netem, local=True)[0] == "userspace"
    not_root = {**NO_NETEM, "nfqueue": {"available": False, "reason": "not root"}}
    chosen, why = choose_backend("auto", not_root, local=True)
    assert chosen == "netem" and "local mode records" in why and "not root" in why


def _local(block: str) -> tuple[Any, dict[str, Any]]:
    """device1's ``network`` block built as local mode builds it: every node on the loopback, each
    device with its own source address."""
    (scenario,) = loads(f"name: l\nmodel: fake\ndevices: [device1, device2]\nnetwork:\n  device1: {block}\n")
    loopback = {h: "127.0.0.1" for h in ("edge", "device1", "device2")}
    hosts = {"edge": replace(ctx("edge", local=True), addresses=loopback)}
    for index, host in enumerate(("device1", "device2")):
        source = f"127.9.8.{index + 2}"
        hosts[host] = replace(ctx(host, local=True, dit_source_address=source), addresses=loopback)
    return scenario, build_conditions(scenario, hosts)


def test_local_mode_builds_the_userspace_backend_from_the_device_s_source_address() -> None:
    scenario, built = _local("{delay_ms: 20, rate_mbit: 50, destinations: {edge: {delay_ms: 30}}}")
    plan = built["device1"]["netem"]["netem_userspace"]
    assert plan["rules"][0] == ["!", "-s", "127.9.8.2/32", "-j", "RETURN"]
    assert plan["rules"][1][:2] == ["-d", "127.0.0.1/32"]
    assert plan["dry_run"] is True  # the rate cap on the shared loopback stays recorded
    facts = PreflightFacts(scenario, {"device1": {**NO_NETEM, "nfqueue": NFQUEUE}}, built, {}, local=True)
    resolved = resolve_conditions(facts)["device1"]["netem"]
    assert resolved["netem_backend"] == "userspace" and resolved["netem_dry_run"] is True
    assert resolved["netem_tree"] and "netem" not in [o["expect"].get("kind") for o in resolved["netem_tree"]]
    assert netem.preflight(PreflightFacts(scenario, facts.nodes, {"device1": {"netem": resolved}}, {},
                                          local=True)) is None  # fmt: skip
    metadata = {"conditions": {"device1": {"netem": resolved}}, "mode": "local"}
    assert (backend(metadata, "device1"), shaping(metadata, "device1")) == ("userspace", "applied")
    # not root here: the facts say so, auto records as before and preflight has nothing to refuse
    nodes = {"device1": {**NO_NETEM, "nfqueue": {"available": False, "reason": "not root"}}}
    recorded = resolve_conditions(PreflightFacts(scenario, nodes, built, {}, local=True))["device1"]["netem"]
    assert recorded["netem_backend"] == "netem" and recorded["netem_dry_run"] is True
    assert shaping({"conditions": {"device1": {"netem": recorded}}, "mode": "local"}, "device1") == "recorded"


def test_local_mode_cannot_tell_another_device_from_the_edge() -> None:
    _, built = _local("{destinations: {device2: {delay_ms: 30}}}")
    assert built["device1"]["netem"]["netem_userspace"] == {}  # auto: recorded, as before
    with pytest.raises(NetemError, match=r"network\.device1\.destinations names device2, another local node"):
        _local("{network_backend: userspace, destinations: {device2: {delay_ms: 30}}}")


def _one_delayed(runtime: str, extra: str = "") -> tuple[Any, Any]:
    head = f"name: l\nmodel: fake\ndevices: [device1]\nruntime: {{name: {runtime}}}\nnetwork:\n"
    (scenario,) = loads(head + f"  device1: {{delay_ms: 5{extra}}}\n")
    return scenario, ctx("device1", local=True, dit_source_address="127.9.8.2")


def test_local_mode_keeps_recording_for_a_runtime_that_does_not_declare_its_source_address(echo: Any) -> None:
    """A runtime whose processes listen and connect on 127.0.0.1: a chain selecting the device's own
    address would delay its pings and not its traffic, so the run would claim a delay its runtime never
    saw. The netem condition asks the runtime's declaration (``sends_from_source_address``)."""
    scenario, host = _one_delayed("echo")
    assert build_conditions(scenario, {"device1": host})["device1"]["netem"]["netem_userspace"] == {}
    asked, _ = _one_delayed("echo", ", network_backend: userspace")
    refused = r"runtime 'echo' does not declare sends_from_source_address \(its processes sending from"
    with pytest.raises(NetemError, match=refused):
        build_conditions(asked, {"device1": host})


def test_local_mode_gives_a_runtime_that_declares_its_source_address_the_userspace_backend(
    echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(echo), "sends_from_source_address", True, raising=False)
    for extra in ("", ", network_backend: userspace"):  # auto, and asked for
        scenario, host = _one_delayed("echo", extra)
        plan = build_conditions(scenario, {"device1": host})["device1"]["netem"]["netem_userspace"]
        assert plan["rules"][0] == ["!", "-s", "127.9.8.2/32", "-j", "RETURN"], extra


@pytest.mark.parametrize("runtime", ["layers", "headsplit", "llamacpp-rpc"])
def test_the_shipped_runtimes_send_from_the_device_s_address_and_get_the_userspace_backend(
    runtime: str,
) -> None:
    if runtime not in registry.installed():
        pytest.skip(f"{runtime} is not installed here")
    scenario, host = _one_delayed(runtime, ", network_backend: userspace")
    plan = build_conditions(scenario, {"device1": host})["device1"]["netem"]["netem_userspace"]
    assert plan["rules"][0] == ["!", "-s", "127.9.8.2/32", "-j", "RETURN"]


def test_local_mode_refuses_an_explicit_userspace_backend_the_node_cannot_run() -> None:
    scenario, built = _local("{delay_ms: 20, network_backend: userspace}")
    nodes = {"device1": {**NO_NETEM, "nfqueue": {"available": False, "reason": "not root (iptables ...)"}}}
    resolved = resolve_conditions(PreflightFacts(scenario, nodes, built, {}, local=True))
    refusal = netem.preflight(PreflightFacts(scenario, nodes, resolved, {}, local=True))
    assert refusal is not None and "needs the userspace backend" in refusal and "not root" in refusal


def test_an_ipv6_inference_network_is_not_left_to_the_ipv4_only_backend() -> None:
    """iptables sees IPv4 only: the main profile would leave an IPv6 inference network undelayed."""
    (scenario,) = loads("name: v6\nmodel: fake\ndevices: [device1]\nnetwork:\n  device1: {delay_ms: 5}\n")
    host = replace(ctx("device1", local=False), edge_address="fd00::1")
    built = netem.build(scenario, "device1", host)
    assert built is not None and built["netem_userspace"] == {}  # auto: netem's tree (and its gate)
    (asked,) = loads(
        "name: v6\nmodel: fake\ndevices: [device1]\nnetwork:\n  device1: {delay_ms: 5, network_backend: userspace}\n"
    )
    with pytest.raises(
        NetemError, match=r"network\.device1\.network_backend: .*fd00::1 is IPv6 .* IPv4 only"
    ):
        netem.build(asked, "device1", host)
