"""User values reach Ansible as data (issue 28, items 1, 2 and 9): the extra-vars file marks every string
that could be a template unsafe, as Ansible itself loads it; no runtime action or readiness check pastes an
input into its plays' text; action inputs are typed by their schema."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from dit.ansible_data import unsafe_yaml
from dit.run.ansible_exec import write_extravars
from dit.runtime_api import registry
from dit.runtime_api.interface import Action, ActionPlan, Runtime
from dit.runtime_ops import plays as ops

PAYLOAD = "{{ lookup('pipe', 'touch /tmp/dit-planted') }}"


def ansible_loads(path: Path) -> Any:
    """``path`` as ``ansible-playbook -e @path`` loads it: a file trusted as a template source."""
    return DataLoader().load_from_file(str(path), trusted_as_template=True)


def render(value: Any) -> Any:
    return Templar(loader=DataLoader(), variables={"x": 1}).template(value)


def test_the_extravars_file_keeps_every_template_literal_as_ansible_loads_it(tmp_path: Path) -> None:
    values = {
        "dit_edge_config": {"params": {"note": "{{ x + 1 }}", "list": ["a{% if true %}b{% endif %}"]}},
        "{{ x + 2 }}": "a key",
        "comment": "{# c #}",
    }
    loaded = ansible_loads(write_extravars(tmp_path, values))
    assert render(loaded) == values  # nothing rendered, keys included
    # the same file without the marking would be rendered: the test above can fail
    (tmp_path / "plain.yml").write_text(json.dumps(values), encoding="utf-8")
    assert render(ansible_loads(tmp_path / "plain.yml"))["dit_edge_config"]["params"]["note"] == 2


def test_strings_that_look_like_numbers_keep_their_type() -> None:
    """ansible-core resolves a ``!unsafe`` scalar's type as if it were plain ('000…0' would be 0):
    only strings that can hold a template are tagged, and the others are quoted strings."""
    values = {"sha": "0" * 64, "yes": "yes", "n": "1.5", "none": "null", "real": [1, 1.5, True, None]}
    text = unsafe_yaml(values)
    assert "!unsafe" not in text
    assert DataLoader().load(text) == values


def test_every_stage_extravars_string_that_could_be_a_template_is_unsafe(tmp_path: Path) -> None:
    """A walk over a file as the stages write it: each string holding '{', '%' or '#' is tagged."""
    import yaml

    class Tagged(str):
        pass

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!unsafe", lambda loader, node: Tagged(loader.construct_scalar(node)))  # type: ignore[arg-type]

    values = {"a": {"b": [PAYLOAD, {"c%": "50%", "d": "#x", "plain": "text"}]}, PAYLOAD: 1}
    doc = yaml.load(write_extravars(tmp_path, values).read_text(encoding="utf-8"), Loader=Loader)

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for key, item in value.items():
                yield key
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)

    found = list(strings(doc))
    assert sorted(found) == sorted(strings(values))
    assert all(isinstance(s, Tagged) for s in found if set(s) & set("{%#"))
    assert not isinstance(next(s for s in found if s == "text"), Tagged)


def _shipped_runtimes() -> list[Runtime]:
    """Every installed runtime, and the two this tree ships (importable from their sources)."""
    from dit_llamacpp.dit_runtime import LlamaCppRpcRuntime
    from headsplit.dit_runtime import HeadSplitRuntime

    found: dict[str, Runtime] = dict(registry.installed())
    found.setdefault("headsplit", HeadSplitRuntime())
    found.setdefault("llamacpp-rpc", LlamaCppRpcRuntime())
    return list(found.values())


def _planted(schema: Mapping[str, Any], base: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Per string field of ``schema`` that admits it: ``base`` with that field set to a payload."""
    from jsonschema import Draft202012Validator

    for name in schema.get("properties") or {}:
        for value in ("x" + PAYLOAD, "/x" + PAYLOAD, ["x" + PAYLOAD]):
            candidate = {**base, name: value}
            if not list(Draft202012Validator(dict(schema)).iter_errors(candidate)):
                yield name, candidate


