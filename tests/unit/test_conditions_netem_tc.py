"""dit.conditions.netem.tc: the exact tc argv of every profile kind, expectations, the preflight gate."""

from __future__ import annotations

import pytest

from dit.conditions.netem.tc import (
    NetemError,
    build_tree,
    burst_bytes,
    check_interface,
    format_rate,
    intended_delay_ms,
    needs_netem,
    netem_gate,
    u32_keys,
)

TC = ["tc", "qdisc", "replace", "dev", "wlan0"]


def argv(block: dict[str, object], **kwargs: object) -> list[list[str]]:
    shaping = build_tree(block, "wlan0", device="device1", **kwargs)  # type: ignore[arg-type]
    assert shaping is not None
    return shaping.argv


def test_constant_delay_is_one_root_netem() -> None:
    assert argv({"delay_ms": 20}) == [[*TC, "root", "handle", "1:", "netem", "delay", "20ms"]]


def test_jitter_and_loss() -> None:
    assert argv({"delay_ms": 20, "jitter_ms": 5, "loss_pct": 1}) == [
        [*TC, "root", "handle", "1:", "netem", "delay", "20ms", "5ms", "loss", "1%"]
    ]
    # Jitter without delay still needs the delay keyword; fractional values keep their precision.
    assert argv({"jitter_ms": 2.5, "loss_pct": 0.25}) == [
        [*TC, "root", "handle", "1:", "netem", "delay", "0ms", "2.5ms", "loss", "0.25%"]
    ]
    assert argv({"loss_pct": 3}) == [[*TC, "root", "handle", "1:", "netem", "loss", "3%"]]


def test_a_loss_correlation_is_netem_s_second_loss_argument() -> None:
    """``loss_correlation_pct`` becomes tc's ``loss PERCENT CORRELATION``, in the main profile, a
    destination's and the variation's change template (whose ``tc qdisc change`` would otherwise
    restate the loss without it), and what ``tc -j qdisc show`` reports for it is expected."""
    assert argv({"loss_pct": 10, "loss_correlation_pct": 50}) == [
        [*TC, "root", "handle", "1:", "netem", "loss", "10%", "50%"]
    ]
    assert argv({"delay_ms": 20, "jitter_ms": 5, "loss_pct": 1, "loss_correlation_pct": 25.5}) == [
        [*TC, "root", "handle", "1:", "netem", "delay", "20ms", "5ms", "loss", "1%", "25.5%"]
    ]
    shaping = build_tree({"loss_pct": 10, "loss_correlation_pct": 50}, "wlan0", device="device1")
    assert shaping is not None
    assert shaping.objects[0].expect["options"]["loss-random"] == {"loss": 0.1, "correlation": 0.5}
    # Without a correlation the expectation stays the loss alone (tc prints correlation 0 beside it).
    plain = build_tree({"loss_pct": 10}, "wlan0", device="device1")
    assert plain is not None and plain.objects[0].expect["options"]["loss-random"] == {"loss": 0.1}

    per_destination = build_tree(
        {"destinations": {"edge": {"delay_ms": 5, "loss_pct": 2, "loss_correlation_pct": 75}}},
        "wlan0", device="device1", destinations={"edge": "192.168.50.1"},
    )  # fmt: skip
    assert per_destination is not None
    leaf = next(o for o in per_destination.objects if o.id == "11:")
    assert list(leaf.argv[-6:]) == ["netem", "delay", "5ms", "loss", "2%", "75%"]

    square = {"kind": "square", "low_ms": 5, "high_ms": 30, "period_s": 2}
    varying = build_tree(
        {"variation": square, "loss_pct": 10, "loss_correlation_pct": 50}, "wlan0", device="device1"
    )
    assert varying is not None
    assert varying.argv == [[*TC, "root", "handle", "1:", "netem", "delay", "5ms", "loss", "10%", "50%"]]
    assert varying.vary_template is not None and list(varying.vary_template[-5:]) == [
        "delay", "{delay}", "loss", "10%", "50%",
    ]  # fmt: skip


def test_rate_only_is_a_root_tbf_without_netem() -> None:
    shaping = build_tree({"rate_mbit": 10}, "wlan0", device="device1")
    assert shaping is not None and not shaping.needs_netem
    assert shaping.argv == [
        [*TC, "root", "handle", "1:", "tbf", "rate", "10mbit", "burst", "12500", "latency", "50ms"]
    ]
    (obj,) = shaping.objects
    assert obj.change_argv == ("tc", "qdisc", "change", *obj.argv[3:])
    assert obj.expect == {
        "handle": "1:",
        "parent": "root",
        "kind": "tbf",
        "options": {"rate": 1_250_000, "burst": 12_500, "lat": 50_000},
    }


