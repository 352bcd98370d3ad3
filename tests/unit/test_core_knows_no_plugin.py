"""The core (``src/dit``) imports no runtime plug-in, and every default of a plug-in is defined once (issue 50).

A plug-in reaches the core only through its ``dit.runtimes`` entry point (docs/runtimes.md): what the
simulator and ``dit reproduce`` need of it (its placement model, its chapters' variants and sections) it
gives through the runtime interface, so the core runs with the plug-in absent and says so.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from dit.reproduce import chapters
from dit.reproduce.chapters import ABSENT_RUNTIMES, plan
from dit.reproduce.report import runtime_sections
from dit.runtime_api import registry
from dit.runtime_api.chapters import ChapterRuns

ROOT = Path(__file__).resolve().parents[2]
IMPORTERS = {"import_module", "__import__", "find_spec"}


def plugin_packages(root: Path) -> set[str]:
    """The top-level packages the tree's plug-ins ship (``runtimes/<dir>/src/<package>``)."""
    return {p.parent.name for p in root.glob("runtimes/*/src/*/__init__.py")}


def plugin_imports(root: Path) -> list[str]:
    """Every place under ``src/dit`` that imports a plug-in's package (an import statement, or a string
    handed to importlib / ``__import__``) or changes the import path, as ``path:line: what``."""
    plugins = plugin_packages(root)
    found: list[str] = []
    for path in sorted((root / "src" / "dit").rglob("*.py")):
        where = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in IMPORTERS and node.args and isinstance(node.args[0], ast.Constant):
                    names = [str(node.args[0].value)]
            if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys":
                found.append(f"{where}:{node.lineno}: sys.path (the import path)")
            found += [f"{where}:{node.lineno}: {n}" for n in names if n.partition(".")[0] in plugins]
    return found


def test_no_module_of_the_core_imports_a_plugin() -> None:
    assert plugin_packages(ROOT) >= {"headsplit", "dit_llamacpp"}
    assert plugin_imports(ROOT) == []


def tau_defaults(root: Path) -> list[str]:
    """Every number 0.05 in a line (or within the six before it) that speaks of tau, in the core and
    HeadSplit's package: a default of speculation's tolerance written out."""
    found: list[str] = []
    sources = [*(root / "src" / "dit").rglob("*.py"), *(root / "runtimes").glob("*/src/**/*.py")]
    for path in sorted(sources):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type != tokenize.NUMBER or token.string not in ("0.05", ".05", "5e-2"):
                continue
            row = token.start[0]
            context = "\n".join(lines[max(row - 7, 0) : row]).lower()
            if "tau" in context or "τ" in context:
                found.append(f"{path.relative_to(root)}:{row}")
    return found


def test_speculation_s_default_tolerance_is_written_once() -> None:
    (where,) = tau_defaults(ROOT)
    assert where.startswith("runtimes/headsplit/src/headsplit/config.py:")  # DEFAULT_TAU


def test_a_runtime_ch6_sets_beside_headsplit_says_it_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the llamacpp-rpc plug-in, Chapter 6 runs HeadSplit's variants alone and its llama.cpp row
    says how to install it."""
    pytest.importorskip("torch")
    installed = registry.installed()
    if "headsplit" not in installed:
        pytest.skip("the headsplit plug-in is not installed")
    without = {name: r for name, r in installed.items() if name != "llamacpp-rpc"}
    monkeypatch.setattr(registry, "installed", lambda: dict(without))
    absent = ABSENT_RUNTIMES["ch6"]["llamacpp-rpc"]
    chosen = plan("ch6", "quick")
    assert chosen.not_run == (absent.why,)
    assert chosen.variants and not [v for v in chosen.variants if v.name == "ch6_llamacpp"]
    # the plug-ins' plans are not consulted for a runtime the registry does not list
    assert chapters.CHAPTER_RUNTIMES["ch6"] == ("headsplit",)
    from headsplit.plugin import chapter6

    monkeypatch.setattr(chapter6, "simulated_memory", lambda doc: "not simulated by this test")
    found = runtime_sections(ChapterRuns("ch6", {}, (), "here", None, chosen.not_run))
    titles = [s.title for s in found.sections]
    assert titles.index(absent.title) == 3  # where llama.cpp's own section sits: after HeadSplit's token
    (row,) = found.sections[3].tables[0]["rows"]
    assert row[:2] == [absent.label, absent.why]
