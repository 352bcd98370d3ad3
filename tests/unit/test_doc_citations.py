"""Docs that cannot drift: every file, command, option, field, output name and symbol the README and
docs/*.md cite in backticks exists — in the tree, the CLI's own command tree, the scenario schema,
the sources that write the run directory, and the Python modules (read with ast, nothing imported).

What is checked, per backticked span (fenced blocks contribute their ``dit …`` command lines):

- **paths** under a top-level directory of the repository (``src/…``, ``docs/…``, ``roles/…``, …):
  exist; ``*`` is a glob that must match; spans with ``<placeholder>`` parts are skipped;
- **commands** ``dit <command> [--option …]``: the command (and sub-command) exists and every
  ``--option`` / ``-x`` is one of its parameters;
- **Python names** ``dit.…`` / ``headsplit.…``: a module, or a name defined at the top level of one
  (a class attribute as ``Class.attr``); entry-point groups from pyproject.toml are names too;
- **scenario fields** ``section.field…`` whose first part is a top-level property of the schema: the
  path exists in the schema (``<device>``-like parts match any key; ``runtime.*`` fields belong to the
  selected runtime and are left to its own docs);
- **output names**: ``*.csv`` / ``*.json`` / ``*.png`` / ``*.jsonl`` file names and column-like names
  (``…_ns``, ``…_bytes``, ``…_pct``, ``…_j``, ``…_w``, …) occur in the sources that write them.
"""

from __future__ import annotations

import ast
import functools
import gc
import importlib.util
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from dit.cli import app
from dit.scenario.schema import deref, load_schema

REPO = Path(__file__).resolve().parents[2]
TOP_DIRS = ("src", "docs", "tests", "scenarios", "roles", "library", "playbooks", "benchmarks", "runtimes",
            "module_utils", "action_plugins", "requirements", "mirror", "typings")  # fmt: skip
WRITER_DIRS = (
    "src",
    "library",
    "module_utils",
    "action_plugins",
    "playbooks",
    "roles",
    "runtimes",
    "tests/e2e",
)
OUTPUT_FILE = re.compile(r"^(?:[\w.-]+/)*([\w.-]+\.(?:csv|json|jsonl|png))$")
COLUMN = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*_(?:ns|bytes|pct|j|w|ms|js|bps|khz|mhz|mb)$")
PYNAME = re.compile(r"^(?:dit|headsplit)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
# a weights file named like a field (``model.safetensors``, ``model.gguf``) is a file name, not a field
WEIGHT_FILE = re.compile(r"\.(?:safetensors|gguf|bin)$")
FIELD = re.compile(r"^[a-z_]+(?:\.(?:[A-Za-z0-9_-]+|<[^>]+>))+$")


def documents() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "scenario-reference.md")  # generated
    return [REPO / "README.md", *docs]


def spans(text: str) -> Iterator[str]:
    """Inline code spans outside fenced blocks, and the ``dit …`` lines inside them."""
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        for raw in block.splitlines():
            line = raw.split("  #")[0].strip()
            if line.startswith("dit "):
                yield line
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    yield from (s.strip() for s in re.findall(r"`([^`\n]+)`", prose))


# --------------------------------------------------------------------------- the checks


GENERATED_DIRS = ("tests/e2e/artifacts/",)
"""Written by the tests (and ignored by git): a file there is checked as an output name."""


def check_path(span: str) -> str | None:
    if "<" in span or "{" in span or " " in span:
        return None
    if span.startswith(GENERATED_DIRS):
        return None if span.endswith("/") else check_output_name(span.rsplit("/", 1)[-1])
    if "*" in span:
        return None if any(REPO.glob(span.rstrip("/"))) else f"no file matches {span}"
    path, _, test = span.partition("::")  # a pytest node id: the file, then the test in it
    if not (REPO / path.rstrip("/")).exists():
        return f"no such file or directory: {path}"
    if test and f"def {test.split('::')[-1].split('[')[0]}(" not in (REPO / path).read_text(encoding="utf-8"):
        return f"{path} has no test {test}"
    return None


