"""The edge server at its nominal frequency (``edge_server.nominal_frequency: true``).

Every cpufreq policy of the edge server is pinned to its base frequency (``scaling_min_freq`` =
``scaling_max_freq`` = ``base_frequency`` with intel_pstate, else ``cpuinfo_max_freq`` once boost is
off) and turbo is switched off (``intel_pstate/no_turbo = 1``, or cpufreq ``boost = 0``), so that its
stage times are stable. Ordered before the edge inference service starts, so the service and its
capacity profile run under it. The ``edge_frequency`` role writes through ``dit_sysfs``; every prior
value is journaled and restored at teardown.
"""

from __future__ import annotations

from typing import Any

from dit.conditions import Condition, HostContext
from dit.scenario import Scenario

CONDITION = Condition(
    name="edge_frequency",
    role="edge_frequency",
    order=10,
    variables=("edge_frequency_nominal", "edge_frequency_field"),
)

FIELD = "edge_server.nominal_frequency"


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    if ctx.role != "edge" or not scenario.edge.nominal_frequency:
        return None
    return {"edge_frequency_nominal": True, "edge_frequency_field": FIELD}
