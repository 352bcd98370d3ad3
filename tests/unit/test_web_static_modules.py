"""NNPM's page is ES modules, one per concern, and app.js only assembles them (issue 50, item 3).

A browser refuses the whole page when an import names a missing file or an export its module does not
define, and only the e2e tests (in Chromium) would see it: these checks read the imports as text.
"""

from __future__ import annotations

import re

from tests.conftest import REPO

STATIC = REPO / "src" / "dit" / "web" / "static"
IMPORT = re.compile(r'import\s*\{([^}]*)\}\s*from\s*"\./([^"]+)"', re.S)
EXPORT = re.compile(r"^export\s+(?:async\s+)?(?:function\*?|class|const|let)\s+([A-Za-z_$][\w$]*)", re.M)
VIEWS = {"editor.js", "dialogs.js", "runs.js", "runpage.js", "runtimes.js"}


def _imports(name: str) -> list[tuple[str, list[str]]]:
    """(module, names) per `import { … } from "./module"` of one static file."""
    text = (STATIC / name).read_text(encoding="utf-8")
    return [
        (module, [n.split(" as ")[0].strip() for n in names.split(",") if n.strip()])
        for names, module in IMPORT.findall(text)
    ]


def test_app_js_only_assembles_the_views() -> None:
    lines = (STATIC / "app.js").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, (
        f"static/app.js has {len(lines)} lines: give a view its own module (at most 150)"
    )
    imported = {module for module, _ in _imports("app.js")}
    assert imported >= VIEWS, f"static/app.js does not import {sorted(VIEWS - imported)}"


def test_every_import_names_a_module_and_an_export_it_defines() -> None:
    problems = []
    for path in sorted(STATIC.glob("*.js")):
        for module, names in _imports(path.name):
            target = STATIC / module
            if not target.is_file():
                problems.append(f"static/{path.name} imports ./{module}, which does not exist")
                continue
            exported = set(EXPORT.findall(target.read_text(encoding="utf-8")))
            problems += [
                f"static/{path.name} imports {n} from ./{module}, which does not export it"
                for n in names
                if n not in exported
            ]
    assert problems == []


def test_every_module_is_reached_from_app_js() -> None:
    """A module no import reaches is never loaded by the page (index.html loads app.js only)."""
    reached, todo = {"app.js"}, ["app.js"]
    while todo:
        for module, _ in _imports(todo.pop()):
            if module not in reached and (STATIC / module).is_file():
                reached.add(module)
                todo.append(module)
    assert sorted(p.name for p in STATIC.glob("*.js")) == sorted(reached)
