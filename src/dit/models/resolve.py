"""Turn a scenario's model into the spec a node can build (``builder`` = ``module:function``)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from dit.models.catalogue import BUILTIN


class ModelError(Exception):
    """The model cannot be built where the run needs it."""


@dataclass(frozen=True)
class ResolvedModel:
    spec: dict[str, Any]
    stand_in_for: str | None  # the real model the fake one stands in for, if substituted


def resolve_model(
    name: str,
    params: dict[str, Any],
    input_spec: dict[str, Any],
    seed: int,
    local: bool,
    allow_stand_in: bool,
) -> ResolvedModel:
    """Resolve ``name`` through the catalogue and the ``dit.models`` entry points.

    In local mode a model whose framework is not installed here is replaced by the fake model
    with the same stage count and cut sizes (its catalogue ``stand_in`` profile) when
    ``allow_stand_in`` is true; the substitution is recorded in the run metadata. On real hosts
    the framework must be on the boards, which preflight checks, so nothing is substituted.
    """
    registered = {ep.name: ep.value for ep in entry_points(group="dit.models")}
    entry = BUILTIN.get(name)
    builder = registered.get(name) or (entry.builder if entry else None)
    if builder is None:
        known = ", ".join(sorted(set(registered) | set(BUILTIN)))
        raise ModelError(f"model: unknown model {name!r} (known: {known})")
    spec: dict[str, Any] = {
        "name": name,
        "builder": builder,
        "params": params,
        "input": input_spec,
        "seed": seed,
    }
    framework = entry.framework if entry else "none"
    if not local or framework == "none" or importlib.util.find_spec(framework) is not None:
        return ResolvedModel(spec, None)
    if allow_stand_in and entry is not None and entry.stand_in:
        fake = {
            "name": "fake",
            "builder": BUILTIN["fake"].builder,
            "params": {"profile": entry.stand_in},
            "input": input_spec,
            "seed": seed,
        }
        return ResolvedModel(fake, name)
    raise ModelError(
        f"model: {name} needs {framework}, which is not installed here "
        f"(pip install 'dit[{'keras' if framework == 'tensorflow' else 'llm'}]')"
    )
