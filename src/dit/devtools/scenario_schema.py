"""``scenarios/scenario.schema.json`` assembled from the scenario's own part and every condition's fragment.

The scenario package owns ``src/dit/scenario/base.schema.json`` (name, devices, model, edge server,
inference, optimisation, sweep, timing, the shared ``hardware`` block); a condition that the scenario
sets owns ``src/dit/conditions/<name>/schema.json``, a fragment with the same shape (``properties``,
``$defs``) merged into it: its block (netem's ``network``), or its fields of a shared block (cpufreq's
``hardware.cpu_freq_mhz``). Two parts defining the same field is an error naming both. A block whose
condition has a ``check_block`` hook names it in ``x-check`` (``dit.conditions.netem:check_block``):
the scenario's validation calls it by that name, so the scenario imports no condition.

``python -m dit.devtools.scenario_schema`` writes the assembled file, which stays checked in (it is what
dit loads, what the wheel ships and what NNPM's form and the scenario reference are drawn from);
``--check`` changes nothing and exits 1 when the file is not what the parts assemble to (a test runs it).
Fields already in the checked-in file keep their place in it (the form's and the reference's order);
a new one goes after the fields beside it.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dit.conditions
from dit.conditions import conditions
from dit.paths import content_root
from dit.scenario.schema import schema_path

BASE = Path(__file__).resolve().parents[1] / "scenario" / "base.schema.json"
FRAGMENT = "schema.json"


def fragments() -> list[Path]:
    """Every condition's fragment, in condition order (the order a new field takes)."""
    folder = Path(dit.conditions.__file__).parent
    found = [folder / c.name / FRAGMENT for c in conditions()]
    return [path for path in found if path.is_file()]


def _merge(
    into: dict[str, Any], part: Mapping[str, Any], source: str, owners: dict[str, str], at: str
) -> None:
    """Merge ``part`` into ``into``; ``owners``: which part brought each field merged so far."""
    for key, value in part.items():
        where = f"{at}.{key}" if at else key
        if where not in owners and isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value, source, owners, where)  # a block or field list of the base's
        elif key in into:
            owner = owners.get(where, "src/dit/scenario/base.schema.json")
            raise ValueError(f"{source}: {where} is defined by {owner} already")
        else:
            into[key] = json.loads(json.dumps(value))
            owners[where] = source


def _ordered(value: Any, like: Any) -> Any:
    """``value`` with its mapping keys in the order ``like`` has them (keys ``like`` lacks go last)."""
    if not isinstance(value, dict):
        return value
    known = like if isinstance(like, dict) else {}
    keys = [k for k in known if k in value] + [k for k in value if k not in known]
    return {k: _ordered(value[k], known.get(k)) for k in keys}


def assemble(base: Path = BASE, parts: Sequence[Path] | None = None, like: Any = None) -> dict[str, Any]:
    """The scenario schema: ``base`` with every fragment merged in, keys in the order of ``like``."""
    root = content_root().resolve()
    out: dict[str, Any] = json.loads(base.read_text(encoding="utf-8"))
    owners: dict[str, str] = {}
    known = {c.name for c in conditions()}
    for path in fragments() if parts is None else parts:
        name = str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)
        fragment = json.loads(path.read_text(encoding="utf-8"))
        _merge(out, fragment, name, owners, "")
        module = f"{dit.conditions.__name__}.{path.parent.name}"
        if path.parent.name in known and hasattr(importlib.import_module(module), "check_block"):
            for block in fragment.get("properties", {}):
                out["properties"][block]["x-check"] = f"{module}:check_block"
    return _ordered(out, like) if like is not None else out


def _flat(value: Mapping[str, Any] | list[Any]) -> bool:
    values = value.values() if isinstance(value, Mapping) else value
    return all(not isinstance(v, dict | list) or (isinstance(v, list) and not _nested(v)) for v in values)


def _nested(value: list[Any]) -> bool:
    return any(isinstance(v, dict | list) for v in value)


def render(value: Any, indent: int = 0, key: str | None = None) -> str:
    """JSON as the schema is written by hand: a field's schema on its lines, small leaves on one."""
    compact = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if not isinstance(value, dict | list) or not value or key == "if":
        return compact
    if isinstance(value, list) and not _nested(value):
        return compact
    if isinstance(value, dict) and _flat(value) and "title" not in value and "description" not in value:
        return compact
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        rows = [
            f"{pad}{json.dumps(k, ensure_ascii=False)}: {render(v, indent + 2, k)}" for k, v in value.items()
        ]
        return "{\n" + ",\n".join(rows) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + render(v, indent + 2) for v in value) + "\n" + " " * indent + "]"


def assembled_text(target: Path) -> str:
    like = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else None
    return render(assemble(like=like)) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--check"]):
        sys.stderr.write("usage: python -m dit.devtools.scenario_schema [--check]\n")
        return 0 if args in (["-h"], ["--help"]) else 2
    target = schema_path()
    text = assembled_text(target)
    if args == ["--check"]:
        if target.is_file() and target.read_text(encoding="utf-8") == text:
            return 0
        sys.stderr.write(
            f"{target} is not what src/dit/scenario/base.schema.json and the conditions' {FRAGMENT} "
            "assemble to: run python -m dit.devtools.scenario_schema\n"
        )
        return 1
    target.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
