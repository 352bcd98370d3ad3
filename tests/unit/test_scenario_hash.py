"""Hashing, round-trips, sweeps, and frozen values."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from dit.scenario import FrozenDict, Scenario, canonical_json, expand, load, load_yaml, loads
from tests.conftest import shipped_runtime

BASE = """\
name: h
description: hashing
model: fake
devices: [device1, device2]
repetitions: 3
seed: 42
edge_server: {policy: RR}
inference: {partition_points: [0, 3, 11], repetitions: 5}
load:
  device2: {mode: continuous, regime: heavy}
network:
  device1: {delay_ms: 5, variation: {kind: uniform, low_ms: 1, high_ms: 9, interval_s: 2}}
hardware:
  device1: {cpu_freq_mhz: 1200, threads: 2}
"""

# The same experiment, written differently: other key order, block style, comments, quoting,
# floats for integers, defaults spelled out, the model as an object, explicit vectors.
REWRITTEN = """\
# a comment
hardware:
  device1:
    threads: 2.0
    cpu_freq_mhz: 1200
network:
  device1:
    variation: {high_ms: 9, low_ms: 1.0, kind: "uniform", interval_s: 2}
    delay_ms: 5.0
load: {device2: {regime: heavy, mode: 'continuous', interval_s: 10}}
inference:
  repetitions: 5
  enabled: true
  partition_points:
    - [0, 0]
    - [3, 3]
    - [11, 11]
edge_server:
  policy: RR
  admission: batch
optimisation: {policy: RR, algorithm: greedy}
seed: 42
repetitions: 3
devices:
  - device1
  - device2
