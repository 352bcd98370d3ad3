"""Validation (schema + semantics), defaults, sweep expansion."""

from __future__ import annotations

import copy
import difflib
import importlib
import importlib.metadata
import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from dit.runtime_api import registry
from dit.runtime_api.interface import check_block_of
from dit.scenario import schema as sch
from dit.scenario.author import Author, problem
from dit.scenario.errors import BlockCheck, FieldError, ScenarioError, sorted_unique
from dit.scenario.pathexpr import Segment, parse_path, render_path
from dit.scenario.spec import DEFAULT_RUNTIME, Scenario, build, partition_vector
from dit.scenario.yamlio import load_yaml, load_yaml_file

#: The largest number of variants one scenario may expand to.
MAX_VARIANTS = 1000

_DEVICE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}\Z")


def _entry_point_names(group: str) -> list[str]:
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})


def stage_count(model: Mapping[str, Any]) -> int | None:
    """N of the model (``{name, params}``), or None when it cannot be known before building it."""
    # imported here: the catalogue reads its JSON file at import time, which validating a scenario
    # of a model outside the catalogue does not need
    from dit.models.catalogue import stage_count as catalogue_stage_count

    name = model.get("name")
    params = model.get("params", {})
    if not isinstance(name, str) or not isinstance(params, Mapping):
        return None
    try:
        return catalogue_stage_count(name, params)
    except (ImportError, KeyError, TypeError, ValueError):
        return None


def _known_model(name: str) -> bool:
    return name in _entry_point_names("dit.models")


# -- resolution ---------------------------------------------------------------------------------


