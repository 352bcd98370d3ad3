# -*- coding: utf-8 -*-
# Shared by dit's Ansible modules that write kernel files (stdlib only, runs on the node).
"""Read a small kernel file and compare its content with a target value.

sysfs and cgroup files hold one value and a trailing newline; ``1200000`` and ``1200000\\n`` are
the same setting, and so are ``0100`` and ``100``, so values that both parse as integers are
compared as integers and everything else as stripped text.
"""

from __future__ import annotations

from typing import Any


def read(path: str) -> str | None:
    """The content of ``path``, or None when it cannot be read (missing, no permission)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def as_int(text: Any) -> int | None:
    """``text`` as an integer (surrounding whitespace ignored), or None when it is not one."""
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def same(current: str | None, target: Any) -> bool:
    """Whether a file's content ``current`` already holds ``target`` (integers compare as integers)."""
    if current is None:
        return False
    a, b = as_int(current), as_int(target)
    if a is not None and b is not None:
        return a == b
    return str(current).strip() == str(target).strip()
