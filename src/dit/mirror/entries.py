"""One list entry of ``mirror/sources.yaml`` (a git source, an sdist, a checkpoint): a mapping of strings.

Every list of that file is checked the same way, and its errors name the entry and the field
(``mirror/sources.yaml: sdists[0].version: '1' is not an exact version``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: A plain name: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or a digit.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


def read_sources(path: Path, error: type[Exception]) -> Any:
    """The YAML document of a sources file; ``error`` naming the file when it cannot be read or parsed."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"{path}: {exc}") from exc


@dataclass(frozen=True)
class Field:
    """What a field's value must be: a string matching ``pattern`` (any non-empty string without one);
    ``refusal`` follows the value in the error, ``{field}`` in it standing for another field's value."""

    refusal: str
    pattern: re.Pattern[str] | None = None

    def fits(self, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        return bool(self.pattern.match(value)) if self.pattern is not None else bool(value)


SHA256_FIELD = Field("is not a SHA-256 (64 lower-case hex digits)", SHA256)


def entry_values(
    entry: Any, at: str, fields: Mapping[str, Field], error: type[Exception], closed: bool = True
) -> tuple[str, ...]:
    """The values of ``fields`` in ``entry`` (the entry at ``at``), in their order; raises ``error``
    naming the entry or the field when it is not a mapping, has a field not in ``fields`` (``closed``)
    or a value that does not fit."""
    if not isinstance(entry, dict):
        raise error(f"{at}: not a mapping")
    unknown = sorted(set(entry) - set(fields))
    if closed and unknown:
        raise error(f"{at}: unknown field(s) {', '.join(unknown)}")
    for key, field in fields.items():
        value = entry.get(key)
        if not field.fits(value):
            raise error(f"{at}.{key}: {value!r} {field.refusal.format_map(entry)}")
    return tuple(entry[key] for key in fields)
