"""The old module names documented before dit.analysis existed still name the same objects."""

from __future__ import annotations

import importlib

import pytest

OLD_NAMES = {
    "dit.delay": ("dit.analysis.delay", ("DelayModel", "evaluate", "build_tables", "synthetic_model")),
    "dit.aggregate": ("dit.analysis.aggregate", ("aggregate_run", "read_model_inputs", "AggregateError")),
    "dit.validation": ("dit.analysis.model_validation", ("validate_run", "validate_runs")),
}


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_old_name_is_the_new_object(old: str) -> None:
    new, names = OLD_NAMES[old]
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name)
    assert set(old_module.__all__) <= set(vars(new_module))
