"""Render the scenario reference (Markdown) from the scenario JSON Schema.

``python -m dit.devtools.schemadoc [OUT.md]`` writes it (``docs/scenario-reference.md`` is generated this
way, and a test keeps it equal to the schema).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.scenario.schema import condition_text, load_schema

SchemaNode = Mapping[str, Any]

_PLACEHOLDERS = {
    r"^[A-Za-z][A-Za-z0-9_-]{0,62}$(?!\n)": "<device>",
}


_RESOLUTION = [
    "## Resolution, sweeps and hashing",
    "",
    "Before a run, a scenario is resolved: every default above is filled in, a model name becomes "
    "`{name: ...}`, `optimisation.policy` defaults to `edge_server.policy` and `model.input.seed` to "
    "`seed`, and `inference.partition_points` becomes explicit vectors (one point per device). A sweep "
    "is applied to the document as written, then each variant is resolved and validated on its own. "
    "The run records the resolved document as `scenario.yaml`; its identity is the SHA-256 of its "
    "canonical JSON (sorted keys, no whitespace, UTF-8, integral numbers written as integers, so `5.0` "
    "and `5` are the same). Key order, YAML style and spelling out a default do not change the hash; "
    "any value that changes the experiment does.",
    "",
]


@dataclass
class _Row:
    path: str
    type: str
    default: str
    description: str
    notes: list[str] = field(default_factory=list)


def _deref(node: SchemaNode, root: SchemaNode) -> SchemaNode:
    while "$ref" in node:
        target: Any = root
        for part in str(node["$ref"])[2:].split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _code(value: Any) -> str:
    text = value if isinstance(value, str) and value else json.dumps(value, ensure_ascii=False)
    return f"`{text}`"


def _type(node: SchemaNode, root: SchemaNode) -> str:
    node = _deref(node, root)
    if "enum" in node:
        return " | ".join(_code(v) for v in node["enum"])
    if "const" in node:
        return _code(node["const"])
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " or ".join(_type(b, root) for b in node[key])
    kind = node.get("type", "any")
    text = str(kind)
    if kind == "array":
        items = node.get("items")
        text = f"list of {_type(items, root)}" if isinstance(items, Mapping) else "list"
        extras = []
        if node.get("minItems") == 1:
            extras.append("non-empty")
        if node.get("uniqueItems"):
            extras.append("unique")
        if extras:
            text += f" ({', '.join(extras)})"
        return text
    if kind == "object":
        return "mapping"
    bounds = []
    if "minimum" in node:
        bounds.append(f"≥ {node['minimum']}")
    if "exclusiveMinimum" in node:
        bounds.append(f"> {node['exclusiveMinimum']}")
    if "maximum" in node:
        bounds.append(f"≤ {node['maximum']}")
    if "exclusiveMaximum" in node:
        bounds.append(f"< {node['exclusiveMaximum']}")
    if bounds:
        text += " " + ", ".join(bounds)
    return text


def _default(node: SchemaNode) -> str:
    if "default" not in node or node["default"] == {}:
        return ""
    return _code(node["default"])


def _object_branches(node: SchemaNode, root: SchemaNode) -> list[SchemaNode]:
    out = []
    for key in ("anyOf", "oneOf"):
        for branch in node.get(key, []):
            sub = _deref(branch, root)
            if sub.get("type") == "object":
                out.append(sub)
            elif sub.get("type") == "array" and isinstance(sub.get("items"), Mapping):
                items = _deref(sub["items"], root)
                if items.get("type") == "object":
                    out.append(items)
    return out


def _rows(node: SchemaNode, root: SchemaNode, path: str, seen: set[str]) -> Iterator[_Row]:
    node = _deref(node, root)
    for branch in [node, *_object_branches(node, root)]:
        required = set(branch.get("required", []))
        conditional: dict[str, list[str]] = {}
        cond_defaults: dict[str, str] = {}
        for rule in branch.get("allOf", []):
            cond = condition_text(rule.get("if", {}))
            then = rule.get("then", {})
            for key in then.get("required", []):
                conditional.setdefault(key, []).append(cond)
            for key, sub in then.get("properties", {}).items():
                # a default that depends on a condition, of a field the object itself declares; a field
                # of one branch only (a runtime's block) has its own row with that branch's default
                if "default" in sub and key in branch.get("properties", {}):
                    cond_defaults[key] = f"{_code(sub['default'])} ({cond})"
        children: list[tuple[str, SchemaNode]] = [(k, v) for k, v in branch.get("properties", {}).items()]
        only: dict[int, str] = {}  # a field of one if/then branch (a runtime's block): the condition
        for rule in branch.get("allOf", []):
            cond = condition_text(rule.get("if", {}))
            if not cond:
                # a condition the reference cannot word (the default runtime's block again, for a block
                # without a name): that block's rows come from its named rule
                continue
            for key, sub in rule.get("then", {}).get("properties", {}).items():
                if key not in branch.get("properties", {}):
                    only[len(children)] = cond
                    children.append((key, sub))
        children += [
            (_PLACEHOLDERS.get(p, "<key>"), v) for p, v in branch.get("patternProperties", {}).items()
        ]
        extra = branch.get("additionalProperties")
        if isinstance(extra, Mapping):
            children.append(("<target>", extra))
        for index, (key, sub) in enumerate(children):
            child_path = f"{path}.{key}" if path else key
            seen_key = f"{child_path} {only[index]}" if index in only else child_path
            if seen_key in seen:
                continue
            seen.add(seen_key)
            full = _deref(sub, root)
            text = str(full.get("description") or (f"{full['title']}." if "title" in full else ""))
            row = _Row(child_path, _type(full, root), _default(full), text)
            if index in only:
                row.notes.append(f"Only {only[index]}.")
            if key in cond_defaults:
                row.default = cond_defaults[key]
            if key in required:
                row.notes.append("Required.")
            if key in conditional:
                row.notes.append(f"Required {' or '.join(conditional[key])}.")
            if isinstance(full.get("pattern"), str) and full.get("type") == "string":
                row.notes.append(f"Pattern: `{full['pattern']}`.")
            if isinstance(full.get("x-readable"), list):
                row.notes.append(
                    "A path on the machine running dit: refused when the scenario's author (the owner of "
                    "the scenario file) could not read it; what a run ships of it is 0600 on the nodes."
                )
            yield row
            yield from _rows(full, root, child_path, seen)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _line(r: _Row) -> str:
    desc = " ".join([r.description, *r.notes]).strip()
    return f"| `{r.path}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(desc)} |"


def render_reference(schema: SchemaNode) -> str:
    """The Markdown reference of every field of ``schema``: one table per top-level field."""
    lines = [
        "# Scenario reference",
        "",
        "<!-- Generated from scenarios/scenario.schema.json and the installed runtimes' blocks by "
        "`python -m dit.devtools.schemadoc docs/scenario-reference.md`; do not edit by hand. -->",
        "",
        str(schema.get("description", "")),
        "",
        "Paths are dotted; `<device>` stands for a device name listed in `devices`, `<target>` for a "
        "destination host or CIDR. An empty default means the field is optional and absent unless given.",
        "",
    ]
    rows = list(_rows(schema, schema, "", set()))
    header = ["| Field | Type | Default | Description |", "|---|---|---|---|"]
    top = [r for r in rows if "." not in r.path]
    lines += ["## Top level", "", *header, *(_line(r) for r in top), ""]
    for head in top:
        group = [r for r in rows if r.path.startswith(head.path + ".")]
        if not group:
            continue
        lines += [f"## `{head.path}`", ""]
        if head.description:
            lines += [head.description, ""]
        lines += [*header, *(_line(r) for r in group), ""]
    lines += _RESOLUTION
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 or (args and args[0].startswith("-")):
        sys.stderr.write("usage: python -m dit.devtools.schemadoc [OUT.md]  (without OUT.md: to stdout)\n")
        return 0 if args[0] in ("-h", "--help") else 2
    text = render_reference(load_schema())
    if args:
        Path(args[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
