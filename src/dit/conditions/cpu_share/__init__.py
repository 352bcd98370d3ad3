"""Compute capacity of a device's run processes (``hardware.<device>.cpu_share_pct``), by cgroup CPU quota.

The share is a percentage of **one CPU** (as ``dit rack up --cpu-share``): 30 is 1 ms of CPU time
per 3.334 ms period (:func:`period_us`), 100 a whole core, 250 two and a half cores; it may be at most 100 times the
node's CPU count (preflight refuses more, naming the field). The ``cgroup_cpu`` role creates the
cgroup ``<dit_cpu_cgroup_root>/dit-<run id>-<host>`` (``dit_cgroup``: cgroup v2 ``cpu.max``, or v1
``cpu.cfs_period_us`` + ``cpu.cfs_quota_us``, detected on the node at run time, with the highest CPU
weight so that the quota and not the node's other work sets the capacity) and :func:`process` makes
the run's device processes (profile agent, load generators, the runtime's processes) join it when
they start. The cgroup is journaled (removed at teardown, after the run's processes are gone).
``dit_cpu_cgroup_root`` is a host variable: the cgroup v2 root ``/sys/fs/cgroup`` by default,
``/sys/fs/cgroup/cpu`` on a cgroup v1 host (where the memory limit's cgroup is another directory, in
the memory hierarchy: the processes join both).

On a real board the board's own knob is the CPU frequency (``cpu_freq_mhz``); a CPU share caps the
run's processes on top of it (a board with other work, or a faster board standing in for a slower
one). In **local mode**, by default (``DIT_LOCAL_CPU_SHARE=auto``), every device gets its own CPU cgroup even
when the scenario sets no share: the local inventory gives each device ``dit_cpu_share_default_pct``,
an equal split of the CPUs the
devices run on (the non-edge CPUs, see :mod:`dit.conditions.cpus`), so that a device's capacity
while it profiles is its capacity during inference, and the load processes on it take from that
capacity, not from the other devices'. The default is set only where this machine can apply it
(root and a cpu controller with CFS bandwidth); the scenario's value always wins, and
``DIT_LOCAL_CPU_SHARE`` (``auto`` — the default —, ``off`` or a percentage of one CPU) chooses; the
measurements behind the default are in :func:`dit.run.localmode.local_cpu_share`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from dit.conditions import Condition, HostContext, PreflightFacts, ProcessSettings, UndoScope
from dit.conditions.cgroup_roots import cgroup_cpu_root
from dit.scenario import Scenario

CONDITION = Condition(
    name="cpu_share",
    role="cgroup_cpu",
    order=21,
    variables=("cgroup_cpu_path", "cgroup_cpu_quota_us", "cgroup_cpu_period_us", "cgroup_cpu_field"),
)

DEFAULT_CPU_CGROUP_ROOT = "/sys/fs/cgroup"
SHORTEST_PERIOD_US = 2_000
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller cfs_quota_us (and cpu.max quota)
DEFAULT_HOSTVAR = (
    "dit_cpu_share_default_pct"  # local mode's default share (dit.run.inventory.local_inventory)
)
ADVICE = "a kernel with CONFIG_CFS_BANDWIDTH and the cpu cgroup controller"


def cgroup_root(ctx: HostContext) -> str:
    root = str(ctx.hostvars.get("dit_cpu_cgroup_root") or DEFAULT_CPU_CGROUP_ROOT)
    return posixpath.normpath(root)


def cgroup_path(ctx: HostContext) -> str:
    """The run's CPU cgroup on ``ctx.host``, named like the memory one (run id and host)."""
    return posixpath.join(cgroup_root(ctx), f"dit-{ctx.run_id}-{ctx.host}")


def field_of(host: str) -> str:
    return f"hardware.{host}.cpu_share_pct"


def share_pct(scenario: Scenario, host: str, ctx: HostContext) -> int | None:
    """The device's share in percent of one CPU: the scenario's, else local mode's default, else None."""
    if host not in scenario.devices:
        return None
    value = scenario.hardware.get(host, {}).get("cpu_share_pct")
    if value is None and ctx.local:
        value = ctx.hostvars.get(DEFAULT_HOSTVAR)
    return None if value is None else int(value)


