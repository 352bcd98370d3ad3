"""For every test of the repository (tests/ and the runtimes' tests): the builtin ``sys.intern`` around the
slow tests, and torch's compiler imported under it.

Importing Ansible in a test process (``ansible.errors``, ``ansible.module_utils.basic``: the tests that load
the modules or action plugins in-process) replaces ``sys.intern`` with a callable object, and
``torch._dynamo`` refuses, at its import, to register a substitute for anything but a function. Its import
then fails half-way, and every later test of that pytest worker that uses torch fails with it. Which worker
meets which first depends on the order the tests are handed out: CI failed nine slow tests once the
llama.cpp build was on the machine and its tests no longer skipped. The device and edge processes never
import Ansible, so only a pytest process meets this.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def builtin_sys_intern() -> Iterator[None]:
    """``sys.intern`` as Python made it while the block runs (Ansible's patch keeps the original)."""
    patched = sys.intern
    original = getattr(type(patched), "unpatched_implementation", None)
    if isinstance(patched, types.BuiltinFunctionType) or original is None:
        yield
        return
    sys.intern = original
    try:
        yield
    finally:
        sys.intern = patched


@pytest.fixture(autouse=True)
def _torch_beside_ansible(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("slow") is None:
        yield
        return
    with builtin_sys_intern():
        if "torch._dynamo" not in sys.modules and importlib.util.find_spec("torch") is not None:
            import torch._dynamo  # noqa: F401  (once per process, while sys.intern is the builtin)
        yield
