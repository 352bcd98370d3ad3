"""dit.devtools.roledoc: every role's README carries the variables table generated from its argument spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from dit.devtools.roledoc import BEGIN, END, roles, updated_readme, variables_table
from tests.conftest import REPO

ROLES = roles(REPO)

SPEC = """---
argument_specs:
  main:
    short_description: Do a thing
    description:
      - Writes C(/etc/thing) on the node.
    options:
      thing_mode:
        description: The mode.
        type: str
        choices: [a, b]
        default: a
      thing_root:
        description: Where it goes, O(thing_mode) decides | how.
        type: path
      thing_list:
        description: [Items, "one per line."]
        type: list
        elements: str
        default: []
      thing_name:
        description: The name.
        type: str
        required: true
"""

DEFAULTS = """---
thing_mode: a
thing_root: "{{ sysfs_root | default('/sys') }}"
thing_list: []
"""


def fake_role(tmp_path: Path) -> Path:
    role = tmp_path / "roles" / "thing"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(SPEC, encoding="utf-8")
    (role / "defaults" / "main.yml").write_text(DEFAULTS, encoding="utf-8")
    return role


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_role_readme_carries_the_table_generated_from_its_argument_spec(role: Path) -> None:
    readme = role / "README.md"
    assert readme.exists(), f"{readme} is missing: run python -m dit.devtools.roledoc"
    text = readme.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{readme} has no generated variables table"
    table = text[text.index(BEGIN) + len(BEGIN) + 1 : text.index(END)]
    assert table == variables_table(role), f"{readme} is out of date: run python -m dit.devtools.roledoc"


def test_the_table_lists_type_default_and_description_in_spec_order(tmp_path: Path) -> None:
    assert variables_table(fake_role(tmp_path)).splitlines() == [
        "| Variable | Type | Default | Description |",
        "| --- | --- | --- | --- |",
        "| `thing_mode` | str | `a` | The mode. One of `a`, `b`. |",
        "| `thing_root` | path | `{{ sysfs_root \\| default('/sys') }}` (computed) "
        "| Where it goes, `thing_mode` decides \\| how. |",
        "| `thing_list` | list of str | `[]` | Items one per line. |",
        "| `thing_name` | str | required | The name. |",
    ]


def test_regenerating_replaces_only_the_table(tmp_path: Path) -> None:
    role = fake_role(tmp_path)
    (role / "README.md").write_text(f"# thing\n\nHand-written.\n\n{BEGIN}\n| stale |\n{END}\n\nMore.\n")
    assert updated_readme(role) == (
        f"# thing\n\nHand-written.\n\n{BEGIN}\n{variables_table(role)}{END}\n\nMore.\n"
    )


def test_a_readme_without_the_markers_is_named(tmp_path: Path) -> None:
    role = fake_role(tmp_path)
    (role / "README.md").write_text("# thing\n")
    with pytest.raises(ValueError, match=r"roles/thing/README.md: no generated variables table"):
        updated_readme(role)


def test_a_new_readme_starts_from_the_spec(tmp_path: Path) -> None:
    text = updated_readme(fake_role(tmp_path))
    assert text.startswith("# thing\n\nDo a thing.\n\nWrites `/etc/thing` on the node.\n\n")
    assert f"## Variables\n\n{BEGIN}\n{variables_table(tmp_path / 'roles' / 'thing')}{END}\n" in text
