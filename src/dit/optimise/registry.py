"""Optimisers by name, through the entry-point group ``dit.optimisers``.

A third-party package registers ``name = "package.module:function"`` under
``[project.entry-points."dit.optimisers"]``; the function is an :data:`dit.optimise.Optimiser`. The
built-in ``greedy``, ``exhaustive`` and ``trend`` are registered the same way by dit's own pyproject and are
also known here directly, so they work from a source tree that was never installed.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Final, cast

from dit.optimise import OptimiseError, Optimiser

GROUP: Final = "dit.optimisers"

BUILTIN: Final[dict[str, str]] = {
    "exhaustive": "dit.optimise.exhaustive:exhaustive",
    "greedy": "dit.optimise.greedy:greedy",
    "trend": "dit.optimise.trend:trend",
}


def available() -> dict[str, str]:
    """``{name: "module:attr"}`` of every registered optimiser, sorted by name.

    A plug-in cannot replace a built-in name; of two plug-ins with one name the first one found wins.
    """
    found = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep.value)
    return dict(sorted(found.items()))


def _load_reference(name: str, ref: str) -> Optimiser:
    module_name, _, attr = ref.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise OptimiseError(f"optimiser {name!r} ({ref}) cannot be loaded: {exc}") from exc
    if not callable(obj):
        raise OptimiseError(f"optimiser {name!r} ({ref}) is not callable")
    return cast(Optimiser, obj)


def load(name: str) -> Optimiser:
    """The optimiser registered as ``name``; :class:`OptimiseError` listing the known names otherwise."""
    refs = available()
    if name not in refs:
        raise OptimiseError(f"unknown optimiser {name!r}; available: {', '.join(refs)}")
    return _load_reference(name, refs[name])


def entry_point(name: str) -> EntryPoint | None:
    """The installed entry point for ``name``, if any (None for a built-in used from a bare source tree)."""
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            return ep
    return None