model: {name: fake, params: {}, input: {kind: synthetic, seed: 42}}
description: "hashing"
name: "h"
warmup: 1
"""


def one(text: str) -> Scenario:
    (s,) = loads(text)
    return s


def test_hash_is_sha256_of_the_canonical_json() -> None:
    import hashlib

    s = one(BASE)
    assert s.hash == hashlib.sha256(canonical_json(s.data).encode()).hexdigest()
    assert canonical_json(s.data) == json.dumps(
        s.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert len(s.hash) == 64


def test_hash_is_stable_under_rewriting() -> None:
    assert one(REWRITTEN).hash == one(BASE).hash
    assert one(REWRITTEN).data == one(BASE).data


def test_hash_is_stable_under_key_reordering() -> None:
    raw = load_yaml(BASE)
    reordered = {k: raw[k] for k in reversed(list(raw))}
    assert expand(reordered)[0].hash == expand(raw)[0].hash


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["name"], "h2"),
        (["description"], "other"),
        (["seed"], 43),
        (["repetitions"], 4),
        (["devices"], ["device1", "device3"]),
        (["edge_server", "policy"], "SJF"),
        (["inference", "repetitions"], 6),
        (["inference", "partition_points"], [0, 3]),
        (["load", "device2", "regime"], "light"),
        (["network", "device1", "delay_ms"], 5.5),
        (["network", "device1", "variation", "high_ms"], 10),
        (["hardware", "device1", "threads"], 3),
        (["warmup"], 0),
        (["timing"], {"settle_s": 1}),
        (["model"], {"name": "fake", "params": {"scale": 0.5}}),
    ],
)
def test_any_value_change_changes_the_hash(path: list[str], value: Any) -> None:
    raw = load_yaml(BASE)
    changed = copy.deepcopy(raw)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    if path == ["devices"]:
        changed["load"] = {"device3": changed["load"].pop("device2")}
    assert expand(changed)[0].hash != expand(raw)[0].hash


def test_to_yaml_round_trips_to_the_same_hash(tmp_path: Path) -> None:
    raw = load_yaml(BASE)
    raw["model"] = {
        "name": "fake",
        "params": {"note": "1e-5", "flag": "yes", "day": "2024-01-01", "nothing": "null", "ünï": "ç"},
    }
    raw["sweep"] = [
        {"path": "edge_server.policy", "values": ["RR", "SJF"]},
        {"path": "seed", "values": [1, 2]},
    ]
    for s in expand(raw):
        text = s.to_yaml()
        assert text.startswith(f"# {s.label}\n# sha256 {s.hash}\n")
        (again,) = loads(text)
        assert again.hash == s.hash
        assert again.data == s.data
        f = tmp_path / "scenario.yaml"
        f.write_text(text, encoding="utf-8")
        assert load(f)[0].hash == s.hash
        assert again.sweep_point == ()
        assert again.label == s.name


def test_shipped_scenarios_round_trip() -> None:
    from dit.paths import content_root

    for f in sorted((content_root() / "scenarios").glob("*.yaml")):
        with shipped_runtime(f):  # the ch6 scenarios need the headsplit runtime
            for s in load(f):
                assert loads(s.to_yaml())[0].hash == s.hash, f.name


def test_cartesian_product_of_two_sweeps() -> None:
    raw = load_yaml(BASE)
    raw["sweep"] = [
        {"path": "edge_server.policy", "values": ["RR", "SJF"]},
        {"path": "network.device1.delay_ms", "values": [0, 10, 50]},
    ]
    scenarios = expand(raw)
    assert [(s.edge.policy, s.network["device1"]["delay_ms"]) for s in scenarios] == [
        ("RR", 0),
        ("RR", 10),
        ("RR", 50),
        ("SJF", 0),
        ("SJF", 10),
        ("SJF", 50),
    ]
    assert scenarios[4].label == "h[edge_server.policy=SJF,network.device1.delay_ms=10]"
    assert scenarios[4].sweep_point == (("edge_server.policy", "SJF"), ("network.device1.delay_ms", 10))
    assert len({s.hash for s in scenarios}) == 6
    assert all("sweep" not in s.data for s in scenarios)


def test_sweep_follows_derived_defaults() -> None:
    raw = load_yaml(BASE)
    raw["sweep"] = {"path": "seed", "values": [1, 2]}
    assert [s.model.input.seed for s in expand(raw)] == [1, 2]


def test_sweep_creates_missing_blocks_and_lists() -> None:
    raw = load_yaml(BASE)
    raw["sweep"] = [
        {"path": "hardware.device2.cpu_freq_mhz", "values": [600]},
        {"path": "inference.partition_points", "values": [[[1, 2]], [4]]},
    ]
    a, b = expand(raw)
    assert a.hardware["device2"]["cpu_freq_mhz"] == 600
    assert (a.inference.vectors, b.inference.vectors) == (((1, 2),), ((4, 4),))
    assert b.label == "h[hardware.device2.cpu_freq_mhz=600,inference.partition_points=[4]]"


def test_sweep_of_a_list_item_and_a_model_field() -> None:
    raw = load_yaml(BASE)
    raw["sweep"] = [
        {"path": "devices[1]", "values": ["device2", "device9"]},
        {"path": "model.params.scale", "values": [2]},
    ]
    raw["load"] = {}
    a, b = expand(raw)
    assert (a.devices, b.devices) == (("device1", "device2"), ("device1", "device9"))
    assert a.model.params["scale"] == 2 and a.model.name == "fake"


def test_too_many_variants_are_refused() -> None:
    raw = load_yaml(BASE)
    raw["sweep"] = [
        {"path": "seed", "values": list(range(40))},
        {"path": "warmup", "values": list(range(30))},
    ]
    from dit.scenario import validate

    assert [str(e) for e in validate(raw)] == ["sweep: expands to 1200 variants; the limit is 1000"]


def test_values_are_deeply_frozen() -> None:
    s = one(BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.load["device2"]["mode"] = "light"
    with pytest.raises(TypeError):
        s.data["name"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        s.data["devices"].append("d3")
    with pytest.raises(TypeError):
        s.model.params["x"] = 1  # type: ignore[index]
    assert isinstance(s.data["model"], FrozenDict)
    assert isinstance(s.inference.vectors, tuple) and isinstance(s.inference.vectors[0], tuple)
    hash(s)  # hashable all the way down
    assert s == one(BASE)


def test_to_dict_is_a_plain_independent_copy() -> None:
    s = one(BASE)
    d = s.to_dict()
    assert isinstance(d["devices"], list) and isinstance(d["load"], dict)
    json.dumps(d)
    d["load"]["device2"]["mode"] = "light"
    assert s.load["device2"]["mode"] == "continuous"
    assert list(d)[:4] == ["name", "description", "model", "devices"]


def test_expanding_frozen_data_again_gives_the_same_scenario() -> None:
    s = one(BASE)
    (again,) = expand(s.data)
    assert again == s


def test_adapter_spec() -> None:
    s = one(BASE)
    assert s.model.adapter_spec(s.seed) == {
        "name": "fake",
        "params": {},
        "input": {"kind": "synthetic", "seed": 42},
        "seed": 42,
    }


def test_a_sweep_point_with_a_mapping_value_is_recorded_as_json() -> None:
    """metadata.json's scenario.sweep_point held 'FrozenDict({...})' strings for a swept block."""
    doc = {
        "name": "s",
        "model": "fake",
        "devices": ["device1"],
        "sweep": {"path": "network", "values": [{}, {"device1": {"delay_ms": 5}}]},
    }
    second = expand(doc)[1]
    recorded = json.loads(json.dumps(second.sweep_point_json()))
    assert recorded == [["network", {"device1": {"delay_ms": 5}}]]
