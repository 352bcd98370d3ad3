"""For every test of the repository (tests/ and the runtimes' tests): torch's compiler imported under the
builtin ``sys.intern`` before a slow test's fixtures are set up.

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


def import_torch_compiler() -> None:
    """Import ``torch._dynamo`` (once per process) while ``sys.intern`` is the builtin: it registers its
    substitutes at import, so Ansible's patch made later, or already made, no longer matters."""
    if "torch._dynamo" in sys.modules or importlib.util.find_spec("torch") is None:
        return
    with builtin_sys_intern():
        import torch._dynamo  # noqa: F401


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of a slow test is set up (a module-scoped one loads a model, and with it torch's
    compiler, before any function-scoped fixture could act)."""
    if item.get_closest_marker("slow") is not None:
        import_torch_compiler()
