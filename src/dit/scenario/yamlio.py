"""Bounded, strict YAML reading (and the matching writer) for scenarios.

* at most :data:`MAX_YAML_BYTES` bytes;
* at most :data:`MAX_YAML_NODES` nodes once every alias is expanded (refuses "billion laughs"),
  no recursive aliases, at most :data:`MAX_YAML_DEPTH` levels of nesting;
* duplicate keys are refused, naming the path;
* the top level must be a mapping;
* YAML 1.2 floats (``1e-5`` is a number, not a string) and timestamps kept as strings, so that
  every value is a JSON value.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from dit.scenario.errors import FieldError, ScenarioError
from dit.scenario.pathexpr import render_path

MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 10_000
MAX_YAML_DEPTH = 64

_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Exponent notation without a dot (1e-5, 2E3), which YAML 1.1 (PyYAML) reads as a string.
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$")


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 exponent floats and timestamps left as strings."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes strings :class:`_Loader` would read as something else."""


for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT, list("-+0123456789"))


def _timestamp_as_str(loader: _Loader, node: yaml.Node) -> str:
    assert isinstance(node, yaml.ScalarNode)
    return str(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_str)


def _fail(message: str, path: str = "") -> ScenarioError:
    return ScenarioError([FieldError(path, message)])


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _check_tree(root: yaml.Node) -> None:
    """Count the expanded size without expanding (memoised per node), find duplicate keys."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node, path: list[str | int], depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _fail(f"recursive alias at {_where(node.start_mark)}", render_path(path))
        if depth > MAX_YAML_DEPTH:
            raise _fail(f"nested more than {MAX_YAML_DEPTH} levels deep", render_path(path))
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, yaml.Node] = {}
            for knode, vnode in node.value:
                child: list[str | int] = [*path, "?"]
                if isinstance(knode, yaml.ScalarNode) and knode.tag != _MERGE_TAG:
                    name = str(knode.value)
                    child = [*path, name]
                    if name in seen:
                        first = seen[name].start_mark.line + 1
                        raise _fail(
                            f"duplicate key {name!r} (lines {first} and {knode.start_mark.line + 1})",
                            render_path(child),
                        )
                    seen[name] = knode
                total += size(knode, child, depth + 1) + size(vnode, child, depth + 1)
                if total > MAX_YAML_NODES:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                total += size(item, [*path, i], depth + 1)
                if total > MAX_YAML_NODES:
                    break
        if total > MAX_YAML_NODES:
            raise _fail(
                f"the document expands to more than {MAX_YAML_NODES} nodes (aliases included); "
                "refusing it (an alias bomb?)"
            )
        active.discard(key)
        sizes[key] = total
        return total

    size(root, [], 0)


def _read_bounded(path: Path) -> tuple[bytes, os.stat_result]:
    try:
        with path.open("rb") as fh:
            return fh.read(MAX_YAML_BYTES + 1), os.fstat(fh.fileno())
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}") from exc


def load_yaml(source: str | bytes | os.PathLike[str]) -> dict[str, Any]:
    """Parse a scenario document.

    ``source`` is a path (any :class:`os.PathLike`, e.g. :class:`pathlib.Path`) to read, or the YAML
    text itself (``str`` or ``bytes``). Raises :class:`ScenarioError`.
    """
    if isinstance(source, os.PathLike):
        return load_yaml_file(Path(source))[0]
    data = source if isinstance(source, bytes) else source.encode("utf-8", errors="surrogatepass")
    return _parse(data, f"{len(data)} bytes")


def load_yaml_file(path: Path) -> tuple[dict[str, Any], os.stat_result]:
    """:func:`load_yaml` of a file, with the status of the file it read: taken from the same open, so
    the owner is the owner of what was read, whatever ``path`` names by then."""
    data, status = _read_bounded(path)
    return _parse(data, "more than 1 MiB"), status


def _parse(data: bytes, size: str) -> dict[str, Any]:
    """The document in ``data``; ``size``: how a message names its size when it is too big."""
    if len(data) > MAX_YAML_BYTES:
        raise _fail(f"the scenario is {size}; the limit is {MAX_YAML_BYTES} bytes (1 MiB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"the scenario is not UTF-8 (byte {exc.start})") from exc
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise _fail("the scenario is empty")
        _check_tree(node)
        doc = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = ", ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        where = f"{_where(mark)}: " if mark is not None else ""
        raise _fail(f"YAML: {where}{problem}") from exc
    except yaml.YAMLError as exc:
        raise _fail(f"YAML: {exc}") from exc
    except RecursionError as exc:
        raise _fail(f"nested more than {MAX_YAML_DEPTH} levels deep") from exc
    finally:
        loader.dispose()
    if not isinstance(doc, dict):
        hint = ""
        if isinstance(doc, str) and "\n" not in text.strip() and text.strip().endswith((".yaml", ".yml")):
            hint = " (to read a file, pass a pathlib.Path)"
        raise _fail(f"the top level must be a mapping, got {_kind(doc)}{hint}")
    return doc


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def dump_yaml(data: Any, header: str = "") -> str:
    """YAML text that :func:`load_yaml` reads back to ``data`` (plain dicts, lists, scalars)."""
    body = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=None,
        width=100,
    )
    return header + body