@functools.cache
def command_tree() -> Any:
    return typer.main.get_command(app)  # a click-like command tree (typer ships its own click)


def _sub(group: Any, name: str) -> Any:
    commands = getattr(group, "commands", None)
    return commands.get(name) if isinstance(commands, dict) else None


def check_command(span: str) -> str | None:
    words = span.split()[1:]
    group: Any = command_tree()
    path = ["dit"]
    for word in words:
        if not isinstance(getattr(group, "commands", None), dict) or word.startswith("-"):
            break
        if "/" in word:  # dit rack up/status/down
            missing = [w for w in word.split("/") if _sub(group, w) is None]
            return f"`{span}`: no command {' '.join(path)} {', '.join(missing)}" if missing else None
        sub = _sub(group, word)
        if sub is None:
            if len(path) == 1:
                return f"`{span}`: no command dit {word}"
            break  # an argument
        group, path = sub, [*path, word]
    options = {o for p in group.params for o in (*p.opts, *p.secondary_opts)}
    for word in words:
        option = word.strip("[]|,").split("=")[0]
        if re.match(r"^--?[A-Za-z][\w-]*$", option) and option not in options:
            return f"`{span}`: {' '.join(path)} has no option {option}"
    return None


@functools.cache
def entry_point_groups() -> frozenset[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = set(project.get("entry-points", {}))
    for extra in REPO.glob("runtimes/*/pyproject.toml"):
        groups |= set(tomllib.loads(extra.read_text())["project"].get("entry-points", {}))
    return frozenset(groups)


def _module_file(name: str) -> Path | None:
    roots = [REPO / "src", *(p / "src" for p in (REPO / "runtimes").iterdir() if (p / "src").is_dir())]
    parts = name.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
    return None


def _defines(tree: ast.AST, name: str) -> ast.AST | None:
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return node
    return None


@functools.cache
def _parsed(module: Path) -> ast.Module:
    """The module's tree, parsed once, with the garbage collector held off while it is built.

    CPython 3.11 keeps the AST builder's recursion depth in interpreter-wide state: a finalizer that
    runs during a collection inside ``ast.parse`` and formats a traceback (which itself calls
    ``ast.parse`` for the carets) corrupts it, and the outer parse fails with "SystemError: AST
    constructor recursion depth mismatch" (CPython gh-106905). CI hit this once.
    """
    text = module.read_text(encoding="utf-8")
    gc.disable()  # no collection can start inside the parse (a gc.collect() first cost 0.1-0.4 s a module)
    try:
        return ast.parse(text)
    finally:
        gc.enable()


def check_pyname(span: str) -> str | None:
    if span in entry_point_groups():
        return None
    parts = span.split(".")
    for split in range(len(parts), 0, -1):
        module = _module_file(".".join(parts[:split]))
        if module is None:
            continue
        node: ast.AST | None = _parsed(module)
        for attr in parts[split:]:
            node = None if node is None else _defines(node, attr)
        return (
            None
            if node is not None
            else f"{span}: {'.'.join(parts[:split])} defines no {'.'.join(parts[split:])}"
        )
    if importlib.util.find_spec(parts[0]) is None:
        return None  # not ours
    return f"{span}: no such module"


def check_field(span: str) -> str | None:
    root = load_schema()
    first, *rest = span.split(".")
    node = deref(root.get("properties", {}).get(first, {}), root)
    if first == "runtime" and rest != ["name"]:
        return None  # the selected runtime's block: documented with the runtime
    for part in rest:
        props = node.get("properties", {})
        if part in props:
            node = deref(props[part], root)
            continue
        patterns = node.get("patternProperties", {})
        extra = node.get("additionalProperties")
        matched = next((s for pattern, s in patterns.items() if re.fullmatch(pattern, part)), None)
        if matched is None and part.startswith("<") and (patterns or isinstance(extra, dict)):
            matched = next(iter(patterns.values()), extra)
        if matched is None and isinstance(extra, dict):
            matched = extra
        if matched is None:
            return f"scenario field {span}: the schema has no {part!r} there"
        node = deref(matched, root)
    return None


@functools.cache
def writer_text() -> str:
    texts = []
    for top in WRITER_DIRS:
        for path in (REPO / top).rglob("*"):
            if path.suffix in (".py", ".j2", ".yml", ".yaml", ".json") and "__pycache__" not in path.parts:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def check_output_name(span: str) -> str | None:
    match = OUTPUT_FILE.match(span)
    name = match.group(1) if match else span
    parts = span.split("/")
    if parts[0] == "raw" and len(parts) == 3 and name.startswith(f"{parts[1]}_"):
        name = name.removeprefix(f"{parts[1]}_")  # raw/<host>/<host>_<file>: the node wrote <file>
    if "<" in name:
        return None
    stem = name.removesuffix(".png")  # screenshots are named without the suffix: shot(page, "07-run-page")
    return (
        None
        if name in writer_text() or f'"{stem}"' in writer_text()
        else f"{span}: no source writes or reads {name}"
    )


def problems_in(text: str) -> list[str]:
    """Every citation of ``text`` that names nothing in the repository."""
    found: list[str] = []
    top_fields = set(load_schema().get("properties", {}))
    for span in spans(text):
        problem: str | None = None
        if re.match(r"^dit [a-z]", span) and "," not in span:
            problem = check_command(span)
        elif span.split("/")[0] in TOP_DIRS and "/" in span:
            problem = check_path(span)
        elif OUTPUT_FILE.match(span) or COLUMN.match(span):
            problem = check_output_name(span)
        elif PYNAME.match(span):
            problem = check_pyname(span)
        elif FIELD.match(span) and span.split(".")[0] in top_fields and not WEIGHT_FILE.search(span):
            problem = check_field(span)
        if problem:
            found.append(problem)
    return found


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.name)
def test_every_citation_names_something_that_exists(doc: Path) -> None:
    assert problems_in(doc.read_text(encoding="utf-8")) == []