def resolve(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults applied, model as an object, derived defaults, partition points as vectors.

    Defensive: works (best effort) on documents that are not schema-valid.
    """
    d: dict[str, Any] = copy.deepcopy(dict(doc))
    d.pop("sweep", None)
    if isinstance(d.get("model"), str):
        d["model"] = {"name": d["model"]}
    sch.apply_defaults(d)
    edge = d.get("edge_server")
    opt = d.get("optimisation")
    if isinstance(opt, dict) and "policy" not in opt and isinstance(edge, dict) and "policy" in edge:
        opt["policy"] = edge["policy"]
    runtime = d.get("runtime")
    written = doc.get("optimisation")
    if (
        isinstance(runtime, dict)
        and runtime.get("name", DEFAULT_RUNTIME) != DEFAULT_RUNTIME
        and isinstance(opt, dict)
        and not (isinstance(written, Mapping) and "enabled" in written)
    ):
        opt["enabled"] = False  # nothing to optimise: only the layers runtime profiles partitions
    model = d.get("model")
    if isinstance(model, dict):
        inp = model.get("input")
        if isinstance(inp, dict) and "seed" not in inp and isinstance(d.get("seed"), int):
            inp["seed"] = d["seed"]
    devices = d.get("devices")
    inference = d.get("inference")
    if isinstance(inference, dict) and isinstance(devices, list) and isinstance(model, dict):
        n = len(devices)
        points = inference.get("partition_points")
        if points is None:
            count = stage_count(model)
            if count is not None:
                inference["partition_points"] = [[p] * n for p in range(count + 1)]
        elif isinstance(points, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in points):
            inference["partition_points"] = [partition_vector(p, n) for p in points]
    errors: list[FieldError] = []
    out: dict[str, Any] = sch.order_keys(sch.plain(d, [], errors))
    return out


# -- semantic checks ----------------------------------------------------------------------------


def _block_checks() -> dict[str, BlockCheck]:
    """``{block: check}``: the check that each block's schema names (``x-check``, its condition's own)."""
    # by name, as a runtime's check is found through the registry: the conditions stand above the
    # scenario (a builder takes a Scenario), so the scenario imports none of them
    checks: dict[str, BlockCheck] = {}
    for block, node in dict(sch.root_schema().get("properties", {})).items():
        name = node.get("x-check") if isinstance(node, Mapping) else None
        if isinstance(name, str):
            module, _, function = name.partition(":")
            checks[block] = cast(BlockCheck, getattr(importlib.import_module(module), function))
    return checks


def semantic_errors(raw: Mapping[str, Any], d: Mapping[str, Any]) -> list[FieldError]:
    """Checks the schema cannot express; ``raw`` as written (no sweep), ``d`` = ``resolve(raw)``."""
    errors: list[FieldError] = []

    def err(parts: list[Segment], message: str) -> None:
        errors.append(FieldError(render_path(parts), message))

    devices_raw = d.get("devices")
    devices = [x for x in devices_raw if isinstance(x, str)] if isinstance(devices_raw, list) else []

    checks = _block_checks()
    for block in sch.device_blocks():
        entries = d.get(block)
        if not isinstance(entries, dict):
            continue
        for dev, conf in entries.items():
            if dev == "edge":
                err([block, dev], "edge is the edge server, not a device; its settings live in edge_server")
            elif dev not in devices and _DEVICE_NAME.match(dev):
                err([block, dev], f"{dev} is not in devices")
            check = checks.get(block)
            if isinstance(conf, dict) and check is not None:
                check(block, dev, conf, err)

    model = d.get("model")
    model_path: list[Segment] = ["model"] if isinstance(raw.get("model"), str) else ["model", "name"]
    count: int | None = None
    unknown = False
    if isinstance(model, dict) and isinstance(model.get("name"), str):
        count = stage_count(model)
        if count is None and not _known_model(model["name"]):
            # the catalogue knows every built-in name (its stage count is None only for names it
            # does not know); anything else must be a registered adapter
            err(model_path, f"unknown model {model['name']!r}")
            unknown = True

    inference = d.get("inference")
    if isinstance(inference, dict):
        points = inference.get("partition_points")
        if points is None and inference.get("enabled") is True and isinstance(model, dict) and not unknown:
            err(
                ["inference", "partition_points"],
                f"is required: the stage count of model {model.get('name')!r} is not known "
                "before it is built",
            )
        raw_inf = raw.get("inference")
        raw_points = raw_inf.get("partition_points") if isinstance(raw_inf, dict) else None
        if isinstance(raw_points, list):
            name = model.get("name") if isinstance(model, dict) else None
            for i, item in enumerate(raw_points):
                if isinstance(item, list):
                    if devices and len(item) != len(devices):
                        err(
                            ["inference", "partition_points", i],
                            f"has {_n(len(item), 'point')} but {_there(len(devices), 'device')}",
                        )
                    for j, p in enumerate(item):
                        _check_point(["inference", "partition_points", i, j], p, count, name, err)
                else:
                    _check_point(["inference", "partition_points", i], item, count, name, err)

    opt = d.get("optimisation")
    if isinstance(opt, dict) and opt.get("enabled") is True and isinstance(opt.get("algorithm"), str):
        known = _entry_point_names("dit.optimisers")
        if known and opt["algorithm"] not in known:
            err(
                ["optimisation", "algorithm"],
                f"unknown optimiser {opt['algorithm']!r} "
                f"(registered under dit.optimisers: {', '.join(known)})",
            )
    runtime = d.get("runtime")
    runtime_name = runtime.get("name", DEFAULT_RUNTIME) if isinstance(runtime, dict) else DEFAULT_RUNTIME
    if isinstance(opt, dict) and opt.get("enabled") is True and runtime_name != DEFAULT_RUNTIME:
        # the optimisers search partition vectors over the layer profile only this runtime measures
        err(
            ["optimisation", "enabled"],
            f"partition optimisation needs the {DEFAULT_RUNTIME} runtime, not {runtime_name!r}",
        )
    tokens = runtime.get("tokens") if isinstance(runtime, dict) else None
    model_name = model.get("name") if isinstance(model, dict) else None
    if (
        runtime_name == DEFAULT_RUNTIME
        and isinstance(tokens, int)
        and tokens > 0
        and model_name not in DECODERS
    ):
        err(
            ["runtime", "tokens"],
            f"token generation needs a decoder model ({', '.join(DECODERS)}), not {model_name!r}",
        )
    return errors


#: The models that generate tokens (``runtime.tokens`` of the built-in runtime).
DECODERS = ("gpt2", "tinyllama", "hf_decoder", "smollm2-135m")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _there(count: int, noun: str) -> str:
    return f"there is 1 {noun}" if count == 1 else f"there are {count} {noun}s"


def _check_point(parts: list[Segment], p: Any, count: int | None, name: Any, err: Any) -> None:
    if isinstance(p, int) and not isinstance(p, bool) and count is not None and p > count:
        err(parts, f"{p} is beyond the {count} stages of model {name} (partition points are 0..{count})")


# -- sweeps -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Axis:
    where: list[Segment]  # where the axis is written: ["sweep"] or ["sweep", i]
    path: str  # canonical rendering
    parts: list[Segment]
    values: list[Any]


def _axes(raw: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[list[_Axis], list[FieldError]]:
    sweep = raw.get("sweep")
    if sweep is None:
        return [], []
    items: list[tuple[list[Segment], Any]]
    if isinstance(sweep, dict):
        items = [(["sweep"], sweep)]
    else:
        items = [(["sweep", i], s) for i, s in enumerate(sweep)] if isinstance(sweep, list) else []
    axes: list[_Axis] = []
    errors: list[FieldError] = []
    for where, item in items:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            continue
        loc = render_path([*where, "path"])
        text = item["path"]
        parts: list[Segment] | None = parse_path(text)
        if parts is None:
            errors.append(FieldError(loc, f"{text} is not a valid path (dotted keys, [i] for list items)"))
            continue
        if parts[0] == "sweep":
            errors.append(FieldError(loc, "the sweep cannot sweep itself"))
            continue
        if not (_exists(base, parts) or sch.admits(parts)):
            close = difflib.get_close_matches(text, list(_all_paths(base)), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            errors.append(FieldError(loc, f"{text} does not exist{hint}"))
            continue
        canon = render_path(parts)
        for other in axes:
            if other.parts == parts[: len(other.parts)] or parts == other.parts[: len(parts)]:
                errors.append(
                    FieldError(loc, f"{canon} overlaps {render_path([*other.where, 'path'])} ({other.path})")
                )
        values = item.get("values")
        axes.append(_Axis(where, canon, parts, list(values) if isinstance(values, list) else []))
    if not errors:
        total = 1
        for axis in axes:
            total *= len(axis.values)
        if total > MAX_VARIANTS:
            errors.append(FieldError("sweep", f"expands to {total} variants; the limit is {MAX_VARIANTS}"))
    return axes, errors


def _exists(doc: Any, parts: list[Segment]) -> bool:
    node = doc
    for part in parts:
        in_list = isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node)
        in_dict = isinstance(part, str) and isinstance(node, dict) and part in node
        if not (in_list or in_dict):
            return False
        node = node[part]
    return True


def _all_paths(doc: Any, prefix: tuple[Segment, ...] = ()) -> list[str]:
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append(render_path([*prefix, k]))
            out.extend(_all_paths(v, (*prefix, k)))
    return out


def _assign(doc: dict[str, Any], parts: list[Segment], value: Any) -> str | None:
    """Set ``doc`` at ``parts``, creating missing mappings; an error message when impossible."""
    node: Any = doc
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or not 0 <= part < len(node):
                return f"{render_path(parts[: i + 1])} does not exist"
            node = node[part]
            continue
        if not isinstance(node, dict):
            return f"{render_path(parts[:i])} is not a mapping"
        if part == "model" and i == 0 and isinstance(node.get("model"), str):
            node["model"] = {"name": node["model"]}
        if part not in node:
            if isinstance(nxt, int):
                return f"{render_path(parts[: i + 1])} does not exist"
            node[part] = {}
        node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or not 0 <= last < len(node):
            return f"{render_path(parts)} does not exist"
        node[last] = copy.deepcopy(value)
    elif isinstance(node, dict):
        node[last] = copy.deepcopy(value)
    else:
        return f"{render_path(parts[:-1])} is not a mapping"
    return None


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((prefix + ".", prefix + "["))


# -- the pipeline -------------------------------------------------------------------------------


def _plain_doc(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    errors: list[FieldError] = []
    if not isinstance(raw, Mapping):
        return {}, [FieldError("", f"the top level must be a mapping, got {sch.json_kind(raw)}")]
    doc: dict[str, Any] = sch.plain(raw, [], errors)
    return doc, errors


def _check_one(doc: dict[str, Any], author: Author) -> tuple[list[FieldError], dict[str, Any]]:
    """Schema + semantic errors of one document (its sweep ignored) and its resolution."""
    errors = sch.schema_errors(doc)
    schema_ok = not errors
    base = {k: v for k, v in doc.items() if k != "sweep"}
    resolved = resolve(base)
    errors += semantic_errors(base, resolved)
    if schema_ok:  # a runtime's own check may rely on its block being what its schema says
        unreadable = unreadable_errors(resolved, author)
        errors += unreadable
        if not unreadable:  # the runtime's check reads those files as dit's user, and may quote them
            errors += runtime_errors(resolved)
    return errors, resolved


def unreadable_errors(d: Mapping[str, Any], author: Author) -> list[FieldError]:
    """The path inputs of ``d`` (``x-readable`` fields) that name a file ``author`` could not read:
    dit reads them as root and a run copies what it read (docs/runtimes.md, "Files a scenario names")."""
    errors: list[FieldError] = []
    for parts, value, reads in sch.readable_inputs(d):
        found = problem(value, reads, author)
        if found is not None:
            errors.append(FieldError(render_path(parts), found))
    return errors


def runtime_errors(d: Mapping[str, Any]) -> list[FieldError]:
    """The installed runtime's own check of its block against the resolved scenario ``d``."""
    block = d.get("runtime")
    block = block if isinstance(block, dict) else {"name": DEFAULT_RUNTIME}
    name = str(block.get("name", DEFAULT_RUNTIME))
    runtime = registry.installed().get(name)
    if runtime is None:
        return []  # the schema refused the name already
    try:
        problems = check_block_of(runtime, block, d)
    except Exception as exc:  # a plug-in's bug must read as a refusal naming it, not a traceback
        return [
            FieldError("runtime", f"runtime {name!r} failed to check its block: {type(exc).__name__}: {exc}")
        ]
    return [FieldError(render_path(["runtime", *p.path]), p.message) for p in problems]


