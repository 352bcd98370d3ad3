"""Path-precise errors: schema violations rendered for humans, and the semantic checks."""

from __future__ import annotations

from typing import Any

import pytest

from dit.scenario import FieldError, ScenarioError, expand, validate


def doc(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "t", "model": "fake", "devices": ["device1", "device2"]}
    base.update(extra)
    return base


def messages(raw: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate(raw)]


def test_field_error_and_scenario_error_render_one_per_line() -> None:
    e = FieldError("load.device7", "device7 is not in devices")
    assert str(e) == "load.device7: device7 is not in devices"
    assert str(FieldError("", "the scenario is empty")) == "the scenario is empty"
    err = ScenarioError([e, FieldError("devices[2]", "device1 appears twice")])
    assert str(err) == "load.device7: device7 is not in devices\ndevices[2]: device1 appears twice"
    assert err.errors[1].path == "devices[2]"


def test_valid_document_has_no_errors() -> None:
    assert validate(doc()) == []


# -- schema errors, rendered ------------------------------------------------------------------------


def test_enum_error_is_human_and_dotted() -> None:
    assert messages(doc(edge_server={"policy": "FIFO"})) == [
        "edge_server.policy: 'FIFO' is not one of RR, SJF"
    ]


def test_list_indices_are_rendered_in_brackets() -> None:
    raw = doc(inference={"partition_points": [[1, 2], [0, "x"]]})
    assert messages(raw) == ["inference.partition_points[1][1]: expected an integer, got string 'x'"]


def test_minimum_and_exclusive_minimum() -> None:
    raw = doc(
        network={"device1": {"delay_ms": -5, "rate_mbit": 0}}, repetitions=0, timing={"start_lead_s": 0}
    )
    assert messages(raw) == [
        "network.device1.delay_ms: -5 is less than 0",
        "network.device1.rate_mbit: 0 is less than 0.001",
        "repetitions: 0 is less than 1",
        "timing.start_lead_s: 0 must be greater than 0",
    ]


def test_maximum() -> None:
    assert messages(doc(load={"device1": {"mode": "light", "cpu_pct": 120}})) == [
        "load.device1.cpu_pct: 120 is greater than 100"
    ]


def test_unknown_field_suggests_the_closest() -> None:
    assert messages(doc(edge_server={"polcy": "RR"})) == [
        "edge_server.polcy: unknown field; did you mean 'policy'?"
    ]
    assert messages(doc(colour="red")) == [
        "colour: unknown field (allowed: name, description, model, devices, repetitions, warmup, seed, "
        "edge_server, inference, optimisation, sweep, timing, monitors, load, network, hardware, background_traffic, "
        "runtime)"
    ]


def test_required_fields() -> None:
    assert messages({"name": "t"}) == [
        "devices: is required",
        "model: is required for runtime layers, which runs the testbed's model: give a model name such as fake",
    ]


def test_conditionally_required_fields_name_the_condition() -> None:
    raw = doc(network={"device1": {"variation": {"kind": "uniform", "low_ms": 1, "high_ms": 2}}})
    assert messages(raw) == ["network.device1.variation.interval_s: is required when kind is uniform"]
    raw = doc(load={"device1": {"mode": "processes"}})
    assert messages(raw) == ["load.device1.processes: is required when mode is processes"]
    raw = doc(model={"name": "fake", "input": {"kind": "npy"}})
    assert messages(raw) == ["model.input.path: is required when kind is npy or images"]


def test_wrong_type_of_a_union_names_both_forms() -> None:
    assert messages(doc(model=5)) == ["model: expected a string or a mapping, got integer 5"]


def test_union_errors_come_from_the_matching_branch() -> None:
    raw = doc(model={"name": "fake", "parms": {}})
    assert messages(raw) == ["model.parms: unknown field; did you mean 'params'?"]


def test_invalid_names() -> None:
    raw = doc(name="-bad", devices=["1st"])
    assert messages(raw) == [
        "devices[0]: '1st' is not a valid device name (letters, digits, '_' and '-', starting with a letter, "
        "at most 63 characters)",
        "name: '-bad' is not a valid scenario name (letters, digits, '_', '.' and '-', "
        "starting with a letter or a digit, at most 64 characters)",
    ]


def test_empty_list() -> None:
    assert messages(doc(devices=[])) == ["devices: must not be empty"]


def test_edge_is_not_a_device_name() -> None:
    assert messages(doc(devices=["device1", "edge"])) == [
        "devices[1]: edge is reserved for the edge server and cannot be a device name"
    ]


def test_non_finite_numbers_and_non_string_keys_are_refused() -> None:
    raw = doc(model={"name": "fake", "params": {"x": float("nan"), 3: "y"}})
    assert messages(raw) == [
        "model.params: keys must be strings, got 3",
        "model.params.x: nan is not a finite number",
    ]


def test_errors_are_sorted_naturally() -> None:
    raw = doc(devices=[f"d{i}" for i in range(12)] + ["d2", "d10"])
    assert messages(raw) == ["devices[12]: d2 appears twice", "devices[13]: d10 appears twice"]


