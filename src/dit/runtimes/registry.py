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
from collections.abc import Mapping
from typing import Any

from dit.runtimes.base import Runtime
from dit.scenario.spec import DEFAULT_RUNTIME as DEFAULT

GROUP = "dit.runtimes"
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
        raise TypeError(f"{obj!r} does not implement the runtime interface (dit.runtimes.base.Runtime)")
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
    """The runtime ``name``; :class:`UnknownRuntime` names the installed ones."""
    runtimes = installed()
    if name not in runtimes:
        raise UnknownRuntime(f"unknown runtime {name!r}; installed: {', '.join(runtimes) or 'none'}")
    return runtimes[name]


def reset() -> None:
    """Forget what was discovered (after installing a plug-in in this process, in tests)."""
    from dit.scenario import schema

    _discover.cache_clear()
    schema.forget()


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
    return {
        "title": "Runtime",
        "description": (
            "The inference runtime of the profile stage and its settings (docs/runtimes.md). Without "
            f"this block the built-in `{DEFAULT}` runtime runs. The fields besides `name` are the chosen "
            "runtime's own."
        ),
        "type": "object",
        "properties": {
            "name": {
                "description": "The runtime: one of the installed runtimes (`dit runtimes` lists them).",
                "enum": list(runtimes),
                "default": DEFAULT,
            }
        },
        "allOf": rules,
    }
