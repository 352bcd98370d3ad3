"""Great-circle distance → synthetic link latency (5 ms + 1 ms per km) → netem per-destination profiles."""

from __future__ import annotations

import math

import pytest

from dit.web.services.topology import (
    EARTH_RADIUS_KM,
    Point,
    apply_map_delays,
    haversine_km,
    link_latency_ms,
    network_block,
    topology_delays,
)

# Hand-computed with the haversine formula on a sphere of radius R = 6371.0088 km:
# - one degree of longitude on the equator: d = R * pi / 180 = 111.19508 km
# - a tenth of a degree of latitude on a meridian: d = R * pi / 1800 = 11.119508 km
# - one degree of longitude at 45 deg N: a = cos^2(45) sin^2(0.5) = 0.5 * 0.0087265355^2 = 3.8076e-5,
#   d = 2 R asin(sqrt(a)) = 2 * 6371.0088 * asin(0.0061706085) = 2 * 6371.0088 * 0.0061706477 = 78.6262 km
ONE_DEGREE_EQUATOR_KM = 111.19508
TENTH_DEGREE_MERIDIAN_KM = 11.119508
ONE_DEGREE_AT_45N_KM = 78.6262


def test_haversine_hand_computed() -> None:
    assert haversine_km(0, 0, 0, 1) == pytest.approx(ONE_DEGREE_EQUATOR_KM, abs=1e-4)
    assert haversine_km(0, -0.5, 0, 0.5) == pytest.approx(ONE_DEGREE_EQUATOR_KM, abs=1e-4)
    assert haversine_km(37.9, 23.7, 38.0, 23.7) == pytest.approx(TENTH_DEGREE_MERIDIAN_KM, abs=1e-4)
    assert haversine_km(45, 0, 45, 1) == pytest.approx(ONE_DEGREE_AT_45N_KM, abs=1e-3)
    assert haversine_km(0, 0, 0, 180) == pytest.approx(math.pi * EARTH_RADIUS_KM, rel=1e-12)
    assert haversine_km(10, 20, 10, 20) == 0.0


def test_link_latency_is_5ms_plus_1ms_per_km() -> None:
    assert link_latency_ms(0) == 5.0
    assert link_latency_ms(ONE_DEGREE_EQUATOR_KM) == pytest.approx(116.195, abs=1e-3)
    assert link_latency_ms(12.3456789) == 17.346  # rounded to microseconds


def test_topology_delays_every_device_to_every_other_node() -> None:
    nodes = [
        Point("edge", "edge", 0.0, 0.0),
        Point("device1", "device", 0.0, 1.0),
        Point("device2", "device", 0.1, 0.0),
    ]
    delays = topology_delays(nodes)
    assert set(delays) == {"device1", "device2"}  # the edge server shapes nothing
    assert delays["device1"]["edge"] == pytest.approx(5 + ONE_DEGREE_EQUATOR_KM, abs=1e-3)
    assert delays["device2"]["edge"] == pytest.approx(5 + TENTH_DEGREE_MERIDIAN_KM, abs=1e-3)
    assert delays["device1"]["device2"] == delays["device2"]["device1"]
    assert "device1" not in delays["device1"]


def test_network_block_edge_links_by_default_and_keeps_the_rest() -> None:
    delays = {"device1": {"edge": 12.5, "device2": 20.0}, "device2": {"edge": 7.0, "device1": 20.0}}
    base = {"device1": {"jitter_ms": 1, "destinations": {"10.0.0.9/32": {"delay_ms": 3}}}}
    block = network_block(delays, ["device1", "device2", "device3"], "edge", base=base)
    assert block == {
        "device1": {
            "jitter_ms": 1,
            "destinations": {"10.0.0.9/32": {"delay_ms": 3}, "edge": {"delay_ms": 12.5}},
        },
        "device2": {"destinations": {"edge": {"delay_ms": 7.0}}},
    }
    both = network_block(delays, ["device1", "device2"], "edge", device_links=True)
    assert both["device1"]["destinations"] == {"edge": {"delay_ms": 12.5}, "device2": {"delay_ms": 20.0}}
    assert base["device1"]["destinations"] == {"10.0.0.9/32": {"delay_ms": 3}}  # not mutated