# -- semantic checks ------------------------------------------------------------------------------------


def test_device_not_in_devices() -> None:
    assert messages(doc(load={"device7": {"mode": "light"}})) == ["load.device7: device7 is not in devices"]
    for block, conf in (
        ("network", {"delay_ms": 1}),
        ("hardware", {"threads": 1}),
        ("background_traffic", {"bitrate_mbit": 1}),
    ):
        assert messages(doc(**{block: {"device9": conf}})) == [f"{block}.device9: device9 is not in devices"]


def test_edge_is_not_a_device_block() -> None:
    assert messages(doc(hardware={"edge": {"threads": 2}})) == [
        "hardware.edge: edge is the edge server, not a device; its settings live in edge_server"
    ]


def test_duplicate_devices() -> None:
    assert messages(doc(devices=["device1", "device2", "device1"])) == ["devices[2]: device1 appears twice"]


def test_partition_point_beyond_the_stage_count() -> None:
    raw = doc(model="alexnet", inference={"partition_points": [0, 11, 12]})
    assert messages(raw) == [
        "inference.partition_points[2]: 12 is beyond the 11 stages of model alexnet "
        "(partition points are 0..11)"
    ]


def test_partition_point_beyond_the_stage_count_with_params() -> None:
    stages = [{"work": 1, "output_bytes": 8}] * 3
    raw = doc(model={"name": "fake", "params": {"stages": stages}}, inference={"partition_points": [[3, 4]]})
    assert messages(raw) == [
        "inference.partition_points[0][1]: 4 is beyond the 3 stages of model fake (partition points are 0..3)"
    ]


def test_unknown_model() -> None:
    assert messages(doc(model="xyz")) == ["model: unknown model 'xyz'"]
    assert messages(doc(model={"name": "xyz"})) == ["model.name: unknown model 'xyz'"]


def test_registered_model_without_a_known_stage_count_needs_partition_points() -> None:
    raw = doc(model={"name": "fake", "params": {"profile": "nonexistent"}})
    assert messages(raw) == [
        "inference.partition_points: is required: "
        "the stage count of model 'fake' is not known before it is built"
    ]
    raw["inference"] = {"partition_points": [0, 1]}
    assert messages(raw) == []


def test_vector_length_must_match_the_devices() -> None:
    raw = doc(inference={"partition_points": [[1, 2], [1, 2, 3], [4]]})
    assert messages(raw) == [
        "inference.partition_points[1]: has 3 points but there are 2 devices",
        "inference.partition_points[2]: has 1 point but there are 2 devices",
    ]


def test_sweep_path_must_exist() -> None:
    raw = doc(sweep={"path": "edge_server.polcy", "values": ["RR"]})
    assert messages(raw) == ["sweep.path: edge_server.polcy does not exist; did you mean edge_server.policy?"]
    raw = doc(sweep=[{"path": "seed", "values": [1]}, {"path": "nothing.here", "values": [1]}])
    assert messages(raw) == ["sweep[1].path: nothing.here does not exist"]


def test_sweep_paths_the_schema_defines_but_the_document_lacks_are_allowed() -> None:
    raw = doc(
        sweep=[
            {"path": "network.device1.delay_ms", "values": [0, 50]},
            {"path": "optimisation.policy", "values": ["RR"]},
        ]
    )
    assert validate(raw) == []


def test_sweep_paths_must_not_overlap() -> None:
    raw = doc(
        sweep=[{"path": "edge_server", "values": [{}]}, {"path": "edge_server.policy", "values": ["RR"]}]
    )
    assert messages(raw) == ["sweep[1].path: edge_server.policy overlaps sweep[0].path (edge_server)"]


def test_low_above_high() -> None:
    variation = {"kind": "square", "low_ms": 20, "high_ms": 10, "period_s": 4}
    assert messages(doc(network={"device1": {"variation": variation}})) == [
        "network.device1.variation.low_ms: low_ms (20) is greater than high_ms (10)"
    ]


def test_a_loss_correlation_out_of_range_or_without_a_loss_names_its_path() -> None:
    assert messages(doc(network={"device1": {"loss_pct": 10, "loss_correlation_pct": 101}})) == [
        "network.device1.loss_correlation_pct: 101 is greater than 100"
    ]
    need = "a loss correlation ({} %) needs a loss: set loss_pct above 0 beside it"
    assert messages(doc(network={"device1": {"loss_correlation_pct": 50}})) == [
        "network.device1.loss_correlation_pct: " + need.format(50)
    ]
    assert messages(doc(network={"device1": {"loss_pct": 0, "loss_correlation_pct": 12.5}})) == [
        "network.device1.loss_correlation_pct: " + need.format(12.5)
    ]
    edge = {"edge": {"delay_ms": 5, "loss_correlation_pct": 25}, "device2": {"loss_correlation_pct": -1}}
    assert messages(doc(network={"device1": {"loss_pct": 5, "destinations": edge}})) == [
        "network.device1.destinations.device2.loss_correlation_pct: -1 is less than 0",
        "network.device1.destinations.edge.loss_correlation_pct: " + need.format(25),
    ]
    # The device's own loss does not count for a destination's profile, which replaces it on that link.
    assert validate(doc(network={"device1": {"loss_pct": 10, "loss_correlation_pct": 0}})) == []
    assert validate(doc(network={"device1": {"loss_pct": 10, "loss_correlation_pct": 100}})) == []
    # A sweep of the loss down to 0 names the variant that leaves the correlation without one.
    raw = doc(
        network={"device1": {"loss_pct": 10, "loss_correlation_pct": 50}},
        sweep={"path": "network.device1.loss_pct", "values": [10, 0]},
    )
    assert [e.path for e in validate(raw)] == ["network.device1.loss_correlation_pct"]
    assert "network.device1.loss_pct=0" in messages(raw)[0]


