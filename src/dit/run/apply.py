"""The apply stage's reading: the edge service's port, what the conditions report after apply, the
settle wait (the driver's :meth:`~dit.run.driver.Driver._apply` runs the stage and calls these)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from dit.conditions import EDGE_SERVICE_ORDER, active, after_apply
from dit.run.ansible_exec import StageOutcome
from dit.run.errors import StageFailed
from dit.run.rundir import RunDir
from dit.run.stop import StopRequests
from dit.runtime_api.interface import Runtime, uses_edge_service
from dit.scenario import Scenario

EDGE_SERVICE_TASK: Final = "Start the edge inference service"  # its name in playbooks/apply.yml.j2


def render_context(conditions: dict[str, dict[str, Any]], runtime: Runtime) -> dict[str, Any]:
    """What ``playbooks/apply.yml.j2`` is rendered with: the condition roles some host needs, before and
    after the edge service, and whether the service starts (a runtime that brings its own inference gets
    none profiling the edge's CPU). Known before preflight: resolving a condition changes its variables."""
    needed = active(conditions)
    return {
        "conditions_before": [c for c in needed if c.order < EDGE_SERVICE_ORDER],
        "conditions_after": [c for c in needed if c.order >= EDGE_SERVICE_ORDER],
        "edge_service": uses_edge_service(runtime),
    }


def edge_port(outcome: StageOutcome, edge_host: str) -> int:
    """The port the edge service reported from its start task (conditions after it use dit_proc too)."""
    ready = (outcome.result_of(edge_host, "dit_proc", task=EDGE_SERVICE_TASK) or {}).get("ready") or {}
    if "port" not in ready:
        raise StageFailed("apply: the edge service did not report its port")
    return int(ready["port"])


def report_applied(
    scenario: Scenario,
    outcome: StageOutcome,
    run: RunDir,
    info: Callable[[str], None],
    warn: Callable[[str], None],
) -> None:
    """Every condition's ``after_apply`` hook: its status fields into status.json, its lines said."""
    for applied in after_apply(scenario, outcome):
        if applied.status:
            run.set_status(**applied.status)
        for line in applied.infos:
            info(line)
        for line in applied.warnings:
            warn(line)


def settle(seconds: float, stop: StopRequests, info: Callable[[str], None]) -> None:
    """Wait ``timing.settle_s`` after apply, a stop request heard within 0.1 s."""
    if seconds <= 0:
        return
    info(f"settling for {seconds} s")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stop.check()
        time.sleep(min(0.1, seconds))


def edge_profiles_at_start(scenario: Scenario, runtime: Runtime) -> bool:
    """The edge service profiles its capacity again from the start instant: when it profiles at all
    and the runtime's devices use it (a plug-in's own inference would send it no request to end it)."""
    return scenario.edge.profile_capacity and uses_edge_service(runtime)
