"""docs/architecture.md: every path it names exists and every dit name it gives imports."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.names import resolves

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
    "runtimes/",
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
    assert resolves(name), f"docs/architecture.md names {name}, which does not import"


def test_entry_point_groups_are_as_the_page_says() -> None:
    assert {"dit.optimisers", "dit.models", "dit.runtimes"} == GROUPS
    for group in ("dit.optimisers", "dit.models", "dit.runtimes"):
        assert f'[project.entry-points."{group}"]' in PYPROJECT


# -- the claims of the page that hold the code's structure -----------------------------------------------
SRC = REPO / "src" / "dit"
CONDITIONS = sorted(p.name for p in (SRC / "conditions").iterdir() if (p / "__init__.py").is_file())
#: outside conditions/, the modules that read one condition's own outputs or functions (the page names them)
CONDITION_READERS = {"src/dit/report/rtt.py": {"netem"}, "src/dit/rack/plan.py": {"cpu_share"}}


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at the top or inside a function (relative imports resolved)."""
    package = ".".join(path.relative_to(REPO / "src").with_suffix("").parts[:-1])
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            )
            module = ".".join(part for part in (base, node.module or "") if part)
            found += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return found


def test_the_top_level_of_the_package_holds_at_most_eight_modules() -> None:
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert len(modules) <= 8, f"src/dit/ holds {len(modules)} modules: {modules}; give the new one a package"


def test_the_driver_class_stays_a_sequencer_of_at_most_400_lines() -> None:
    """docs/architecture.md: ``driver.py`` sequences the stages; what a stage reads of its outcome lives
    beside it (``preflight.py``, ``apply.py``, ``profile.py``, ``collect.py``, ...), not in the class."""
    tree = ast.parse((SRC / "run" / "driver.py").read_text(encoding="utf-8"))
    (driver,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Driver"]
    lines = (driver.end_lineno or driver.lineno) - driver.lineno + 1
    assert lines <= 400, f"the Driver class has {lines} lines: move a stage's reading beside it (dit/run/)"


@pytest.mark.parametrize("condition", CONDITIONS)
def test_no_condition_is_named_outside_the_conditions(condition: str) -> None:
    """The page: the driver discovers the conditions and names none; only the listed readers import one."""
    named = [
        str(path.relative_to(REPO))
        for path in SRC.rglob("*.py")
        if "conditions" not in path.relative_to(SRC).parts[:1]
        and condition not in CONDITION_READERS.get(str(path.relative_to(REPO)), set())
        and any(m.startswith(f"dit.conditions.{condition}") for m in _imports(path))
    ]
    assert not named, f"{named} import the {condition} condition: reach it through a hook of dit.conditions"


@pytest.mark.parametrize("module", ["driver.py", "journal.py", "teardown.py"])
def test_the_run_engine_spells_no_condition_name(module: str) -> None:
    """Not even as a key of the built conditions (``conditions[host]["netem"]``): that is a hook's job."""
    tree = ast.parse((SRC / "run" / module).read_text(encoding="utf-8"))
    spelled = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in CONDITIONS
    }
    assert not spelled, f"src/dit/run/{module} names the conditions {sorted(spelled)}"


@pytest.mark.parametrize("path", sorted(SRC.joinpath("device").glob("*.py")), ids=lambda p: p.name)
def test_the_device_code_imports_only_the_standard_library_and_itself(path: Path) -> None:
    """The page: device/ is stdlib only (it ships as a zipapp to boards with nothing else installed);
    the zipapp builder alone reads the installed package to find the sources it packs."""
    allowed = {"dit"} if path.name == "build.py" else set()
    foreign = sorted(
        module
        for module in _imports(path)
        if module.split(".")[0] not in sys.stdlib_module_names
        and not module.startswith("dit.device")
        and module not in allowed
        and module != "__future__.annotations"
    )
    assert not foreign, f"src/dit/device/{path.name} imports {foreign}"


@pytest.mark.parametrize("path", sorted(SRC.joinpath("runtime_api").glob("*.py")), ids=lambda p: p.name)
def test_the_runtime_interface_and_registry_import_nothing_above_the_scenario(path: Path) -> None:
    """The page: the scenario schema asks the registry for each runtime's block, so runtime_api/ stands
    below the scenario and imports none of what stands above it (not even for an annotation)."""
    above = {"scenario", "analysis", "run", "runtimes", "runtime_ops", "web", "cli"}
    upward = sorted(
        m for m in _imports(path) if m.split(".")[0] == "dit" and m.split(".")[1:2] in ([a] for a in above)
    )
    assert not upward, f"src/dit/runtime_api/{path.name} imports {upward}"


@pytest.mark.parametrize("path", sorted(SRC.joinpath("scenario").glob("*.py")), ids=lambda p: p.name)
def test_the_scenario_imports_no_condition(path: Path) -> None:
    """The page: a condition's block check is called by the name the schema gives it (``x-check``);
    the conditions stand above the scenario (a builder takes a Scenario)."""
    named = sorted(m for m in _imports(path) if m.startswith("dit.conditions"))
    assert not named, f"src/dit/scenario/{path.name} imports {named}"


def test_the_scenario_names_no_condition_block_in_its_checks() -> None:
    """The page: no ``if block == "network"`` in the scenario's checks; each condition checks its own."""
    tree = ast.parse((SRC / "scenario" / "core.py").read_text(encoding="utf-8"))
    spelled = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and node.value in ("load", "network", "background_traffic", "hardware")
    }
    assert not spelled, f"src/dit/scenario/core.py names the blocks {sorted(spelled)}"


def test_every_chapter_module_is_in_the_registry_and_the_entry_points_name_none() -> None:
    """docs/architecture.md, "A chapter of dit reproduce": a chapter is its module and a registry line; the
    command and the report ask the registry instead of an if/elif per chapter."""
    from dit.reproduce.chapters import REGISTRY

    modules = sorted(p.stem for p in SRC.joinpath("reproduce").glob("ch[0-9]*.py"))
    assert sorted(REGISTRY) == modules, "each src/dit/reproduce/chN.py ends with CHAPTER, listed in REGISTRY"
    for path in (SRC / "cli.py", SRC / "commands" / "reproduce.py", SRC / "reproduce" / "report.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        spelled = {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in REGISTRY
        }
        assert not spelled, f"{path.relative_to(REPO)} names the chapters {sorted(spelled)}: ask the Chapter"


def test_the_dit_command_only_assembles_its_groups() -> None:
    """docs/architecture.md, "A command": each command is defined in its group's module of dit.commands
    (or, for a group of sub-commands, its package's cli.py); src/dit/cli.py only names them."""
    import typer.main

    from dit.cli import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.main.TyperGroup)
    for name, command in group.commands.items():
        callback = command.callback
        if isinstance(command, typer.main.TyperGroup):
            continue  # rack, runtimes: their package's cli.py
        module = getattr(callback, "__module__", "")
        assert module.startswith("dit.commands."), (
            f"dit {name} is defined in {module}: give it a dit.commands module"
        )
    tree = ast.parse((SRC / "cli.py").read_text(encoding="utf-8"))
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defined == ["_add_runtimes"], (
        f"src/dit/cli.py defines {defined}: a command's code goes to dit.commands"
    )
