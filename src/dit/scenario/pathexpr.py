"""Dotted field paths: ``edge_server.policy``, ``inference.partition_points[2]``,
``network.device1.destinations["10.0.0.0/8"].delay_ms``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

Segment = str | int

_PLAIN = re.compile(r"^[A-Za-z0-9_<>?-]+\Z")
_TOKEN = re.compile(r'\.?([^.\[\]"]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def render_path(parts: Sequence[Segment]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def parse_path(text: str) -> list[Segment] | None:
    """The segments of a dotted path, or None when it is malformed."""
    parts: list[Segment] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or (m.group(1) is not None and pos > 0 and text[pos] != "."):
            return None
        if m.group(1) is not None and pos == 0 and text[0] == ".":
            return None
        if m.group(1) is not None:
            parts.append(m.group(1))
        elif m.group(2) is not None:
            parts.append(int(m.group(2)))
        else:
            try:
                parts.append(str(json.loads(m.group(3))))
            except json.JSONDecodeError:
                return None
        pos = m.end()
    return parts or None
