"""Whether a dotted name a text gives (``dit.run.driver.Driver``) is an object the code has."""

from __future__ import annotations

import importlib


def resolves(name: str) -> bool:
    """The longest importable module prefix of ``name``, then its attributes, one by one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False
