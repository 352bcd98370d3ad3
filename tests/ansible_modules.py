"""Load dit's Ansible modules (library/*.py) and module utilities (module_utils/*.py) in-process.

Modules import their shared code as Ansible ships it to a node, ``from ansible.module_utils.dit_x
import ...``. Ansible resolves those names from its configured module_utils paths when it packs a
module; here the checkout's ``module_utils/`` joins the search path of the real
``ansible.module_utils`` package, so the modules import unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import ansible.module_utils
import yaml
from ansible.module_utils import basic

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "library"
MODULE_UTILS = REPO / "module_utils"
DOC_FRAGMENTS = REPO / "doc_fragments" / "dit.py"


def _add_module_utils() -> None:
    paths = ansible.module_utils.__path__
    if str(MODULE_UTILS) not in paths:
        paths.append(str(MODULE_UTILS))


def module_util(name: str) -> ModuleType:
    """``module_utils/<name>.py`` as ``ansible.module_utils.<name>`` (the object the modules use)."""
    _add_module_utils()
    return importlib.import_module(f"ansible.module_utils.{name}")


def library_module(name: str, as_name: str | None = None) -> ModuleType:
    """``library/<name>.py`` loaded by file path, its ``ansible.module_utils.dit_*`` imports resolved."""
    _add_module_utils()
    spec = importlib.util.spec_from_file_location(as_name or f"test_{name}", LIBRARY / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_process(module: ModuleType, args: dict[str, Any]) -> dict[str, Any]:
    """``module.main()`` with ``args`` as Ansible passes them, in this process (a second's start-up of
    Ansible saved per call); its JSON result."""
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
    basic._ANSIBLE_PROFILE = "legacy"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            module.main()
    finally:
        basic._ANSIBLE_ARGS = None
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def library_names() -> list[str]:
    """Every module in library/ (a new module is covered without touching a test)."""
    return sorted(p.stem for p in LIBRARY.glob("*.py") if not p.name.startswith("_"))


def doc_fragment(slug: str) -> str:
    """The YAML of dit's doc fragment ``dit`` (DOCUMENTATION) or ``dit.<var>`` (doc_fragments/dit.py)."""
    spec = importlib.util.spec_from_file_location("dit_doc_fragments", DOC_FRAGMENTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    var = "DOCUMENTATION" if slug == "dit" else slug.partition(".")[2].upper()
    text: str = getattr(module.ModuleDocFragment, var)
    return text


def with_dit_fragments(documentation: dict[str, Any]) -> dict[str, Any]:
    """A module's DOCUMENTATION with dit's fragments merged in as ansible-doc merges them (the module's own
    keys win); ansible.builtin's are left named, not merged."""
    from ansible.utils.plugin_docs import merge_fragment

    for slug in documentation.get("extends_documentation_fragment") or []:
        if slug == "dit" or slug.startswith("dit."):
            fragment = yaml.safe_load(doc_fragment(slug))
            for key in ("options", "attributes"):
                if key in fragment:
                    merge_fragment(documentation.setdefault(key, {}), fragment[key])
    return documentation