def period_us(pct: int) -> int:
    """The CFS period for a share of ``pct`` % of one CPU: the shortest that gives the kernel's
    minimum quota of 1 ms (25 % gets 4 ms, 5 % gets 20 ms, 1 % gets 100 ms), and at least 2 ms.

    The period is the grain of the emulated capacity. Within a period a capped process runs at full
    speed until its quota is spent, then waits for the next period. With the kernel's usual 100 ms, a
    25 % node runs 25 ms flat out and then stops for 75 ms: a stage of a few milliseconds measured on
    its own after a pause runs at full speed, while the same stages back to back (the profile's
    timing passes) pay the waits. A partition's local part starts after the device idled, so its
    first quota is such a burst, which saves it about ``quota x (100 / pct - 1)`` of wall time: 7.5
    ms at 25 % with a 10 ms period (2.5 ms quota), 3 ms with 4 ms (1 ms quota). Measured at 25 %
    (``benchmarks/bench_cpu_share_grain.py``): 6 ms of work after a pause took 0.59-0.73 of its
    uniform time with the 10 ms period and 0.73-0.91 with 4 ms; 18 ms of work about 1.0 with both.
    The profile's local term over-predicted short local parts by 1.2-1.4x on the rack with 10 ms
    (docs/optimisers.md). The 2 ms floor keeps the kernel's period timer at most 500 times a second
    per node for shares of 50 % and more.
    """
    if pct < 1:
        raise ValueError(f"a CPU share must be at least 1 %, not {pct}")
    return max(SHORTEST_PERIOD_US, -(-MIN_QUOTA_US * 100 // pct))


def quota_us(pct: int) -> int:
    """CPU time per :func:`period_us` for ``pct`` % of one CPU."""
    return pct * period_us(pct) // 100


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    pct = share_pct(scenario, host, ctx)
    if pct is None:
        return None
    return {
        "cgroup_cpu_path": cgroup_path(ctx),
        "cgroup_cpu_quota_us": quota_us(pct),
        "cgroup_cpu_period_us": period_us(pct),
        "cgroup_cpu_field": field_of(host),
    }


def process(scenario: Scenario, host: str, ctx: HostContext) -> ProcessSettings | None:
    if share_pct(scenario, host, ctx) is None:
        return None
    return ProcessSettings(env={}, cgroup=cgroup_path(ctx))


def preflight_problems(
    nodes: Mapping[str, Mapping[str, Any]], built: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Why a node cannot take its CPU share, from its preflight facts (``dit_facts``).

    A share above 100 % times the node's CPUs cannot be given; a node without a cpu controller (with
    CFS bandwidth) cannot cap; a ``dit_cpu_cgroup_root`` outside the node's cpu hierarchy gets the
    root to use.
    """
    problems: list[str] = []
    for host, per_host in built.items():
        variables = per_host.get(CONDITION.name)
        facts = nodes.get(host, {})
        if variables is None:
            continue
        field = str(variables["cgroup_cpu_field"])
        pct = int(variables["cgroup_cpu_quota_us"]) * 100 // int(variables["cgroup_cpu_period_us"])
        cpus = facts.get("cpu_count")
        if isinstance(cpus, int) and cpus > 0 and pct > 100 * cpus:
            problems.append(
                f"{host}: {field} is {pct}, but {host} has {cpus} CPU{'s' if cpus > 1 else ''}: "
                f"at most {100 * cpus} (the share is a percentage of one CPU)"
            )
            continue
        controller = facts.get("cpu_controller")
        if controller is None:
            continue  # facts of an older dit_facts: the role itself refuses what it cannot apply
        if controller == "disabled":
            problems.append(f"{host}: {field} needs a CPU quota, which {host} cannot give: it needs {ADVICE}")
            continue
        root = facts.get("cpu_cgroup_root")
        parent = posixpath.dirname(str(variables["cgroup_cpu_path"]))
        if root and not (parent == root or parent.startswith(str(root).rstrip("/") + "/")):
            problems.append(
                f"{host}: {field}: the cgroup {controller} cpu hierarchy of {host} is {root}, "
                f"but dit_cpu_cgroup_root is {parent}: set dit_cpu_cgroup_root: {root} for {host} in the inventory"
            )
    return problems


def preflight(facts: PreflightFacts) -> str | None:
    """The CPU share gate (the condition's ``preflight`` hook): refuses what :func:`preflight_problems` finds."""
    problems = preflight_problems(facts.nodes, facts.built)
    return "cpu share refused: " + "; ".join(problems) if problems else None


def undo_scope(host: str, built: Mapping[str, Any] | None, hostvars: Mapping[str, Any]) -> UndoScope:
    """The cpu hierarchy: a run's cgroup is ``dit-<run id>-<host>`` under it."""
    return UndoScope(cgroup_roots=(str(hostvars.get("dit_cpu_cgroup_root") or DEFAULT_CPU_CGROUP_ROOT),))


def local_hostvars() -> dict[str, Any]:
    """Local mode caps CPU shares for real, in this machine's cpu hierarchy."""
    return {"dit_cpu_cgroup_root": cgroup_cpu_root()}
