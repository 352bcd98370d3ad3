"""The old module names documented before dit.analysis existed still name the same objects."""

from __future__ import annotations

import importlib

import pytest

import dit.analysis.delay

#: old module -> {name: the module that defines it now}
OLD_NAMES = {
    "dit.delay": {name: "dit.analysis.delay" for name in importlib.import_module("dit.delay").__all__},
    "dit.aggregate": {
        "aggregate_run": "dit.analysis.aggregate",
        "read_model_inputs": "dit.analysis.aggregate",
        "AggregateSummary": "dit.analysis.aggregate",
        "AggregateError": "dit.analysis.run",
        "DEFAULT_RATE_BPS": "dit.analysis.links",
    },
    "dit.validation": {
        name: "dit.analysis.model_validation"
        for name in ("validate_run", "validate_runs", "ValidationSummary", "VALIDATION_COLUMNS")
    },
}


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_old_name_is_the_new_object(old: str) -> None:
    old_module = importlib.import_module(old)
    assert set(old_module.__all__) == set(OLD_NAMES[old])
    for name, new in OLD_NAMES[old].items():
        assert getattr(old_module, name) is getattr(importlib.import_module(new), name)


def test_the_documented_reference_model_is_still_dit_delay() -> None:
    from dit.delay import evaluate

    assert evaluate is dit.analysis.delay.evaluate