BASE_INPUTS: dict[tuple[str, str], dict[str, Any]] = {
    ("headsplit", "distribute-checkpoint"): {"path": "/nonexistent/ck.safetensors", "sha256": "0" * 64},
    # a checkpoint goes with its pin (issue 32): planting either alone is refused before any play
    ("headsplit", "build-speculation-profile"): {"checkpoint": "/nonexistent/ck", "sha256": "0" * 64},
}


@pytest.mark.parametrize("runtime", _shipped_runtimes(), ids=lambda r: r.name)
def test_no_action_pastes_an_input_into_its_plays(runtime: Runtime) -> None:
    planted = 0
    for action in runtime.actions():
        base = BASE_INPUTS.get((runtime.name, action.name), {})
        variants = list(_planted(action.inputs, base))
        if action.name == "distribute-checkpoint":  # the placement mode reads every other input
            more = {**base, "mode": "placement", "workers": ["device1"]}
            variants += list(_planted(action.inputs, more))
        for field, inputs in variants:
            plan = action.plan(ops.validate_inputs(action, inputs))
            assert isinstance(plan.plays, list)
            plays = json.dumps(plan.plays)
            assert "lookup('pipe'" not in plays, f"{runtime.name} {action.name} pastes {field} into its plays"
            ops.refuse_pasted(inputs, plan.plays, action.name)  # and the guard agrees
            planted += 1
    if runtime.name in ("headsplit", "llamacpp-rpc"):
        assert planted >= 3  # path, out, corpus / archive, mirror_url, cache: the walk reached them


@pytest.mark.parametrize("runtime", _shipped_runtimes(), ids=lambda r: r.name)
def test_no_readiness_check_pastes_the_scenario_block_into_its_plays(
    runtime: Runtime, tmp_path: Path
) -> None:
    schema = runtime.block_schema()
    for field, block in _planted(schema, {"name": runtime.name}):
        plan = runtime.readiness({"runtime": block}, tmp_path)
        assert "lookup('pipe'" not in json.dumps(plan.plays), f"{runtime.name} pastes runtime.{field}"


def test_a_plan_that_pastes_an_input_is_refused_naming_it() -> None:
    def paste(inputs: Mapping[str, Any]) -> ActionPlan:
        argv = ["echo", "/abs/" + str(inputs["path"])]
        return ActionPlan(plays=[{"hosts": "all", "tasks": [{"ansible.builtin.command": {"argv": argv}}]}])

    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    action = Action("paste", "Paste", "A defective plan.", schema, paste)
    inputs = {"path": "ck" + PAYLOAD}
    with pytest.raises(
        ops.InputError, match=r"path: .* would paste this value into its playbook's template text"
    ):
        ops.refuse_pasted(inputs, action.plan(inputs).plays, "runtime x's action paste")
    ops.refuse_pasted({"path": "plain/ck"}, paste({"path": "plain/ck"}).plays, "runtime x's action paste")
    # a value that merely ends in a delimiter is not taken for a paste of every play's own "{{ ... }}"
    honest = {
        "hosts": "all",
        "tasks": [{"ansible.builtin.command": {"argv": ["echo", "{{ dit_action_inputs.path }}"]}}],
    }
    ops.refuse_pasted({"path": "odd/name{{"}, [honest], "runtime x's action say")
    with pytest.raises(ops.InputError):
        ops.refuse_pasted({"path": "name{{"}, paste({"path": "name{{"}).plays, "runtime x's action paste")


def test_action_inputs_are_typed_by_their_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "sha256": {"type": "string"},
            "count": {"type": "integer"},
            "mode": {"enum": ["whole", "placement"]},
            "flag": {"type": "boolean"},
        },
    }
    got = ops.parse_sets(["sha256=" + "0" * 64, "count=3", "mode=whole", "flag=true"], schema)
    assert got == {"sha256": "0" * 64, "count": 3, "mode": "whole", "flag": True}
    assert ops.parse_sets(["sha256=0123"], schema)["sha256"] == "0123"
    assert ops.parse_sets(["other=12"], schema)["other"] == 12  # undeclared: read as YAML, as before