def test_processes_without_mode_processes() -> None:
    assert messages(doc(load={"device1": {"mode": "heavy", "processes": 2}})) == [
        "load.device1.processes: only valid with mode processes (mode is heavy)"
    ]


def test_continuous_only_fields() -> None:
    assert messages(doc(load={"device1": {"mode": "light", "regime": "heavy", "interval_s": 5}})) == [
        "load.device1.interval_s: only valid with mode continuous (mode is light)",
        "load.device1.regime: only valid with mode continuous (mode is light)",
    ]


def test_unknown_optimiser() -> None:
    assert messages(doc(optimisation={"algorithm": "annealing"})) == [
        "optimisation.algorithm: unknown optimiser 'annealing' "
        "(registered under dit.optimisers: exact, exhaustive, greedy, trend)"
    ]
    assert validate(doc(optimisation={"enabled": False, "algorithm": "annealing"})) == []


def test_invalid_destination_cidr() -> None:
    raw = doc(
        network={"device1": {"destinations": {"10.0.0.0/33": {"delay_ms": 1}, "edge": {"delay_ms": 2}}}}
    )
    assert messages(raw) == [
        "network.device1.destinations[\"10.0.0.0/33\"]: '10.0.0.0/33' is not a valid CIDR"
    ]


# -- sweep variants ---------------------------------------------------------------------------------


def test_invalid_sweep_value_names_the_sweep_path_and_value() -> None:
    raw = doc(sweep={"path": "edge_server.policy", "values": ["RR", "FIFO"]})
    assert messages(raw) == ["sweep.values[1]: edge_server.policy='FIFO': 'FIFO' is not one of RR, SJF"]
    with pytest.raises(ScenarioError) as info:
        expand(raw)
    assert [e.path for e in info.value.errors] == ["sweep.values[1]"]


def test_sweep_value_with_a_semantic_error() -> None:
    raw = doc(model="alexnet", sweep={"path": "inference.partition_points", "values": [[0, 4], [0, 40]]})
    assert messages(raw) == [
        "sweep.values[1]: inference.partition_points=[0, 40]: inference.partition_points[1]: "
        "40 is beyond the 11 stages of model alexnet (partition points are 0..11)"
    ]


def test_sweep_creating_a_block_for_an_unknown_device() -> None:
    raw = doc(sweep={"path": "load.device9.mode", "values": ["light", "heavy"]})
    assert messages(raw) == ["sweep.path: load.device9.mode: load.device9: device9 is not in devices"]


def test_error_elsewhere_caused_by_a_sweep_names_the_variant() -> None:
    raw = doc(
        inference={"partition_points": [[1, 2]]}, sweep={"path": "devices", "values": [["a", "b"], ["a"]]}
    )
    assert messages(raw) == [
        'inference.partition_points[0]: has 2 points but there is 1 device (with devices=["a"])'
    ]


def test_expand_raises_with_every_error() -> None:
    with pytest.raises(ScenarioError) as info:
        expand(doc(repetitions=0, load={"device7": {"mode": "light"}}))
    assert str(info.value) == "load.device7: device7 is not in devices\nrepetitions: 0 is less than 1"


def test_top_level_must_be_a_mapping() -> None:
    assert messages([1, 2]) == ["the top level must be a mapping, got list"]  # type: ignore[arg-type]


def test_each_missing_key_is_said_once() -> None:
    """Issue 49 item 6: jsonschema reports each missing key on its own; rendering every missing key for
    each made two missing keys read "is required; is required" at each field (scenario and action inputs)."""
    from dit.runtime_api.interface import Action
    from dit.runtime_ops.plays import InputError, validate_inputs

    assert [m for m in messages({}) if m.endswith(": is required")] == [
        "devices: is required",
        "name: is required",
    ]
    schema = {"type": "object", "required": ["path", "sha256"], "properties": {"path": {}, "sha256": {}}}
    action = Action("a", "A", "an action", schema, lambda _inputs: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(InputError) as refused:
        validate_inputs(action, {})
    assert [(e.path, e.message) for e in refused.value.errors] == [
        ("path", "is required"),
        ("sha256", "is required"),
    ]
