"""Every module in library/: its DOCUMENTATION, EXAMPLES and RETURN are YAML of the shape Ansible
reads, and the documented options are exactly the argument_spec the module runs with.

The argument_spec is taken from the module itself: ``main()`` runs with ``AnsibleModule`` replaced by
a recorder that stops it at construction (as ansible-test's validate-modules does), so a module needs
no particular layout and a new module is covered without touching this file.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dit.run.node_modules import recorded_from_source
from tests.ansible_modules import REPO, library_module, library_names, with_dit_fragments

MODULES = library_names()
SUPPORT = {"full", "partial", "none", "N/A"}


def module_kwargs(name: str) -> dict[str, Any]:
    """The keyword arguments ``library/<name>.py`` passes to ``AnsibleModule`` (recorded as dit's module
    build records them)."""
    return recorded_from_source(REPO, [name])[name]


def docs(name: str) -> tuple[dict[str, Any], Any, Any]:
    module = library_module(name, as_name=f"contract_docs_{name}")
    return (
        with_dit_fragments(yaml.safe_load(module.DOCUMENTATION)),
        yaml.safe_load(module.EXAMPLES),
        yaml.safe_load(module.RETURN),
    )


def is_text(value: Any) -> bool:
    """A description: a string or a list of strings (a plain scalar holding ``: `` is neither)."""
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def mismatches(documented: dict[str, Any], spec: dict[str, Any], where: str) -> list[str]:
    """How the documented options differ from an argument_spec, one line per difference."""
    out = []
    for key in sorted(set(documented) - set(spec)):
        out.append(f"{where}{key}: documented but not in argument_spec")
    for key in sorted(set(spec) - set(documented)):
        out.append(f"{where}{key}: in argument_spec but not documented")
    for key in sorted(set(documented) & set(spec)):
        doc, arg = documented[key] or {}, spec[key]
        if not is_text(doc.get("description")):
            out.append(
                f"{where}{key}.description: not a string or a list of strings: {doc.get('description')!r}"
            )
        for field, absent in (("type", "str"), ("required", False), ("default", None), ("elements", None)):
            if doc.get(field, absent) != arg.get(field, absent):
                out.append(
                    f"{where}{key}.{field}: documented {doc.get(field, absent)!r}, "
                    f"argument_spec {arg.get(field, absent)!r}"
                )
        if sorted(map(str, doc.get("choices") or [])) != sorted(map(str, arg.get("choices") or [])):
            out.append(
                f"{where}{key}.choices: documented {doc.get('choices')}, argument_spec {arg.get('choices')}"
            )
        if doc.get("suboptions") or arg.get("options"):
            out += mismatches(doc.get("suboptions") or {}, arg.get("options") or {}, f"{where}{key}.")
    return out


@pytest.mark.parametrize("name", MODULES)
def test_documentation_is_yaml_of_the_shape_ansible_reads(name: str) -> None:
    documentation, examples, returns = docs(name)
    assert isinstance(documentation, dict), f"{name}: DOCUMENTATION is not a mapping"
    assert documentation["module"] == name
    assert isinstance(documentation["short_description"], str)
    assert is_text(documentation["description"]), f"{name}: description {documentation['description']!r}"
    assert isinstance(documentation["author"], (str, list))
    assert isinstance(returns, dict), f"{name}: RETURN is not a mapping"
    for key, value in returns.items():
        assert is_text(value.get("description")), (
            f"{name}: RETURN {key}.description {value.get('description')!r}"
        )
        assert {"returned", "type"} <= set(value), f"{name}: RETURN {key} lacks returned or type"
    assert isinstance(examples, list) and examples, f"{name}: EXAMPLES is no list of tasks"
    for task in examples:
        assert isinstance(task, dict) and name in task, f"{name}: an example does not call the module: {task}"


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name: str) -> None:
    documentation, _, _ = docs(name)
    spec = module_kwargs(name)["argument_spec"]
    assert mismatches(documentation.get("options") or {}, spec, "") == []


@pytest.mark.parametrize("name", MODULES)
def test_check_and_diff_mode_support_is_declared_and_matches_the_module(name: str) -> None:
    documentation, _, _ = docs(name)
    attributes = documentation.get("attributes") or {}
    assert {"check_mode", "diff_mode"} <= set(attributes), f"{name}: attributes {sorted(attributes)}"
    for attribute in ("check_mode", "diff_mode"):
        support = attributes[attribute].get("support")
        assert support in SUPPORT, f"{name}: {attribute} {attributes[attribute]}"
        if support == "partial":  # what is left out must be said
            assert is_text(attributes[attribute].get("details")), f"{name}: {attribute} without details"
    supports_check_mode = bool(module_kwargs(name).get("supports_check_mode"))
    assert (attributes["check_mode"]["support"] != "none") == supports_check_mode
    fragments = documentation.get("extends_documentation_fragment") or []
    assert "ansible.builtin.action_common_attributes" in fragments  # defines the attributes' schema


def test_the_recorder_sees_every_option_of_a_known_module() -> None:
    """The capture itself: dit_cgroup's arguments, spelled out."""
    spec = module_kwargs("dit_cgroup")["argument_spec"]
    assert sorted(spec) == [
        "_dit_plan",
        "cpu_period_us",
        "cpu_quota_us",
        "field",
        "memory_limit_bytes",
        "path",
        "swap_limit_bytes",
    ]
    assert spec["memory_limit_bytes"] == {"type": "int"}  # one of it and cpu_quota_us (required_one_of)
    assert mismatches({"x": {"description": "a: b", "type": "int"}}, {"x": {"type": "str"}}, "") == [
        "x.type: documented 'int', argument_spec 'str'"
    ]
