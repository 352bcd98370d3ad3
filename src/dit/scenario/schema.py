"""The JSON Schema of a scenario: loading, human error messages, defaults, path lookup."""

from __future__ import annotations

import copy
import difflib
import functools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

from dit.paths import content_root
from dit.runtime_api.registry import block_property, generation, model_rules
from dit.scenario.errors import FieldError
from dit.scenario.pathexpr import Segment, render_path

JSON = Any
SchemaNode = Mapping[str, Any]

_PATTERN_NAMES = {
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$(?!\n)": (
        "is not a valid scenario name (letters, digits, '_', '.' and '-', "
        "starting with a letter or a digit, at most 64 characters)"
    ),
    r"^[A-Za-z][A-Za-z0-9_-]{0,62}$(?!\n)": (
        "is not a valid device name (letters, digits, '_' and '-', starting with a letter, "
        "at most 63 characters)"
    ),
}
_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def schema_path() -> Path:
    """Where the scenario schema lives (source checkout or installed wheel)."""
    return content_root() / "scenarios" / "scenario.schema.json"


@functools.cache
def _schema_text() -> str:
    return schema_path().read_text(encoding="utf-8")


def load_schema() -> dict[str, Any]:
    """A fresh copy of the scenario JSON Schema, with the ``runtime`` block of every installed runtime."""
    schema: dict[str, Any] = json.loads(_schema_text())
    schema["properties"]["runtime"] = block_property()
    # `model` is required only by the runtimes that run it; a plug-in brings its own (docs/runtimes.md)
    schema.setdefault("allOf", []).extend(model_rules())
    return schema


def _validator() -> Draft202012Validator:
    return _validator_of(generation())


@functools.lru_cache(maxsize=1)
def _validator_of(_generation: int) -> Draft202012Validator:
    """The validator of the schema with the runtimes the registry knows in that generation."""
    return Draft202012Validator(load_schema())


def forget() -> None:
    """Drop the cached validator (the installed runtimes changed)."""
    _validator_of.cache_clear()


def root_schema() -> SchemaNode:
    """The (shared, do not mutate) schema the validator uses."""
    schema = _validator().schema
    assert isinstance(schema, Mapping)
    return schema


def device_blocks() -> tuple[str, ...]:
    """The top-level fields keyed by device name (``load``, ``network``: the conditions' per-device blocks)."""
    root = root_schema()
    name = deref({"$ref": "#/$defs/deviceName"}, root).get("pattern")
    return tuple(
        key
        for key, node in dict(root.get("properties", {})).items()
        if name in dict(deref(node, root).get("patternProperties", {}))
    )


def show(value: JSON) -> str:
    """A value in a message: strings quoted, everything else as JSON."""
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def show_bare(value: JSON) -> str:
    return value if isinstance(value, str) else show(value)


def json_kind(value: JSON) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return "null" if value is None else type(value).__name__


def deref(node: SchemaNode, root: SchemaNode | None = None) -> SchemaNode:
    """Follow a local ``$ref``; keywords next to the ``$ref`` win over the target's."""
    root = root if root is not None else root_schema()
    seen = 0
    while "$ref" in node and seen < 32:
        ref = str(node["$ref"])
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref are supported, got {ref}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        seen += 1
    return node


# -- plain JSON values --------------------------------------------------------------------------


