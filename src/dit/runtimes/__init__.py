"""Inference runtimes as plug-ins (entry-point group ``dit.runtimes``; docs/runtimes.md).

:mod:`dit.runtimes.base` is the interface, :mod:`dit.runtimes.registry` finds the installed runtimes,
:mod:`dit.runtimes.layers` is the built-in one. What runs a runtime sits above: :mod:`dit.run.launch` turns
its launch into the profile stage's variables, :mod:`dit.runtime_ops` plays its readiness checks and
maintenance actions (``dit runtimes``).
"""

from __future__ import annotations

from dit.runtimes.base import (
    Action,
    ActionPlan,
    CheckResult,
    LaunchContext,
    LaunchOutcome,
    LaunchSpec,
    NodeReadiness,
    ReadinessPlan,
    Results,
    Runtime,
    RuntimeBase,
    RuntimePreflight,
    SummaryValue,
)

__all__ = [
    "Action",
    "ActionPlan",
    "CheckResult",
    "LaunchContext",
    "LaunchOutcome",
    "LaunchSpec",
    "NodeReadiness",
    "ReadinessPlan",
    "Results",
    "Runtime",
    "RuntimeBase",
    "RuntimePreflight",
    "SummaryValue",
]