def test_netem_with_rate_has_a_tbf_child() -> None:
    assert argv({"delay_ms": 20, "rate_mbit": 2.5}) == [
        [*TC, "root", "handle", "1:", "netem", "delay", "20ms"],
        [
            *TC,
            "parent",
            "1:1",
            "handle",
            "10:",
            "tbf",
            "rate",
            "2500000bit",
            "burst",
            "3200",
            "latency",
            "50ms",
        ],
    ]


def test_bucket_sizes_and_rate_tokens() -> None:
    assert format_rate(100) == "100mbit"
    assert format_rate(0.5) == "500000bit"
    assert burst_bytes(100) == 125_000  # 10 ms of tokens
    assert burst_bytes(1) == 3200  # at least two full frames
    with pytest.raises(NetemError):
        format_rate(0)


def test_nothing_to_shape_builds_nothing() -> None:
    assert build_tree({}, "wlan0", device="device1") is None
    assert build_tree({"delay_ms": 0, "interface": "wlan1"}, "wlan1", device="device1") is None


def test_destinations_build_htb_classes_netem_leaves_and_u32_filters() -> None:
    block = {
        "delay_ms": 10,
        "destinations": {
            "edge": {"delay_ms": 40, "jitter_ms": 4},
            "10.0.0.0/8": {"rate_mbit": 5},
            "fd00::7": {"loss_pct": 2},
        },
    }
    resolved = {"edge": "10.0.0.5/32", "10.0.0.0/8": "10.0.0.0/8", "fd00::7": "fd00::7/128"}
    cmds = argv(block, destinations=resolved)
    tc = ["tc", "qdisc", "replace", "dev", "wlan0"]
    cls = ["tc", "class", "add", "dev", "wlan0", "parent", "1:"]
    flt = ["tc", "filter", "add", "dev", "wlan0", "parent", "1:"]
    unshaped = ["rate", "10000mbit", "ceil", "10000mbit", "burst", "12500000", "cburst", "12500000"]
    assert cmds == [
        [*tc, "root", "handle", "1:", "htb", "default", "1"],
        [*cls, "classid", "1:1", "htb", *unshaped, "quantum", "1514"],
        [*tc, "parent", "1:1", "handle", "10:", "netem", "delay", "10ms"],
        # Most specific first: the /32 of the edge, then 10.0.0.0/8, then the IPv6 host.
        [*cls, "classid", "1:11", "htb", *unshaped, "quantum", "1514"],
        [*tc, "parent", "1:11", "handle", "11:", "netem", "delay", "40ms", "4ms"],
        [*cls, "classid", "1:12", "htb", "rate", "5mbit", "ceil", "5mbit", "burst", "6250", "cburst", "6250",
         "quantum", "1514"],
        [*cls, "classid", "1:13", "htb", *unshaped, "quantum", "1514"],
        [*tc, "parent", "1:13", "handle", "13:", "netem", "loss", "2%"],
        [*flt, "protocol", "ip", "prio", "1", "u32", "match", "ip", "dst", "10.0.0.5/32", "flowid", "1:11"],
        [*flt, "protocol", "ip", "prio", "2", "u32", "match", "ip", "dst", "10.0.0.0/8", "flowid", "1:12"],
        [*flt, "protocol", "ipv6", "prio", "3", "u32", "match", "ip6", "dst", "fd00::7/128", "flowid", "1:13"],
    ]  # fmt: skip


def test_filter_expectations_are_the_keys_tc_stores() -> None:
    import ipaddress

    assert u32_keys(ipaddress.ip_network("10.201.0.2/32")) == [[0x0AC90002, 0xFFFFFFFF, 16]]
    assert u32_keys(ipaddress.ip_network("10.201.0.0/24")) == [[0x0AC90000, 0xFFFFFF00, 16]]
    assert u32_keys(ipaddress.ip_network("fd00::/16")) == [[0xFD000000, 0xFFFF0000, 24]]
    assert len(u32_keys(ipaddress.ip_network("fd00::7/128"))) == 4
    shaping = build_tree(
        {"destinations": {"x": {"delay_ms": 5}}}, "wlan0", device="d", destinations={"x": "10.201.0.2"}
    )
    assert shaping is not None
    flt = shaping.objects[-1]
    assert flt.id == "1: ip 1"
    assert flt.expect["keys"] == [[0x0AC90002, 0xFFFFFFFF, 16]] and flt.expect["flowid"] == "1:11"
    # Without a main profile the default class is unshaped and has no netem leaf.
    assert [o.id for o in shaping.objects] == ["1:", "1:1", "1:11", "11:", "1: ip 1"]


