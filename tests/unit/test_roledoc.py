"""dit.devtools.roledoc: every role's README carries the variables table generated from its argument spec."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dit.devtools.roledoc import (
    BEGIN,
    END,
    USE_BEGIN,
    modules_called,
    roles,
    updated_architecture,
    updated_readme,
    variables_table,
)
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


# -- what a human learns from: requirements, an example that parses, the variables in use ----------------
def _section_text(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n") + len(heading) + 5
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else len(text)]


def _example(role: Path) -> str:
    section = _section_text((role / "README.md").read_text(encoding="utf-8"), "Example Playbook")
    match = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert match, f"{role.name}/README.md: no yaml block under ## Example Playbook"
    return match.group(1)


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_role_readme_has_requirements_an_example_and_the_variables_in_use(role: Path) -> None:
    text = (role / "README.md").read_text(encoding="utf-8")
    for heading in ("Requirements", "Example Playbook", "Variables", "Variables in use"):
        assert f"\n## {heading}\n" in text, f"{role.name}/README.md has no ## {heading}"
    assert text.index("## Example Playbook") < text.index(BEGIN) < text.index("## Variables in use")
    assert USE_BEGIN in text, f"{role.name}/README.md: how dit runs it is not generated"
    assert updated_readme(role) == text, (
        f"{role.name}/README.md is out of date: python -m dit.devtools.roledoc"
    )


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_an_example_sets_only_the_roles_variables(role: Path) -> None:
    (play,) = yaml.safe_load(_example(role))
    (entry,) = [r for r in play["roles"] if r["role"] == role.name]
    options = set(
        yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
            "options"
        ]
    )
    assert set(entry.get("vars", {})) <= options, (
        f"{role.name}: {set(entry['vars']) - options} are not its variables"
    )
    assert set(play.get("vars", {})) <= {"dit_run_id", "dit_node_root", "dit_journal_path"}


def test_the_example_playbooks_parse_as_written(tmp_path: Path) -> None:
    """``ansible-playbook --syntax-check`` of every README's example, run from the checkout as a person would."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  children:\n    edge: {hosts: {edge: {}}}\n    devices: {hosts: {device1: {}}}\n",
        encoding="utf-8",
    )
    books = []
    for role in ROLES:
        book = tmp_path / f"{role.name}.yml"
        book.write_text(_example(role), encoding="utf-8")
        books.append(str(book))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            "--syntax-check",
            "-i",
            str(inventory),
            *books,
        ],
        cwd=REPO,
        env={**env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_architecture_page_draws_the_node_side_as_the_files_have_it() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert updated_architecture(REPO) == text, "docs/architecture.md: run python -m dit.devtools.roledoc"
    assert "roles/netem                 ──► dit_nfqueue*, dit_proc*, dit_tc*" in text


def test_modules_called_reads_blocks_and_handlers(tmp_path: Path) -> None:
    role = fake_role(tmp_path)
    (tmp_path / "library").mkdir()
    for name in ("dit_a", "dit_b", "dit_c"):
        (tmp_path / "library" / f"{name}.py").write_text("")
    (role / "tasks").mkdir()
    (role / "handlers").mkdir()
    (role / "tasks" / "main.yml").write_text(
        "- name: one\n  dit_b: {}\n- block:\n    - name: two\n      dit_a: {}\n"
        "  rescue:\n    - ansible.builtin.debug: {}\n"
    )
    (role / "handlers" / "main.yml").write_text("- name: three\n  dit_c: {}\n  listen: x\n")
    assert modules_called(role) == ["dit_a", "dit_b", "dit_c"]
