"""Inference runtimes as plug-ins (entry-point group ``dit.runtimes``; docs/runtimes.md).

:mod:`dit.runtime_api.interface` is the interface, :mod:`dit.runtime_api.registry` finds the installed runtimes,
:mod:`dit.runtimes.layers` is the built-in one. What runs a runtime sits above: :mod:`dit.run.launch` turns
its launch into the profile stage's variables, :mod:`dit.runtime_ops` plays its readiness checks and
maintenance actions (``dit runtimes``).
"""

from __future__ import annotations

from dit.runtime_api.interface import (
    NODE_BASE,
    Action,
    ActionPlan,
    BlockProblem,
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
    "NODE_BASE",
    "Action",
    "ActionPlan",
    "BlockProblem",
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