def plain(value: Any, path: list[Segment], errors: list[FieldError]) -> JSON:
    """A JSON copy of ``value`` (mappings to dicts, sequences to lists), numbers canonical.

    Integral floats become ints (``5.0`` -> ``5``, so the two hash the same); non-finite numbers,
    non-string keys and non-JSON values are reported in ``errors``.
    """
    if isinstance(value, Mapping):
        out: dict[str, JSON] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(FieldError(render_path(path), f"keys must be strings, got {show(k)}"))
                continue
            out[k] = plain(v, [*path, k], errors)
        return out
    if isinstance(value, list | tuple):
        return [plain(v, [*path, i], errors) for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            errors.append(FieldError(render_path(path), f"{value} is not a finite number"))
            return None
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
        return value
    errors.append(
        FieldError(render_path(path), f"values of type {type(value).__name__} are not allowed here")
    )
    return None


# -- error messages -----------------------------------------------------------------------------


def schema_errors(doc: JSON) -> list[FieldError]:
    """Every schema violation of ``doc``, with dotted paths and human messages."""
    out: list[FieldError] = []
    for error in _validator().iter_errors(doc):
        out.extend(_render(error))
    return out


def _schema_at(path: Iterable[Any]) -> SchemaNode:
    node: Any = root_schema()
    for part in path:
        node = deref(node)[part] if part != "$ref" else deref(node)
    return deref(node) if isinstance(node, Mapping) else {}


def condition_text(if_schema: SchemaNode) -> str:
    """``when kind is uniform`` for ``{"properties": {"kind": {"const": "uniform"}}}``; a condition that
    words itself (``x-condition-text``: the runtimes' rules on ``model``) says so in its own words."""
    own = if_schema.get("x-condition-text")
    if isinstance(own, str) and own:
        return own
    parts = []
    for key, sub in dict(if_schema.get("properties", {})).items():
        if "const" in sub:
            parts.append(f"{key} is {show_bare(sub['const'])}")
        elif "enum" in sub:
            parts.append(f"{key} is " + " or ".join(show_bare(v) for v in sub["enum"]))
    return "when " + " and ".join(parts) if parts else ""


def _condition(error: ValidationError) -> str:
    path = list(error.absolute_schema_path)
    if "then" not in path:
        return ""
    idx = len(path) - 1 - path[::-1].index("then")
    try:
        parent = _schema_at(path[:idx])
    except (KeyError, IndexError, TypeError):
        return ""
    text = condition_text(parent.get("if", {}))
    return f" {text}" if text else ""


def _branch_types(error: ValidationError) -> list[str]:
    types: list[str] = []
    branches: Any = error.validator_value
    for branch in branches:
        node = deref(branch)
        kind = node.get("type")
        if isinstance(kind, str) and _TYPE_NAMES.get(kind, kind) not in types:
            types.append(_TYPE_NAMES.get(kind, kind))
    return types


def _render(error: ValidationError) -> list[FieldError]:
    parts: list[Segment] = list(error.absolute_path)
    where = render_path(parts)
    kind = error.validator
    value: Any = error.validator_value
    inst: Any = error.instance

    if kind in ("anyOf", "oneOf") and error.context:
        groups: dict[int, list[ValidationError]] = {}
        for sub in error.context:
            groups.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
        matching = [
            errs
            for _, errs in sorted(groups.items())
            if not any(e.validator == "type" and not e.relative_path for e in errs)
        ]
        if not matching:
            types = _branch_types(error)
            return [FieldError(where, f"expected {' or '.join(types)}, got {json_kind(inst)} {show(inst)}")]
        # the branch the user meant: values of the right types (only out of bounds), then fewest errors
        best = min(matching, key=lambda errs: (sum(e.validator == "type" for e in errs), len(errs)))
        out: list[FieldError] = []
        for sub in best:
            out.extend(_render(sub))
        return out
    if kind == "required":
        cond = _condition(error)
        missing = [k for k in value if isinstance(inst, dict) and k not in inst]
        # jsonschema reports each missing key in its own error ("'name' is a required property"): this
        # one's key only, or two missing keys read "is required; is required" at each (issue 49, item 6)
        named = [k for k in missing if error.message.startswith(f"{k!r} ")]
        return [FieldError(render_path([*parts, k]), f"is required{cond}") for k in named or missing]
    if kind == "additionalProperties" and isinstance(inst, dict):
        schema: Any = error.schema
        props = list(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        extras = [k for k in inst if k not in props and not any(re.search(p, k) for p in patterns)]
        out = []
        for k in extras:
            if patterns and not props:
                pattern = patterns[0]
                text = _PATTERN_NAMES.get(pattern, f"does not match {pattern}")
                out.append(FieldError(render_path([*parts, k]), f"{k!r} {text}"))
                continue
            close = difflib.get_close_matches(k, props, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (allowed: {', '.join(props)})"
            out.append(FieldError(render_path([*parts, k]), f"unknown field{hint}"))
        return out
    if kind == "enum":
        # a value the field knows but cannot take here says why and what to do (an in-repo runtime that
        # is not installed: dit.runtime_api.registry.block_property)
        hints = error.schema.get("x-enum-hints") if isinstance(error.schema, Mapping) else None
        if isinstance(hints, Mapping) and isinstance(inst, str) and inst in hints:
            return [FieldError(where, str(hints[inst]))]
        return [FieldError(where, f"{show(inst)} is not one of {', '.join(show_bare(v) for v in value)}")]
    if kind == "const":
        return [FieldError(where, f"{show(inst)} must be {show(value)}")]
    if kind == "type":
        wanted = [value] if isinstance(value, str) else list(value)
        names = " or ".join(_TYPE_NAMES.get(w, w) for w in wanted)
        return [FieldError(where, f"expected {names}, got {json_kind(inst)} {show(inst)}")]
    if kind == "minimum":
        return [FieldError(where, f"{show(inst)} is less than {value}")]
    if kind == "exclusiveMinimum":
        return [FieldError(where, f"{show(inst)} must be greater than {value}")]
    if kind == "maximum":
        return [FieldError(where, f"{show(inst)} is greater than {value}")]
    if kind == "exclusiveMaximum":
        return [FieldError(where, f"{show(inst)} must be less than {value}")]
    if kind in ("minItems", "minLength", "minProperties"):
        if value == 1:
            return [FieldError(where, "must not be empty")]
        unit = "characters" if kind == "minLength" else "items"
        return [FieldError(where, f"must have at least {value} {unit}")]
    if kind in ("maxItems", "maxLength", "maxProperties"):
        unit = "characters" if kind == "maxLength" else "items"
        return [FieldError(where, f"must have at most {value} {unit}")]
    if kind == "pattern":
        # a field's own wording ("x-pattern-text", next to its pattern) wins over the shared names
        own = error.schema.get("x-pattern-text") if isinstance(error.schema, Mapping) else None
        text = str(own or _PATTERN_NAMES.get(str(value), f"does not match the pattern {value}"))
        return [FieldError(where, f"{show(inst)} {text}")]
    if kind == "propertyNames":
        return [FieldError(where, error.message)]
    if kind == "uniqueItems" and isinstance(inst, list):
        out = []
        for i, item in enumerate(inst):
            if item in inst[:i]:
                out.append(FieldError(render_path([*parts, i]), f"{show_bare(item)} appears twice"))
        return out
    if kind == "not" and value == {"const": "edge"}:
        return [FieldError(where, "edge is reserved for the edge server and cannot be a device name")]
    return [FieldError(where, error.message)]


def render_error(error: ValidationError) -> list[FieldError]:
    """One jsonschema error of any schema (an action's inputs) as path-precise messages."""
    return _render(error)


# -- defaults -----------------------------------------------------------------------------------


def _object_branch(node: SchemaNode) -> SchemaNode:
    for key in ("anyOf", "oneOf"):
        for branch in node.get(key, []):
            sub = deref(branch)
            if sub.get("type") == "object":
                return sub
    return node


def _is_valid(instance: JSON, schema: SchemaNode) -> bool:
    return bool(Draft202012Validator(dict(schema)).is_valid(instance))


_FREE: SchemaNode = {"x-free": True}


def child_schema(node: SchemaNode, key: Segment) -> SchemaNode | None:
    """The schema of ``node``'s child ``key`` (property, pattern property or list item)."""
    node = deref(node)
    if not node or node.get("x-free"):
        return _FREE  # inside a free-form value (model.params): anything goes
    if isinstance(key, int):
        items = node.get("items")
        if isinstance(items, Mapping):
            return deref(items)
        for k in ("anyOf", "oneOf"):
            for branch in node.get(k, []):
                sub = deref(branch)
                if sub.get("type") == "array" and isinstance(sub.get("items"), Mapping):
                    return deref(sub["items"])
        return None
    node = _object_branch(node)
    props = node.get("properties", {})
    if key in props:
        return deref(props[key])
    for rule in node.get("allOf", []):  # a field of one branch only (a runtime's block field)
        then = rule.get("then")
        if isinstance(then, Mapping) and key in then.get("properties", {}):
            return deref(then["properties"][key])
    for pattern, sub in node.get("patternProperties", {}).items():
        if re.search(pattern, key):
            return deref(sub)
    extra = node.get("additionalProperties", True)
    if isinstance(extra, Mapping):
        return deref(extra)
    if extra is True and node.get("type") == "object" and "properties" not in node:
        return _FREE  # free-form (model.params)
    return None


def apply_defaults(instance: JSON, node: SchemaNode | None = None) -> None:
    """Insert schema defaults into ``instance`` in place, including those of a matching ``if/then``."""
    node = deref(node if node is not None else root_schema())
    if not isinstance(instance, dict):
        return
    node = _object_branch(node)
    layers = [node]
    for rule in node.get("allOf", []):
        if "if" in rule and "then" in rule and _is_valid(instance, rule["if"]):
            layers.append(deref(rule["then"]))
    for layer in layers:
        for key, sub in layer.get("properties", {}).items():
            full = deref(sub)
            if key not in instance and "default" in full:
                instance[key] = copy.deepcopy(full["default"])
    for key, val in instance.items():
        sub_node = child_schema(node, key)
        if sub_node is not None and isinstance(val, dict):
            apply_defaults(val, sub_node)


@functools.lru_cache(maxsize=1)
def _readable_holders(_generation: int) -> frozenset[str]:
    """The scenario's top-level fields with an ``x-readable`` field somewhere below (``$ref`` followed):
    the walk of every variant skips the others (devices' blocks, the model)."""
    root = root_schema()

    def holds(node: Any, seen: frozenset[str]) -> bool:
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref not in seen and holds(deref({"$ref": ref}, root), seen | {ref}):
                return True
            return "x-readable" in node or any(holds(v, seen) for k, v in node.items() if k != "$ref")
        return isinstance(node, list) and any(holds(v, seen) for v in node)

    return frozenset(k for k, v in dict(root.get("properties", {})).items() if holds(v, frozenset()))


def readable_inputs(
    instance: JSON, node: SchemaNode | None = None, path: tuple[Segment, ...] = ()
) -> Iterator[tuple[list[Segment], str, list[str]]]:
    """Every string of ``instance`` whose field names a file on the machine running dit (``x-readable``
    in its schema: what is read below it): its path, its value and that list. A runtime's field is
    looked up in the rule its block matches (its ``name``), as :func:`apply_defaults` does."""
    if node is None and isinstance(instance, dict):  # the top: only the fields that hold one (runtime)
        holders = _readable_holders(generation())
        instance = {k: v for k, v in instance.items() if k in holders}
    node = deref(node if node is not None else root_schema())
    if node.get("x-free"):
        return
    items: list[tuple[Segment, Any, SchemaNode | None]] = []
    if isinstance(instance, dict):
        node = _object_branch(node)
        layers = [node]
        for rule in node.get("allOf", []):
            if "if" in rule and "then" in rule and _is_valid(instance, rule["if"]):
                layers.append(deref(rule["then"]))
        for key, value in instance.items():
            own = [
                layer["properties"][key] for layer in reversed(layers) if key in layer.get("properties", {})
            ]
            items.append((key, value, deref(own[0]) if own else child_schema(node, key)))
    elif isinstance(instance, list):
        items = [(i, value, child_schema(node, i)) for i, value in enumerate(instance)]
    for key, value, sub in items:
        if sub is None:
            continue
        reads = sub.get("x-readable")
        if isinstance(value, str) and isinstance(reads, list):
            yield [*path, key], value, [str(r) for r in reads]
        elif isinstance(value, dict | list):
            yield from readable_inputs(value, sub, (*path, key))


def order_keys(instance: JSON, node: SchemaNode | None = None) -> JSON:
    """A copy with mapping keys in schema order (unknown keys keep their order, after)."""
    node = deref(node if node is not None else root_schema())
    if isinstance(instance, list):
        return [
            order_keys(v, child_schema(node, i) or {}) if isinstance(v, dict | list) else v
            for i, v in enumerate(instance)
        ]
    if not isinstance(instance, dict):
        return instance
    props = list(_object_branch(node).get("properties", {}))
    keys = [k for k in props if k in instance] + [k for k in instance if k not in props]
    return {k: order_keys(instance[k], child_schema(node, k) or {}) for k in keys}


def admits(parts: Sequence[Segment]) -> bool:
    """Whether the schema defines a field at ``parts`` (patterned keys included)."""
    node: SchemaNode | None = root_schema()
    for part in parts:
        if node is None:
            return False
        node = child_schema(node, part)
    return node is not None
