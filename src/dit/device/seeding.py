"""Seed every random generator of a device process from the scenario's seed (stdlib only).

The driver puts the scenario's seed in every device process's environment (``DIT_SEED``, and
``PYTHONHASHSEED`` for str hashing, see :func:`dit.conditions.process_settings`). The agent calls
:func:`seed_from_env` first thing; it seeds Python's :mod:`random` at once and NumPy's global
generator, TensorFlow (``tf.random.set_seed``) and PyTorch (``torch.manual_seed``) as soon as each is
imported: right away when it already is, otherwise the moment the process first imports it.

Why not simply import the frameworks here: a process that profiles a PyTorch model must not carry
TensorFlow's import time and resident memory (hundreds of MB on a 4 GB board, inside the memory
cgroup the scenario may impose) just to seed a generator it never uses. A framework that is not
installed is never imported and never seeded.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

SEED_ENV = "DIT_SEED"


def _seed_numpy(module: ModuleType, seed: int) -> None:
    module.random.seed(seed & 0xFFFFFFFF)


def _seed_tensorflow(module: ModuleType, seed: int) -> None:
    module.random.set_seed(seed)


def _seed_torch(module: ModuleType, seed: int) -> None:
    module.manual_seed(seed)


SEEDERS: dict[str, Callable[[ModuleType, int], None]] = {
    "numpy": _seed_numpy,
    "tensorflow": _seed_tensorflow,
    "torch": _seed_torch,
}


class SeedOnImport:
    """A ``sys.meta_path`` finder that seeds a framework right after its first import.

    It finds the real spec with the other finders and wraps only that spec's loader's
    ``exec_module``, so the module, its loader type and everything else stay as they were. Once a
    name has been handled it answers None for it (it stays on ``sys.meta_path``: removing itself
    while the import system iterates that list would skip the next finder).
    """

    def __init__(self, seed: int, pending: Mapping[str, Callable[[ModuleType, int], None]]) -> None:
        self.seed = seed
        self.pending = dict(pending)
        self.seeded: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        seeder = self.pending.pop(fullname, None)
        if seeder is None:
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module
        seed, seeded = self.seed, self.seeded

        def exec_module(module: ModuleType) -> None:
            original(module)
            seeder(module, seed)
            seeded.append(fullname)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def seed_all(seed: int, frameworks: Sequence[str] = tuple(SEEDERS)) -> dict[str, Any]:
    """Seed :mod:`random` now and each installed framework now (if imported) or on its first import.

    Returns ``{"seed", "now": [...], "on_import": [...], "absent": [...]}``.
    """
    random.seed(seed)
    now, later, absent = ["random"], [], []
    pending: dict[str, Callable[[ModuleType, int], None]] = {}
    for name in frameworks:
        seeder = SEEDERS[name]
        module = sys.modules.get(name)
        if module is not None:
            seeder(module, seed)
            now.append(name)
        elif importlib.util.find_spec(name) is not None:
            pending[name] = seeder
            later.append(name)
        else:
            absent.append(name)
    if pending:
        sys.meta_path.insert(0, SeedOnImport(seed, pending))
    return {"seed": seed, "now": now, "on_import": later, "absent": absent}


def seed_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """:func:`seed_all` with ``$DIT_SEED``; None (nothing seeded) when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get(SEED_ENV, "").strip()
    if not raw:
        return None
    try:
        seed = int(raw)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={raw!r} is not an integer") from None
    return seed_all(seed)
