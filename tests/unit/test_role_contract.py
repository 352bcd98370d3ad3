"""Every role: ``meta/argument_specs.yml`` declares exactly the variables of ``defaults/main.yml``, with
the same defaults, types the defaults satisfy, and no ``required`` that a default makes unable to
fire; and every variable a condition's builder sets (``dit.conditions``) is one the role declares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from dit.conditions import conditions
from tests.conftest import REPO

ROLES = sorted(p.parent.parent for p in REPO.glob("roles/*/meta/argument_specs.yml"))


def spec_options(role: Path) -> dict[str, Any]:
    doc = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
    options: dict[str, Any] = doc["argument_specs"]["main"].get("options") or {}
    return options


def defaults(role: Path) -> dict[str, Any]:
    path = role / "defaults" / "main.yml"
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    return loaded or {}


def templated(value: Any) -> bool:
    """A default computed when the role runs (from host variables): no fixed value to document."""
    return isinstance(value, str) and "{{" in value


def contract_problems(options: dict[str, Any], values: dict[str, Any]) -> list[str]:
    out = [
        f"{key}: in defaults/main.yml but not in the argument spec"
        for key in sorted(set(values) - set(options))
    ]
    out += [
        f"{key}: in the argument spec but not in defaults/main.yml"
        for key in sorted(set(options) - set(values))
    ]
    for key in sorted(set(options) & set(values)):
        option, value = options[key] or {}, values[key]
        if option.get("required"):
            out.append(f"{key}: required, but defaults/main.yml sets it, so the check can never fire")
        if templated(value):
            if "default" in option:
                out.append(
                    f"{key}: the spec's default {option['default']!r} stands for the template {value!r}"
                )
        elif option.get("default") != value:
            out.append(f"{key}: spec default {option.get('default')!r}, defaults/main.yml {value!r}")
    fixed = {key: value for key, value in values.items() if key in options and not templated(value)}
    result = ArgumentSpecValidator(options).validate(fixed)
    out += [f"defaults/main.yml does not fit the spec: {message}" for message in result.error_messages]
    return out


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_argument_spec_is_the_defaults(role: Path) -> None:
    assert contract_problems(spec_options(role), defaults(role)) == []


@pytest.mark.parametrize("condition", [c for c in conditions() if c.role], ids=lambda c: c.name)
def test_every_variable_a_condition_sets_is_declared_by_its_role(condition: Any) -> None:
    role = REPO / "roles" / condition.role
    declared = spec_options(role)
    assert sorted(set(condition.variables) - set(declared)) == []
    assert sorted(set(condition.variables) - set(defaults(role))) == []


def test_every_role_has_an_argument_spec() -> None:
    assert sorted(r.name for r in ROLES) == sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())


def test_the_contract_names_each_kind_of_mismatch() -> None:
    options = {
        "a_x": {"type": "str", "required": True},
        "a_y": {"type": "int", "default": 2},
        "a_z": {"type": "path", "default": "/sys"},
        "a_w": {"type": "int"},
    }
    values = {"a_x": "", "a_y": 3, "a_z": "{{ sysfs_root }}", "a_w": "many", "a_v": 1}
    assert contract_problems(options, values) == [
        "a_v: in defaults/main.yml but not in the argument spec",
        "a_w: spec default None, defaults/main.yml 'many'",
        "a_x: required, but defaults/main.yml sets it, so the check can never fire",
        "a_x: spec default None, defaults/main.yml ''",
        "a_y: spec default 2, defaults/main.yml 3",
        "a_z: the spec's default '/sys' stands for the template '{{ sysfs_root }}'",
        "defaults/main.yml does not fit the spec: argument 'a_w' is of type str and we were unable to "
        "convert to int: \"'many'\" cannot be converted to an int",
    ]
