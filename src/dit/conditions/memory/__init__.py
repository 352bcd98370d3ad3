"""Memory limit of a device's run processes (``hardware.<device>.memory_limit_mb``), by cgroup.

A 4 GB board stands in for a 2 GB one: the ``cgroup_memory`` role creates the cgroup
``<dit_cgroup_root>/dit-<run id>-<host>`` (``dit_cgroup``: cgroup v2 ``memory.max`` +
``memory.swap.max``, or v1 ``memory.limit_in_bytes`` + ``memory.memsw.limit_in_bytes``, detected on
the node at run time) and :func:`process` makes the run's device processes (profile agent, load
generator) join it when they start. The cgroup is journaled (removed at teardown, after the run's
processes are gone: their records are newer). ``dit_cgroup_root`` is a host variable: the cgroup v2
root ``/sys/fs/cgroup`` by default, ``/sys/fs/cgroup/memory`` on a cgroup v1 host. Preflight refuses
a node whose kernel has the memory controller disabled (:func:`preflight`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from dit.conditions import Condition, HostContext, PreflightFacts, ProcessSettings, UndoScope
from dit.conditions.cgroup_roots import cgroup_memory_root
from dit.scenario import Scenario

CONDITION = Condition(
    name="memory",
    role="cgroup_memory",
    order=20,
    variables=("cgroup_memory_path", "cgroup_memory_limit_bytes", "cgroup_memory_field"),
)

DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
BYTES_PER_MB = 1024 * 1024  # the scenario's MB are MiB
ADVICE = (
    "add cgroup_enable=memory cgroup_memory=1 to /boot/firmware/cmdline.txt "
    "(Raspberry Pi OS; /boot/cmdline.txt on older releases) and reboot"
)


def cgroup_root(ctx: HostContext) -> str:
    root = str(ctx.hostvars.get("dit_cgroup_root") or DEFAULT_CGROUP_ROOT)
    return posixpath.normpath(root)


def cgroup_path(ctx: HostContext) -> str:
    """The run's cgroup on ``ctx.host``: named after the run id (and the host: local mode puts
    every device on one machine)."""
    return posixpath.join(cgroup_root(ctx), f"dit-{ctx.run_id}-{ctx.host}")


def limit_mb(scenario: Scenario, host: str) -> int | None:
    if host not in scenario.devices:
        return None
    value = scenario.hardware.get(host, {}).get("memory_limit_mb")
    return None if value is None else int(value)


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    mb = limit_mb(scenario, host)
    if mb is None:
        return None
    return {
        "cgroup_memory_path": cgroup_path(ctx),
        "cgroup_memory_limit_bytes": mb * BYTES_PER_MB,
        "cgroup_memory_field": f"hardware.{host}.memory_limit_mb",
    }


def process(scenario: Scenario, host: str, ctx: HostContext) -> ProcessSettings | None:
    if limit_mb(scenario, host) is None:
        return None
    return ProcessSettings(env={}, cgroup=cgroup_path(ctx))


def preflight_problems(
    nodes: Mapping[str, Mapping[str, Any]], built: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Why a node cannot take its memory limit, from its preflight facts (``dit_facts``).

    ``built`` is :func:`dit.conditions.build_conditions`' result. A node whose kernel has the
    memory controller disabled gets the advice to enable it; a ``dit_cgroup_root`` outside the
    node's memory hierarchy gets the root to use.
    """
    problems: list[str] = []
    for host, per_host in built.items():
        variables = per_host.get(CONDITION.name)
        facts = nodes.get(host, {})
        if variables is None or "memory_controller" not in facts:
            continue
        field = variables["cgroup_memory_field"]
        controller = facts["memory_controller"]
        if controller == "disabled":
            problems.append(
                f"{host}: {field} needs the cgroup memory controller, which is disabled on {host}: {ADVICE}"
            )
            continue
        root = facts.get("memory_cgroup_root")
        parent = posixpath.dirname(str(variables["cgroup_memory_path"]))
        if root and not (parent == root or parent.startswith(root.rstrip("/") + "/")):
            problems.append(
                f"{host}: {field}: the cgroup {controller} memory hierarchy of {host} is {root}, "
                f"but dit_cgroup_root is {parent}: set dit_cgroup_root: {root} for {host} in the inventory"
            )
    return problems


def preflight(facts: PreflightFacts) -> str | None:
    """The memory gate (the condition's ``preflight`` hook): refuses what :func:`preflight_problems` finds."""
    problems = preflight_problems(facts.nodes, facts.built)
    return "memory limit refused: " + "; ".join(problems) if problems else None


def undo_scope(host: str, built: Mapping[str, Any] | None, hostvars: Mapping[str, Any]) -> UndoScope:
    """The memory hierarchy: a run's cgroup is ``dit-<run id>-<host>`` under it (limit or none: local mode
    and an aborted run may leave one behind)."""
    return UndoScope(cgroup_roots=(str(hostvars.get("dit_cgroup_root") or DEFAULT_CGROUP_ROOT),))


def local_hostvars() -> dict[str, Any]:
    """Local mode applies memory limits for real, in this machine's memory hierarchy."""
    return {"dit_cgroup_root": cgroup_memory_root()}
