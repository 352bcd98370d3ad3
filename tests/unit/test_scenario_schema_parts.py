"""dit.devtools.scenario_schema: the scenario schema is the scenario's part plus every condition's fragment."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import dit.conditions
from dit.conditions import conditions
from dit.devtools.scenario_schema import BASE, assemble, fragments, main, render
from dit.scenario import device_blocks, load_schema, validate
from tests.conftest import REPO

SCHEMA = REPO / "scenarios" / "scenario.schema.json"


def test_the_checked_in_schema_is_what_the_parts_assemble_to() -> None:
    # after editing a condition's schema.json: python -m dit.devtools.scenario_schema
    assert main(["--check"]) == 0


def test_the_check_refuses_a_schema_the_parts_do_not_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "scenario.schema.json"
    stale.write_text(
        SCHEMA.read_text(encoding="utf-8").replace('"Threads"', '"Thread count"'), encoding="utf-8"
    )
    monkeypatch.setattr("dit.devtools.scenario_schema.schema_path", lambda: stale)
    assert main(["--check"]) == 1
    assert "run python -m dit.devtools.scenario_schema" in capsys.readouterr().err


def test_each_block_a_condition_sets_comes_from_its_own_package() -> None:
    owners = {path.parent.name: json.loads(path.read_text(encoding="utf-8")) for path in fragments()}
    assert set(owners["netem"]["properties"]) == {"network"}
    assert set(owners["load"]["properties"]) == {"load"}
    assert set(owners["background_traffic"]["properties"]) == {"background_traffic"}
    assert set(owners["monitors"]["properties"]) == {"monitors"}
    assert set(owners["cpufreq"]["$defs"]["hardware"]["properties"]) == {"cpu_freq_mhz", "governor"}
    base = json.loads(BASE.read_text(encoding="utf-8"))
    assert not {"network", "load", "background_traffic", "monitors"} & set(base["properties"])
    assert set(base["$defs"]["hardware"]["properties"]) == {
        "cpu_budget_pct"
    }  # the analysis's, no condition's
    assert {path.parent.name for path in fragments()} <= {c.name for c in conditions()}


def test_two_parts_defining_one_field_is_refused_naming_both(tmp_path: Path) -> None:
    twin = tmp_path / "schema.json"
    twin.write_text(json.dumps({"$defs": {"hardware": {"properties": {"threads": {"type": "integer"}}}}}))
    with pytest.raises(
        ValueError, match=r"schema\.json: \$defs\.hardware\.properties\.threads is defined by "
    ):
        assemble(parts=[*fragments(), twin])


def test_fields_keep_the_order_of_the_checked_in_file_and_a_new_one_goes_last(tmp_path: Path) -> None:
    like = json.loads(SCHEMA.read_text(encoding="utf-8"))
    new = tmp_path / "schema.json"
    new.write_text(json.dumps({"properties": {"fans": {"type": "object"}}}))
    keys = list(assemble(parts=[*fragments(), new], like=like)["properties"])
    assert keys == [*like["properties"], "fans"]


def test_render_writes_small_leaves_on_one_line() -> None:
    text = render({"a": {"title": "A", "type": "string", "enum": ["x", "y"]}, "b": {"$ref": "#/$defs/c"}})
    assert text.splitlines() == [
        "{",
        '  "a": {',
        '    "title": "A",',
        '    "type": "string",',
        '    "enum": ["x", "y"]',
        "  },",
        '  "b": {"$ref": "#/$defs/c"}',
        "}",
    ]


def test_the_per_device_blocks_and_their_checks_are_the_conditions() -> None:
    assert device_blocks() == ("load", "network", "hardware", "background_traffic")
    named = {block: node.get("x-check") for block, node in load_schema()["properties"].items()}
    assert {block: check for block, check in named.items() if check} == {
        "load": "dit.conditions.load:check_block",
        "network": "dit.conditions.netem:check_block",
        "background_traffic": "dit.conditions.background_traffic:check_block",
    }


def test_a_condition_check_reports_at_its_field() -> None:
    errors = validate(
        {
            "name": "x",
            "devices": ["d1"],
            "model": "alexnet",
            "background_traffic": {"d1": {"bitrate_mbit": 1, "target": "d1"}},
        }
    )
    assert [str(e) for e in errors] == [
        "background_traffic.d1.target: a device cannot send background traffic to itself"
    ]


def test_every_condition_check_has_a_block_to_check() -> None:
    """A check_block without a block in its package's schema.json would never be called."""
    folder = Path(dit.conditions.__file__).parent
    for condition in conditions():
        module = importlib.import_module(f"dit.conditions.{condition.name}")
        if hasattr(module, "check_block"):
            fragment = json.loads((folder / condition.name / "schema.json").read_text(encoding="utf-8"))
            assert fragment.get("properties"), (
                f"{condition.name}: check_block but no block in its schema.json"
            )