def test_destination_errors_name_the_scenario_path() -> None:
    with pytest.raises(NetemError, match=r"network.device1.destinations.edge: no address resolved"):
        build_tree({"destinations": {"edge": {"delay_ms": 5}}}, "wlan0", device="device1")
    with pytest.raises(NetemError, match=r"network.device1.destinations.b: same address as destination a"):
        build_tree(
            {"destinations": {"a": {"delay_ms": 1}, "b": {"delay_ms": 2}}},
            "wlan0",
            device="device1",
            destinations={"a": "10.0.0.1", "b": "10.0.0.1/32"},
        )


def test_uniform_and_square_start_at_the_first_step_and_carry_a_change_template() -> None:
    uniform = {"kind": "uniform", "low_ms": 10, "high_ms": 30, "interval_s": 5}
    shaping = build_tree({"variation": uniform, "loss_pct": 1}, "wlan0", device="device1", seed=2024)
    assert shaping is not None and shaping.needs_netem
    # The first draw of random.Random("2024:device1") in [10, 30], to the microsecond.
    assert shaping.argv == [[*TC, "root", "handle", "1:", "netem", "delay", "19.039ms", "loss", "1%"]]
    assert shaping.vary_template == (
        "tc", "qdisc", "change", "dev", "wlan0", "root", "handle", "1:", "netem", "delay", "{delay}", "loss", "1%",
    )  # fmt: skip
    assert shaping.vary_qdisc == "1:"
    # The varying delay is left out of the comparison, so a re-apply while it varies changes nothing.
    assert "delay" not in shaping.objects[0].expect["options"]

    square = {"kind": "square", "low_ms": 0, "high_ms": 50, "period_s": 10}
    shaping = build_tree(
        {"variation": square, "jitter_ms": 2, "destinations": {"edge": {"delay_ms": 5}}},
        "wlan0",
        device="device2",
        destinations={"edge": "192.168.50.1"},
        netns="ns1",
    )
    assert shaping is not None
    assert shaping.vary_template == (
        "tc", "-n", "ns1", "qdisc", "change", "dev", "wlan0", "parent", "1:1", "handle", "10:", "netem",
        "delay", "{delay}", "2ms",
    )  # fmt: skip
    leaf = next(o for o in shaping.objects if o.id == "10:")
    assert list(leaf.argv[-4:]) == ["netem", "delay", "0ms", "2ms"]  # square starts low


def test_needs_netem_and_the_preflight_gate() -> None:
    assert not needs_netem({"rate_mbit": 5})
    assert not needs_netem({"rate_mbit": 5, "destinations": {"edge": {"rate_mbit": 1}}})
    assert needs_netem({"destinations": {"edge": {"delay_ms": 1}}})
    assert needs_netem({"variation": {"kind": "square", "low_ms": 0, "high_ms": 0, "period_s": 1}})
    network = {"device1": {"delay_ms": 20}, "device2": {"rate_mbit": 5}, "device3": {"loss_pct": 1}}
    facts = {
        "device1": {"kernel": "6.1.0-rpi7", "netem": {"available": False, "reason": "no sch_netem module"}},
        "device2": {"kernel": "6.1.0-rpi7", "netem": {"available": False, "reason": "no sch_netem module"}},
        "device3": {"kernel": "6.1.0-rpi7", "netem": {"available": True, "source": "module"}},
    }
    (problem,) = netem_gate(network, facts)
    assert problem.startswith("device1: kernel 6.1.0-rpi7 lacks sch_netem (no sch_netem module)")


def test_the_management_interface_is_refused() -> None:
    check_interface("wlan0", ["eth0"], "network.device1")
    with pytest.raises(NetemError, match=r"network.device1.interface: eth0 is the management interface"):
        check_interface("eth0", ["eth0", ""], "network.device1")
    with pytest.raises(NetemError, match=r"network.device1.interface: no interface to shape"):
        check_interface("", [], "network.device1")


def test_intended_delay_per_target() -> None:
    block = {"delay_ms": 10, "destinations": {"edge": {"delay_ms": 40}, "10.0.0.0/8": {"delay_ms": 25}}}
    resolved = {"edge": "10.0.0.5/32", "10.0.0.0/8": "10.0.0.0/8"}
    assert intended_delay_ms(block, "10.0.0.5", resolved) == 40
    assert intended_delay_ms(block, "10.1.2.3", resolved) == 25
    assert intended_delay_ms(block, "192.168.1.1", resolved) == 10
    varying = {"variation": {"kind": "uniform", "low_ms": 10, "high_ms": 30, "interval_s": 1}}
    assert intended_delay_ms(varying, None, {}) == 20
