"""System monitors on every node (edge server included): the ``monitors`` role.

A 1 Hz sampler (:mod:`dit.device.monitor`) of CPU per core, memory, temperature, per-core frequency
and the firmware throttling flags runs as a tagged process (tag ``monitor``) from the apply stage
(order 41, before the edge service, so that its capacity profile is on record too, and before the
load starts) until teardown. The scenario schema has no
block for it: monitors always run on every node. A top-level ``monitors: {enabled, interval_s}`` block
is read when the schema gains one (``enabled`` true, ``interval_s`` 1 by default).
"""

from __future__ import annotations

from typing import Any

from dit.conditions import Condition, HostContext
from dit.scenario import Scenario

CONDITION = Condition(name="monitors", role="monitors", order=41, variables=("monitors_interval_s",))
DEFAULT_INTERVAL_S = 1.0


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    block = scenario.data.get("monitors") or {}
    if not block.get("enabled", True):
        return None
    return {"monitors_interval_s": float(block.get("interval_s", DEFAULT_INTERVAL_S))}
