"""Inference runtimes as plug-ins (entry-point group ``dit.runtimes``; docs/runtimes.md).

:mod:`dit.runtimes.base` is the interface, :mod:`dit.runtimes.registry` finds the installed runtimes,
:mod:`dit.runtimes.layers` is the built-in one, :mod:`dit.runtimes.launch` turns a runtime's launch
into the profile stage's variables, :mod:`dit.runtimes.ops` runs readiness checks and maintenance actions.
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
