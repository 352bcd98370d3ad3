"""The old name of :mod:`dit.analysis.delay`, kept because optimiser plug-ins may import it.

docs/optimisers.md documented ``dit.delay`` as the reference model before the analysis package
existed; new code imports :mod:`dit.analysis.delay`.
"""

from dit.analysis.delay import (
    OBJECTIVES,
    POLICIES,
    DelayBreakdown,
    DelayModel,
    DelayModelError,
    Objective,
    Policy,
    Tables,
    batch_delays,
    batch_objective,
    build_tables,
    check_objective,
    check_policy,
    evaluate,
    objective_value,
    synthetic_model,
)

__all__ = [
    "OBJECTIVES",
    "POLICIES",
    "DelayBreakdown",
    "DelayModel",
    "DelayModelError",
    "Objective",
    "Policy",
    "Tables",
    "batch_delays",
    "batch_objective",
    "build_tables",
    "check_objective",
    "check_policy",
    "evaluate",
    "objective_value",
    "synthetic_model",
]