def test_the_check_fails_on_a_doc_that_cites_a_missing_name() -> None:
    doc = "\n".join(
        [
            "See `src/dit/nowhere.py`, `roles/*/missing.yml` and `dit.analysis.delay.no_such_function`.",
            "Tested by `tests/unit/test_report.py::test_nothing_of_the_kind`.",
            "Run `dit frobnicate` or `dit optimise RUN --objectiv energy`; set `timing.settle_seconds`.",
            "It writes `aggregate/nothing.csv` with a `phantom_latency_ns` column.",
            "```",
            "dit report RUN --colour red",
            "```",
        ]
    )
    assert problems_in(doc) == [
        "`dit report RUN --colour red`: dit report has no option --colour",
        "no such file or directory: src/dit/nowhere.py",
        "no file matches roles/*/missing.yml",
        "dit.analysis.delay.no_such_function: dit.analysis.delay defines no no_such_function",
        "tests/unit/test_report.py has no test test_nothing_of_the_kind",
        "`dit frobnicate`: no command dit frobnicate",
        "`dit optimise RUN --objectiv energy`: dit optimise has no option --objectiv",
        "scenario field timing.settle_seconds: the schema has no 'settle_seconds' there",
        "aggregate/nothing.csv: no source writes or reads nothing.csv",
        "phantom_latency_ns: no source writes or reads phantom_latency_ns",
    ]


def test_what_exists_passes() -> None:
    doc = (
        "`src/dit/cli.py`, `tests/unit/test_report.py::test_units`, `playbooks/*.yml.j2`, "
        "`dit.analysis.delay.DelayModel.bounds`, `dit.runtimes`, "
        "`dit optimise RUN --objective energy --max-vectors 5`, `hardware.<device>.threads`, "
        "`optimisation.objective`, `aggregate/power_model.csv`, `cum_latency_ns`, `dit rack up/status/down`"
    )
    assert problems_in(doc) == []


def test_citation_cff_follows_the_project_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f'version: "{version}"' in (REPO / "CITATION.cff").read_text()
