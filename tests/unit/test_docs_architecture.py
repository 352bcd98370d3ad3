"""docs/architecture.md: every path it names exists and every dit name it gives imports."""

from __future__ import annotations

import importlib
import re

import pytest

from tests.conftest import REPO

DOC = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
CODE = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", DOC, flags=re.S))  # inline code, not the diagram
ROOTS = (
    "src/",
    "roles/",
    "library/",
    "playbooks/",
    "scenarios/",
    "tests/",
    "action_plugins/",
    "module_utils/",
)
PATHS = sorted({c for c in CODE if c.startswith(ROOTS) and "<" not in c and "*" not in c})
GROUPS = set(re.findall(r"entry-point group\s+`(dit\.\w+)`", DOC))  # names of groups, not of modules
NAMES = sorted({m.group(0) for c in CODE for m in [re.match(r"dit(\.[A-Za-z_]\w*)+", c)] if m} - GROUPS)
PYPROJECT = (REPO / "pyproject.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize("path", PATHS)
def test_named_path_exists(path: str) -> None:
    assert (REPO / path).exists(), f"docs/architecture.md names {path}, which does not exist"


def test_the_test_files_of_the_worked_example_exist() -> None:
    row = next(
        line for line in DOC.splitlines() if line.startswith("| `tests/unit/test_conditions_netem_tc.py`")
    )
    for name in re.findall(r"`(?:tests/unit/)?(test_\w+\.py)`", row):
        assert (REPO / "tests" / "unit" / name).is_file(), name


@pytest.mark.parametrize("name", NAMES)
def test_named_python_object_exists(name: str) -> None:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            target = getattr(target, attr)
        return
    pytest.fail(f"docs/architecture.md names {name}, which does not import")


def test_entry_point_groups_are_as_the_page_says() -> None:
    assert {"dit.optimisers", "dit.models", "dit.runtimes"} == GROUPS
    for group in ("dit.optimisers", "dit.models"):
        assert f'[project.entry-points."{group}"]' in PYPROJECT
    # the page says there is no runtime plug-in point yet: when there is one, the page must change
    assert "dit.runtimes" not in PYPROJECT
