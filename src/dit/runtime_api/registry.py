"""The installed runtimes: the built-in ones plus every ``dit.runtimes`` entry point.

The built-ins are listed here as well as in pyproject's entry points, so that a source tree on
``PYTHONPATH`` (whose entry points the installed metadata does not know) still has them. An entry
point names a class (instantiated without arguments) or an instance; its name must be the runtime's.
A plug-in that fails to load is left out and reported by :func:`problems` (``dit runtimes`` shows
it) instead of breaking every scenario.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata
import shutil
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from dit.paths import content_root
from dit.runtime_api.interface import Runtime, uses_testbed_model

GROUP = "dit.runtimes"
DEFAULT: Final = "layers"  # the runtime of a scenario without a runtime block
BUILTIN: Mapping[str, str] = {"layers": "dit.runtimes.layers:LayersRuntime"}


class UnknownRuntime(ValueError):
    """A runtime name that is not installed; the message lists the installed ones."""


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _instantiate(obj: Any) -> Runtime:
    runtime = obj() if isinstance(obj, type) else obj
    if not isinstance(runtime, Runtime):
        raise TypeError(
            f"{obj!r} does not implement the runtime interface (dit.runtime_api.interface.Runtime)"
        )
    return runtime


@functools.cache
def _discover() -> tuple[dict[str, Runtime], dict[str, str]]:
    found: dict[str, Runtime] = {}
    problems: dict[str, str] = {}
    targets = [(name, target) for name, target in BUILTIN.items()]
    targets += [(ep.name, ep.value) for ep in importlib.metadata.entry_points(group=GROUP)]
    for name, target in targets:
        if name in found:
            continue  # the built-in table and this tree's own entry point name the same object
        try:
            runtime = _instantiate(_load(target))
        except Exception as exc:  # a broken plug-in must not take the testbed down with it
            problems[name] = f"{target}: {type(exc).__name__}: {exc}"
            continue
        if runtime.name != name:
            problems[name] = f"{target}: the entry point is named {name!r} but the runtime {runtime.name!r}"
            continue
        found[name] = runtime
    return dict(sorted(found.items())), problems


def installed() -> dict[str, Runtime]:
    """Every installed runtime by name (sorted)."""
    return dict(_discover()[0])


def problems() -> dict[str, str]:
    """Entry points that did not load, by name, with the reason."""
    return dict(_discover()[1])


def get(name: str) -> Runtime:
    """The runtime ``name``; :class:`UnknownRuntime` says how to install it, or names the installed ones."""
    runtimes = installed()
    if name not in runtimes:
        hint = install_hint(name)
        if hint is not None:
            raise UnknownRuntime(hint)
        raise UnknownRuntime(f"unknown runtime {name!r}; installed: {', '.join(runtimes) or 'none'}")
    return runtimes[name]


@functools.cache
def shipped() -> dict[str, Path]:
    """The runtimes this source tree ships in ``runtimes/<dir>/`` (by their ``dit.runtimes`` entry
    points in its ``pyproject.toml``), by name. Empty in an installed wheel, which ships none."""
    found: dict[str, Path] = {}
    for project in sorted((content_root() / "runtimes").glob("*/pyproject.toml")):
        try:
            doc: Any = tomllib.loads(project.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue  # a broken sibling must not hide the others
        points = (
            doc.get("project", {}).get("entry-points", {}).get(GROUP, {}) if isinstance(doc, dict) else {}
        )
        for name in points if isinstance(points, dict) else ():
            found.setdefault(str(name), project.parent)
    return found


def _shown(directory: Path) -> str:
    """``directory`` as a user types it here: ``./runtimes/x`` below the working directory."""
    try:
        return "./" + str(directory.relative_to(Path.cwd()))
    except ValueError:
        return str(directory)


def install_hint(name: str) -> str | None:
    """Why runtime ``name`` is not available and the command that makes it so: for a plug-in that is
    installed but does not load, the reason; for one this tree ships, where it is and how to install it.
    None for a name neither installed nor shipped."""
    if name in installed():
        return None
    broken = problems().get(name)
    if broken is not None:
        return f"runtime {name!r} is installed but does not load ({broken}); `dit runtimes` lists the problem"
    directory = shipped().get(name)
    if directory is None:
        return None
    where = _shown(directory)
    text = (
        f"runtime {name!r} is not installed: it ships with dit in {where}/. Install its plug-in into dit's "
        f"environment with `{_pip()} install --no-deps {where}` (`./dev setup` does it for every runtime there)"
    )
    if _declared_for_nodes(name):
        text += f", and its own venv on the nodes with `dit runtimes install {name}`"
    return text + " (docs/runtimes.md)"


def _pip() -> str:
    """``pip`` of the environment dit runs in: its ``bin/pip`` when that is not the ``pip`` on PATH."""
    own = Path(sys.executable).parent / "pip"
    on_path = shutil.which("pip")
    if own.is_file() and (on_path is None or Path(on_path).resolve() != own.resolve()):
        return _shown(own)
    return "pip"


def _declared_for_nodes(name: str) -> bool:
    """Whether the mirror's sources file declares ``name`` (so ``dit runtimes install`` serves it)."""
    from dit.mirror.runtimes import RuntimeSourceError, declared

    try:
        return declared(name) is not None
    except (RuntimeSourceError, OSError):
        return False