def test_apply_map_delays_keeps_a_typed_delay_and_says_so() -> None:
    """Issue 36 item 1: device1's typed 20 ms is not overridden by the map's 5.01 ms, nor device2's typed
    destination delay of 9 ms; the map fills only what nobody typed, and every link says which value
    applies and where it comes from."""
    delays = {"device1": {"edge": 5.013}, "device2": {"edge": 5.02}, "device3": {"edge": 5.03}}
    base = {
        "device1": {"delay_ms": 20},
        "device2": {"destinations": {"edge": {"delay_ms": 9, "loss_pct": 1}}},
        "device3": {"delay_ms": 30, "destinations": {"edge": {"loss_pct": 2}}},
    }
    block, links = apply_map_delays(delays, ["device1", "device2", "device3"], "edge", base=base)
    assert block["device1"] == {"delay_ms": 20}  # no destination written over the typed delay
    assert block["device2"]["destinations"]["edge"] == {"delay_ms": 9, "loss_pct": 1}  # typed: kept
    # device3's link has a profile of its own without a delay: its 30 ms does not apply there, the map fills it
    assert block["device3"]["destinations"]["edge"] == {"loss_pct": 2, "delay_ms": 5.03}
    assert links == [
        {"device": "device1", "peer": "edge", "map_ms": 5.013, "delay_ms": 20, "source": "typed",
         "where": "network.device1.delay_ms"},
        {"device": "device2", "peer": "edge", "map_ms": 5.02, "delay_ms": 9, "source": "typed",
         "where": "network.device2.destinations.edge.delay_ms"},
        {"device": "device3", "peer": "edge", "map_ms": 5.03, "delay_ms": 5.03, "source": "map"},
    ]  # fmt: skip
    assert network_block(delays, ["device1"], "edge", base=base) == base
    assert base["device3"]["destinations"]["edge"] == {"loss_pct": 2}  # not mutated


def test_apply_map_delays_follows_the_map_where_the_map_wrote_the_delay() -> None:
    """A destination delay the editor knows came from the map (``from_map``) follows the map again,
    and the note says what it replaced; a typed one beside it stays."""
    delays = {"device1": {"edge": 5.013, "device2": 5.5}, "device2": {"edge": 5.02, "device1": 5.5}}
    base = {
        "device1": {"destinations": {"edge": {"delay_ms": 7.0}, "device2": {"delay_ms": 40}}},
        "device2": {"destinations": {"edge": {"delay_ms": 5.02}}},
    }
    block, links = apply_map_delays(
        delays,
        ["device1", "device2"],
        "edge",
        True,
        base,
        from_map=[("device1", "edge"), ("device2", "edge")],
    )
    assert block["device1"]["destinations"] == {"edge": {"delay_ms": 5.013}, "device2": {"delay_ms": 40}}
    assert block["device2"]["destinations"] == {"edge": {"delay_ms": 5.02}, "device1": {"delay_ms": 5.5}}
    by_link = {(n["device"], n["peer"]): n for n in links}
    assert by_link[("device1", "edge")] == {"device": "device1", "peer": "edge", "map_ms": 5.013,
                                           "previous_ms": 7.0, "delay_ms": 5.013, "source": "map"}  # fmt: skip
    assert by_link[("device1", "device2")]["source"] == "typed"
    assert (
        by_link[("device2", "edge")]["source"] == "map" and "previous_ms" not in by_link[("device2", "edge")]
    )
    assert by_link[("device2", "device1")]["source"] == "map"


def test_the_distance_rule_has_settable_terms_or_none() -> None:
    """Issue 49 item 5: the rule is a base and a per-metre term the researcher sets, or no rule."""
    from dit.web.services.topology import DEFAULT_RULE, DelayRule, RuleError, links, rule_from, rule_of

    assert rule_from(None) == DEFAULT_RULE and DEFAULT_RULE.latency_ms(2.0) == 7.0
    room = rule_from({"base_ms": 0.1, "ms_per_m": 0.05})
    assert room == DelayRule(0.1, 0.05) and room is not None and room.latency_ms(0.012) == 0.7
    assert room.text() == "0.1 ms + 0.05 ms/m" and DEFAULT_RULE.text() == "5 ms + 1 ms/km"
    assert DelayRule(2, 0).text() == "2 ms whatever the distance"
    assert rule_from({"none": True}) is None
    edge, dev = Point("edge", "edge", x_m=0, y_m=0), Point("d1", "device", x_m=3, y_m=4)
    assert links([edge, dev], None)[0]["delay_ms"] is None and topology_delays([edge, dev], None) == {}
    assert topology_delays([edge, dev], room) == {"d1": {"edge": 0.35}}
    for body, field in (({"base_ms": "1", "ms_per_m": 0}, "base_ms"), ({"base_ms": 1, "ms_per_m": 2000}, "ms_per_m"),
                        ({"base_ms": 1, "ms_per_m": float("nan")}, "ms_per_m")):  # fmt: skip
        with pytest.raises(RuleError) as caught:
            rule_from(body)
        assert caught.value.field == field
    assert rule_of({"dit_delay_rule": {"base_ms": 1, "ms_per_m": 0.5}}) == DelayRule(1, 0.5)
    assert rule_of({"dit_delay_rule": {"base_ms": "x"}}) == DEFAULT_RULE  # a hand-edit that cannot be read
