"""The shipped scenarios, the schema itself, defaults, and the generated reference."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from dit.conditions.load import LOAD_REGIMES
from dit.devtools.schemadoc import render_reference
from dit.paths import content_root
from dit.scenario import expand, load, load_schema, load_yaml, schema_path, validate

SCENARIOS = content_root() / "scenarios"
SHIPPED = ["ch4_validation.yaml", "quickstart.yaml", "two_device_policies.yaml"]
REPO = Path(__file__).resolve().parents[2]


def _objects(node: Any, path: str = "#") -> Iterator[tuple[str, Mapping[str, Any]]]:
    if isinstance(node, Mapping):
        yield path, node
        for key, value in node.items():
            yield from _objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _objects(value, f"{path}/{i}")


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert schema_path() == SCENARIOS / "scenario.schema.json"


def test_every_object_refuses_unknown_keys_except_model_params() -> None:
    free = []
    for where, node in _objects(load_schema()):
        conditional = "/if" in where or "/then" in where
        # the runtime block: closed by the chosen runtime's branch (its name, then its own fields)
        branches = [rule.get("then", {}) for rule in node.get("allOf", [])]
        closed_per_branch = bool(branches) and all(b.get("additionalProperties") is False for b in branches)
        if (
            node.get("type") == "object"
            and not conditional
            and not closed_per_branch
            and node.get("additionalProperties", True) is True
        ):
            free.append(where)
    assert free == ["#/$defs/modelObject/properties/params"]


def test_every_property_has_a_description() -> None:
    schema = load_schema()
    missing = []
    for where, node in _objects(schema):
        if where.endswith(("/if", "/then")) or "/if/" in where or "/then/" in where:
            continue
        for name, prop in dict(node.get("properties", {})).items():
            if not isinstance(prop, Mapping):
                continue
            target = prop
            if "$ref" in prop:
                target = schema["$defs"][prop["$ref"].rsplit("/", 1)[1]]
            if not (prop.get("description") or target.get("description")):
                missing.append(f"{where}/{name}")
    assert missing == []


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_are_valid(name: str) -> None:
    assert validate(load_yaml(SCENARIOS / name)) == []


def test_ch4_validation_expands_to_one_scenario_per_policy() -> None:
    scenarios = load(SCENARIOS / "ch4_validation.yaml")
    assert [s.edge.policy for s in scenarios] == ["RR", "SJF"]
    assert [s.optimisation.policy for s in scenarios] == ["RR", "SJF"]  # follows the edge policy
    assert [s.label for s in scenarios] == [
        "ch4_validation[edge_server.policy=RR]",
        "ch4_validation[edge_server.policy=SJF]",
    ]
    assert scenarios[0].hash != scenarios[1].hash
    assert [s.sweep_point for s in scenarios] == [
        (("edge_server.policy", "RR"),),
        (("edge_server.policy", "SJF"),),
    ]
    first = scenarios[0]
    assert first.devices == ("device1", "device2", "device3", "device4")
    assert (first.seed, first.repetitions, first.model.name) == (2024, 5, "alexnet")
    assert first.edge.nominal_frequency is True
    assert first.inference.vectors == tuple((p,) * 4 for p in (0, 2, 4, 8, 11))
    assert first.inference.repetitions == 50
    assert dict(first.load["device4"]) == {"mode": "processes", "processes": 3}
    assert "sweep" not in first.data


def test_quickstart_is_small() -> None:
    (s,) = load(SCENARIOS / "quickstart.yaml")
    assert s.model.name == "fake"
    assert s.devices == ("device1", "device2")
    assert s.repetitions == 3
    assert s.inference.vectors == ((0, 0), (3, 3), (6, 6), (11, 11))
    assert s.inference.repetitions == 5
    assert s.load["device2"]["mode"] == "light"
    assert s.network["device1"]["delay_ms"] == 5
    assert (s.edge.policy, s.optimisation.algorithm) == ("SJF", "greedy")


def test_two_device_policies_uses_explicit_vectors() -> None:
    scenarios = load(SCENARIOS / "two_device_policies.yaml")
    assert [s.edge.policy for s in scenarios] == ["RR", "SJF"]
    assert all(s.inference.vectors == ((2, 9), (0, 0)) for s in scenarios)


def test_defaults_are_applied() -> None:
    (s,) = expand({"name": "t", "model": "fake", "devices": ["d1", "d2"]})
    assert (s.repetitions, s.warmup, s.seed, s.description) == (5, 1, 0, "")
    assert (s.edge.policy, s.edge.nominal_frequency, s.edge.profile_capacity, s.edge.admission) == (
        "SJF",
        False,
        True,
        "batch",
    )
    assert (s.inference.enabled, s.inference.repetitions) == (True, 10)
    assert s.inference.vectors == tuple((p, p) for p in range(12))  # every point of the 11 stages
    opt = s.optimisation
    assert (opt.enabled, opt.algorithm, opt.objective, opt.policy) == (True, "greedy", "total_delay", "SJF")
    assert (s.timing.start_lead_s, s.timing.max_clock_offset_ms, s.timing.settle_s) == (3.0, 1.0, 0.0)
    assert s.model.input.kind == "synthetic" and s.model.input.seed == 0 and s.model.input.path is None
    assert (s.model.equivalence_enabled, s.model.equivalence_tolerance) == (False, 1e-5)
    assert dict(s.model.params) == {}
    assert (dict(s.load), dict(s.network), dict(s.hardware), dict(s.background_traffic)) == ({}, {}, {}, {})


def test_nested_and_conditional_defaults() -> None:
    (s,) = expand(
        {
            "name": "t",
            "model": "fake",
            "devices": ["d1", "d2"],
            "seed": 7,
            "optimisation": {"policy": "RR"},
            "load": {"d1": {"mode": "continuous"}, "d2": {"mode": "heavy"}},
            "network": {"d1": {"delay_ms": 2}},
            "background_traffic": {"d2": {"bitrate_mbit": 10}},
        }
    )
    assert dict(s.load["d1"]) == {"mode": "continuous", "regime": "moderate", "interval_s": 10}
    assert dict(s.load["d2"]) == {"mode": "heavy"}  # no continuous-only defaults
    assert dict(s.network["d1"]["variation"]) == {"kind": "constant"}
    assert dict(s.background_traffic["d2"]) == {"bitrate_mbit": 10, "protocol": "tcp", "target": "edge"}
    assert s.model.input.seed == 7
    assert (s.edge.policy, s.optimisation.policy) == ("SJF", "RR")  # an explicit policy is kept


def test_load_regimes_match_the_schema_description() -> None:
    mode = load_schema()["$defs"]["load"]["properties"]["mode"]["description"]
    for name, regime in LOAD_REGIMES.items():
        cpu = "\u2013".join(str(int(v)) for v in regime.cpu_pct)  # en dash, as in the article
        mem = "\u2013".join(str(int(v)) for v in regime.mem_pct)
        assert re.search(rf"`{name}`: {cpu} % CPU and {mem} % memory", mode), name
    assert LOAD_REGIMES["moderate"].cpu_pct == (30.0, 50.0)
    assert LOAD_REGIMES["heavy"].mem_pct == (50.0, 60.0)


def test_committed_reference_matches_the_schema() -> None:
    committed = (REPO / "docs" / "scenario-reference.md").read_text(encoding="utf-8")
    assert committed == render_reference(load_schema()), (
        "run: python -m dit.devtools.schemadoc docs/scenario-reference.md"
    )


def test_reference_documents_every_field() -> None:
    text = render_reference(load_schema())
    for path in (
        "edge_server.admission",
        "load.<device>.regime",
        "network.<device>.variation.period_s",
        "network.<device>.destinations.<target>.rate_mbit",
        "hardware.<device>.cpu_budget_pct",
        "background_traffic.<device>.target",
        "model.equivalence_check.tolerance",
        "sweep.values",
        "timing.settle_s",
    ):
        assert f"| `{path}` |" in text
    assert "| `edge_server.policy` | `RR` \\| `SJF` | `SJF` |" in text
    assert "`moderate` (when mode is continuous)" in text
    assert "Required when kind is uniform or when kind is square." in text


def test_schema_json_is_stable_text() -> None:
    # the schema file is read as is by the web UI: it must be plain JSON with no duplicate keys
    def no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        return dict(pairs)

    json.loads(schema_path().read_text(encoding="utf-8"), object_pairs_hook=no_dupes)


def test_schemadoc_takes_an_option_for_an_option_not_for_a_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m dit.devtools.schemadoc --help` once wrote the reference into a file named --help."""
    from dit.devtools.schemadoc import main

    monkeypatch.chdir(tmp_path)
    assert main(["--help"]) == 0
    assert main(["--out", "x.md"]) == 2
    assert list(tmp_path.iterdir()) == []
    assert main(["ref.md"]) == 0 and (tmp_path / "ref.md").read_text().startswith("#")
