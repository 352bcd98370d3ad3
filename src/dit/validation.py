"""The old name of :mod:`dit.analysis.model_validation` (the delay model against measurements).

Kept because docs/interchange.md and docs/optimisers.md documented ``dit.validation.validate_run``;
new code imports :mod:`dit.analysis.model_validation` (scenario validation is :func:`dit.scenario.validate`).
"""

from dit.analysis.model_validation import VALIDATION_COLUMNS, ValidationSummary, validate_run, validate_runs

__all__ = ["VALIDATION_COLUMNS", "ValidationSummary", "validate_run", "validate_runs"]