def _analyse(
    raw: Mapping[str, Any], author: Author
) -> tuple[list[FieldError], list[tuple[tuple[tuple[str, Any], ...], dict[str, Any]]]]:
    doc, errors = _plain_doc(raw)
    if errors:
        return sorted_unique(errors), []
    errors, resolved = _check_one(doc, author)
    axes, axis_errors = _axes(doc, resolved)
    errors += axis_errors
    if errors:
        return sorted_unique(errors), []
    base = {k: v for k, v in doc.items() if k != "sweep"}
    if not axes:
        return [], [((), resolved)]
    variants: list[tuple[tuple[tuple[str, Any], ...], dict[str, Any]]] = []
    unowned: set[tuple[str, str]] = set()
    for combo in itertools.product(*(list(enumerate(axis.values)) for axis in axes)):
        variant = copy.deepcopy(base)
        point = tuple((axis.path, value) for axis, (_, value) in zip(axes, combo, strict=True))
        label = ", ".join(f"{p}={sch.show_bare(v)}" for p, v in point)
        variant_errors: list[FieldError] = []
        for axis, (_, value) in zip(axes, combo, strict=True):
            problem = _assign(variant, axis.parts, value)
            if problem is not None:
                variant_errors.append(FieldError(render_path([*axis.where, "path"]), problem))
        if not variant_errors:
            found, resolved_variant = _check_one(variant, author)
            for e in found:
                owner = next(
                    (
                        (axis, j)
                        for axis, (j, _) in zip(axes, combo, strict=True)
                        if _under(e.path, axis.path)
                    ),
                    None,
                )
                creator = next((axis for axis in axes if _under(axis.path, e.path)), None)
                if owner is None and creator is not None:
                    # the sweep created the offending field (load.device9.mode): whatever the value
                    loc = render_path([*creator.where, "path"])
                    variant_errors.append(FieldError(loc, f"{creator.path}: {e.path}: {e.message}"))
                    continue
                if owner is None:
                    if (e.path, e.message) not in unowned:
                        unowned.add((e.path, e.message))
                        variant_errors.append(FieldError(e.path, f"{e.message} (with {label})"))
                    continue
                axis, j = owner
                value = axis.values[j]
                inner = e.message if e.path == axis.path else f"{e.path}: {e.message}"
                variant_errors.append(
                    FieldError(
                        render_path([*axis.where, "values", j]), f"{axis.path}={sch.show(value)}: {inner}"
                    )
                )
        if variant_errors:
            errors += variant_errors
        else:
            variants.append((point, resolved_variant))
    if errors:
        return sorted_unique(errors), []
    return [], variants


def validate(raw: Mapping[str, Any], author: Author | None = None) -> list[FieldError]:
    """Every problem of a scenario document (schema, semantics, each sweep variant), sorted by path.
    ``author``: whose read permission its path inputs are held to (by default the user running dit)."""
    errors, _ = _analyse(raw, author or Author.current())
    return errors


def expand(raw: Mapping[str, Any], author: Author | None = None) -> list[Scenario]:
    """The scenarios of a document: one, or one per sweep point. Raises :class:`ScenarioError`.
    ``author`` as for :func:`validate`."""
    errors, variants = _analyse(raw, author or Author.current())
    if errors:
        raise ScenarioError(errors)
    return [build(resolved, point) for point, resolved in variants]


def loads(text: str | bytes) -> list[Scenario]:
    """:func:`expand` of YAML text."""
    return expand(load_yaml(text))


def load(path: str | os.PathLike[str]) -> list[Scenario]:
    """:func:`expand` of a YAML file; its path inputs are held to what the file's author could read."""
    doc, status = load_yaml_file(Path(path))
    return expand(doc, Author.of_stat(status))