_RESETS = [0]  # how many times reset() ran: what others cached of the discovered runtimes is stale after one


def generation() -> int:
    """Changes with every :func:`reset`: the scenario schema keys its validator on it."""
    return _RESETS[0]


def reset() -> None:
    """Forget what was discovered (after installing a plug-in in this process, in tests)."""
    _discover.cache_clear()
    shipped.cache_clear()
    _RESETS[0] += 1


def block_property() -> dict[str, Any]:
    """The scenario's ``runtime`` property: a name among the installed runtimes, then that one's block."""
    runtimes = installed()
    rules: list[dict[str, Any]] = []
    for name, runtime in runtimes.items():
        block = copy.deepcopy(dict(runtime.block_schema()))
        block.setdefault("type", "object")
        block["properties"] = {"name": {"const": name}, **dict(block.get("properties", {}))}
        rules.append({"if": {"properties": {"name": {"const": name}}, "required": ["name"]}, "then": block})
        if name == DEFAULT:  # a block without a name is the default runtime's (the form sends {} untouched)
            rules.append({"if": {"not": {"required": ["name"]}}, "then": block})
    # a name this tree ships but that is not installed (or does not load) is told how to install it,
    # not only that it is not one of the installed (schema._render reads x-enum-hints)
    hints = {name: hint for name in {*shipped(), *problems()} if (hint := install_hint(name)) is not None}
    name_property: dict[str, Any] = {
        "description": "The runtime: one of the installed runtimes (`dit runtimes` lists them).",
        "enum": list(runtimes),
        "default": DEFAULT,
    }
    if hints:
        name_property["x-enum-hints"] = dict(sorted(hints.items()))
    return {
        "title": "Runtime",
        "description": (
            "The inference runtime of the profile stage and its settings (docs/runtimes.md). Without "
            f"this block the built-in `{DEFAULT}` runtime runs. The fields besides `name` are the chosen "
            "runtime's own."
        ),
        "type": "object",
        "properties": {"name": name_property},
        "allOf": rules,
    }


def model_rules() -> list[dict[str, Any]]:
    """The scenario's top-level rules requiring ``model``: one per installed runtime that runs the
    testbed's model (``uses_testbed_model``); a scenario of any other runtime may leave it out. The
    default runtime's rule also holds for a scenario without a runtime block or a block without a name.
    ``x-condition-text`` words the condition for the error message and the scenario reference."""
    rules: list[dict[str, Any]] = []
    for name, runtime in installed().items():
        if not uses_testbed_model(runtime):
            continue
        named: dict[str, Any] = {
            "required": ["runtime"],
            "properties": {"runtime": {"required": ["name"], "properties": {"name": {"const": name}}}},
        }
        if name == DEFAULT:
            nameless = {"properties": {"runtime": {"not": {"required": ["name"]}}}}
            chosen: dict[str, Any] = {"anyOf": [named, nameless]}  # an absent block passes `properties`
        else:
            chosen = named
        text = f"for runtime {name}, which runs the testbed's model: give a model name such as fake"
        rules.append({"if": {**chosen, "x-condition-text": text}, "then": {"required": ["model"]}})
    return rules
