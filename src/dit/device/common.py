"""Small helpers shared by the device commands (stdlib only)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.device.adapter import StageModel, load_builder

#: Builder used when a spec names the fake model without a ``builder`` reference.
FAKE_BUILDER = "dit.device.fakemodel:build"


class ConfigError(ValueError):
    """A device config that is missing a field or has a value of the wrong kind."""


@dataclass(frozen=True)
class Origin:
    """The origin pair captured at the start signal; traces align by arithmetic on it."""

    wall_ns: int
    mono_ns: int

    @classmethod
    def now(cls) -> Origin:
        return cls(wall_ns=time.time_ns(), mono_ns=time.monotonic_ns())


def read_config(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: config must be a JSON object")
    return data


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a temporary file in the same directory, fsync, rename), 0600: only root
    reads a node's records, and some name what others must not learn (``edge.ready``: the port)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def require(cfg: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """``cfg[key]`` checked against ``kind``; errors name the config path."""
    path = f"{where}.{key}" if where else key
    if key not in cfg:
        raise ConfigError(f"{path}: is required")
    value = cfg[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise ConfigError(f"{path}: {value!r} is not of type {names}")
    return value


def build_model(spec: Mapping[str, Any]) -> StageModel:
    """Build the model a spec names (``builder`` = ``module:function``; the fake model by default).

    The one builder of a stage model from its spec, for the device commands and the controller alike
    (the models' regeneration, the benchmarks); a bad spec raises :class:`ConfigError` naming the key.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(f"model: {spec!r} is not a mapping")
    ref = spec.get("builder")
    if ref is None:
        if spec.get("name", "fake") != "fake":
            raise ConfigError(f"model.builder: is required for model {spec.get('name')!r}")
        ref = FAKE_BUILDER
    return load_builder(str(ref))(spec)


def read_start_file(path: Path) -> int | None:
    """The start instant in a start-at file (``{"start_at_ns": int}``), None while it does not exist.

    The profile stage writes the file atomically (a rename), so a file that exists is complete: one
    that is not such a JSON object is an error naming the file, not a reason to wait on.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        raise ConfigError(f"{path}: not JSON ({text[:40]!r})") from None
    value = doc.get("start_at_ns") if isinstance(doc, dict) else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: start_at_ns: {value!r} is not an integer (time.time_ns epoch)")
    return value
