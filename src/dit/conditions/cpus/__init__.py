"""CPU sets for the run's processes, from the inventory (``dit_cpu_affinity`` host variable).

On the rack every board has its own cores and nothing needs confining. In local mode every node
shares this machine's cores, so the generated inventory gives the edge server CPU 0 and the
devices the others (when there are at least two): the devices' load generators and inference then
slow the devices, as they would on the rack, instead of the edge server, whose stage times the
delay model's remote term uses. A user inventory may set ``dit_cpu_affinity`` too (e.g. to keep a
co-located controller off the cores being measured).
"""

from __future__ import annotations

from typing import Any

from dit.conditions import Condition, HostContext, ProcessSettings
from dit.scenario import Scenario

CONDITION = Condition(name="cpus", role=None, order=1, variables=())


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    return None  # no role: see process()


def process(scenario: Scenario, host: str, ctx: HostContext) -> ProcessSettings | None:
    cpus = ctx.hostvars.get("dit_cpu_affinity")
    if not cpus:
        return None
    return ProcessSettings(env={}, cgroup=None, cpus=tuple(int(c) for c in cpus))
