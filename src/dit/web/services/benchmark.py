"""Benchmarking: the profiling-only pipeline of a saved version, with the profiling options changed.

A benchmark is ``dit run`` on a derived version: ``inference.enabled`` and ``optimisation.enabled``
false (preflight, apply, profile, collect, aggregate, teardown). The options it accepts are the scenario
fields the profile stage reads (:data:`PROFILING_FIELDS`): how often each device and the edge server
profile the model, the warm-up, the seed, the edge server's nominal frequency, the monitors that record
the run and its timed start. The dialog is generated from :func:`profiling_schema`, the part of the
scenario schema that holds them, so it shows their titles, bounds, defaults and units.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

PROFILING_FIELDS: Final = (
    "repetitions",
    "warmup",
    "seed",
    "edge_server.profile_capacity",
    "edge_server.nominal_frequency",
    "monitors.enabled",
    "monitors.interval_s",
    "timing.start_lead_s",
    "timing.settle_s",
)
"""The scenario fields a benchmark run's profile stage uses (dotted paths)."""


def profiling_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario schema cut down to :data:`PROFILING_FIELDS` (titles, bounds, defaults kept)."""
    out: dict[str, Any] = {"type": "object", "properties": {}, "$defs": schema.get("$defs", {})}
    for path in PROFILING_FIELDS:
        source: Mapping[str, Any] = schema
        target = out
        parts = path.split(".")
        for part in parts[:-1]:
            source = source["properties"][part]
            target = target["properties"].setdefault(
                part,
                {
                    "type": "object",
                    "title": source.get("title", part),
                    "description": source.get("description", ""),
                    "properties": {},
                },
            )
        target["properties"][parts[-1]] = copy.deepcopy(source["properties"][parts[-1]])
    return out


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        for key, sub in value.items():
            flat.update(_flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def benchmark_document(
    document: Mapping[str, Any], profiling: Any
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The profiling-only document of ``document`` with ``profiling``'s options set.

    ``profiling`` is a (nested) mapping of :data:`PROFILING_FIELDS`; anything else is an error naming
    ``profiling.<path>``. The values are checked by the scenario validator afterwards.
    """
    out: dict[str, Any] = copy.deepcopy(dict(document))
    errors: list[dict[str, str]] = []
    if profiling is None:
        profiling = {}
    if not isinstance(profiling, Mapping):
        return out, [{"path": "profiling", "message": "an object of profiling options"}]
    for path, value in _flatten(profiling).items():
        if not path:
            continue
        if path not in PROFILING_FIELDS:
            errors.append(
                {
                    "path": f"profiling.{path}",
                    "message": "not a profiling option: " + ", ".join(PROFILING_FIELDS),
                }
            )
            continue
        *parents, leaf = path.split(".")
        target = out
        for part in parents:
            block = target.get(part)
            target[part] = dict(block) if isinstance(block, Mapping) else {}
            target = target[part]
        if value is None:
            target.pop(leaf, None)  # back to the default
        else:
            target[leaf] = value
    inference = dict(out.get("inference") or {})
    inference["enabled"] = False
    inference.pop("partition_points", None)
    out["inference"] = inference
    out["optimisation"] = {**dict(out.get("optimisation") or {}), "enabled": False}
    return out, errors
