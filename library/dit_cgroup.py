#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Create a cgroup with a memory limit and/or a CPU quota (v2 or v1, detected at run time) for a dit run, journaled."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_cgroup
version_added: "0.1.0"
short_description: Create a cgroup with a memory limit or a CPU quota for the processes of a dit run
description:
  - Creates the cgroup directory O(path) and sets its memory limit (O(memory_limit_bytes)) and/or its
    CPU quota (O(cpu_quota_us) per O(cpu_period_us)). The cgroup version is read
    from the parent directory at run time. cgroup v2 (the parent has C(cgroup.controllers) with
    C(memory) in its C(cgroup.subtree_control)) gets C(memory.max) and, when swap accounting
    exists, C(memory.swap.max). cgroup v1 (the parent is a memory hierarchy, with
    C(memory.limit_in_bytes)) gets C(memory.limit_in_bytes) and, when present,
    C(memory.memsw.limit_in_bytes) (memory plus swap).
  - The CPU quota is C(cpu.max) (C(<quota> <period>)) on cgroup v2 (C(cpu) in the parent's
    C(cgroup.subtree_control)), and C(cpu.cfs_period_us) then C(cpu.cfs_quota_us) in a cgroup v1 cpu
    hierarchy (the parent has C(cpu.cfs_quota_us)), with the highest CPU weight (C(cpu.weight) 10000,
    C(cpu.shares) 262144) so that the quota, not the node's other work, sets what the processes get,
    and on v1 with RT group scheduling a real-time budget of 10 ms per second (C(cpu.rt_runtime_us)),
    without which a v1 cpu group refuses SCHED_FIFO (a warning, not a failure, when the parent has none
    to give).
    cgroup v1 keeps memory and cpu in separate hierarchies (one call per hierarchy, each with its own
    O(path)).
  - Reads the current limits, compares and writes only what differs; nothing in check mode.
  - Journaled through the C(dit_cgroup) action plugin; with O(_dit_plan=true) it returns the
    records without changing anything. A cgroup it creates is journaled as C(cgroup) (removed at
    teardown, its limit files with it; C(dit_restore) moves any process left in it to the parent
    first); a limit written on an existing cgroup as C(file) with the prior content.
  - Processes join the cgroup when they start (C(dit_proc), C(dit_launch) option C(cgroup)).
options:
  path:
    description: The cgroup directory, for example C(/sys/fs/cgroup/dit-<run id>-<host>).
    type: path
    required: true
  memory_limit_bytes:
    description: The memory limit in bytes (rounded down to whole pages, as the kernel does).
    type: int
  cpu_quota_us:
    description:
      - CPU time the cgroup's processes may use per O(cpu_period_us), in microseconds (at least 1000);
        30000 of 100000 is 30 % of one CPU, 200000 of 100000 two CPUs.
    type: int
  cpu_period_us:
    description: The CFS period of O(cpu_quota_us), in microseconds (1000 to 1000000).
    type: int
    default: 100000
  swap_limit_bytes:
    description: Swap the processes may use beyond O(memory_limit_bytes); 0 allows none.
    type: int
    default: 0
  field:
    description: Scenario field named in error messages.
    type: str
    default: memory_limit
extends_documentation_fragment:
  - dit
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the current limits and reports what would change; creates and writes nothing.
  diff_mode:
    support: full
    details: Returns whether the cgroup exists and its limit files before and after.
author: The dit developers
"""

EXAMPLES = r"""
- name: Limit the run's device processes to 512 MiB
  dit_cgroup:
    path: /sys/fs/cgroup/dit-myrun-device1
    memory_limit_bytes: 536870912

- name: Give the run's device processes 30 % of one CPU (cgroup v1 cpu hierarchy)
  dit_cgroup:
    path: /sys/fs/cgroup/cpu/dit-myrun-device1
    cpu_quota_us: 30000
    field: hardware.device1.cpu_share_pct
"""

RETURN = r"""
version:
  description: The cgroup version found (C(v1) or C(v2)).
  returned: success
  type: str
limits:
  description: The limit files of the cgroup with their target values, in write order.
  returned: success
  type: dict
journal:
  description: In plan mode, the change records this call needs.
  returned: plan mode
  type: list
"""

import os
from collections.abc import Callable

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_files import as_int, read, same

V1_LIMIT = "memory.limit_in_bytes"
V1_MEMSW = "memory.memsw.limit_in_bytes"
V2_MAX = "memory.max"
V2_SWAP = "memory.swap.max"
V1_CFS_PERIOD = "cpu.cfs_period_us"
V1_CFS_QUOTA = "cpu.cfs_quota_us"
V2_CPU_MAX = "cpu.max"
V1_CPU_SHARES = "cpu.shares"
V2_CPU_WEIGHT = "cpu.weight"
CPU_SHARES_MAX_V1 = 262144
CPU_WEIGHT_MAX_V2 = 10000
V1_RT_RUNTIME = "cpu.rt_runtime_us"
RT_BUDGET_US = 10000  # per second: two 2 ms start spins with room (the root has 950000)
OPTIONAL = (V1_RT_RUNTIME,)  # a budget the parent cannot give is a warning, not a failure
MIN_QUOTA_US = 1000  # the kernel's smallest CFS quota and period
MAX_PERIOD_US = 1_000_000


def detect(parent: str, controller: str = "memory") -> tuple[str | None, str | None]:
    """``(version, problem)``: the cgroup version under ``parent`` for ``controller`` (``memory`` or
    ``cpu``), or why it cannot hold that controller's limit."""
    controllers = read(os.path.join(parent, "cgroup.controllers"))
    if controllers is not None:
        if controller not in controllers.split():
            return (
                None,
                f"cgroup v2 at {parent} has no {controller} controller "
                f"(cgroup.controllers: {controllers.strip()})",
            )
        subtree = read(os.path.join(parent, "cgroup.subtree_control")) or ""
        if controller not in subtree.split():
            return None, (
                f"the {controller} controller is not enabled for the children of {parent} "
                f"(cgroup.subtree_control: {subtree.strip() or 'empty'})"
            )
        return "v2", None
    marker, variable, v1_root = (
        (V1_LIMIT, "dit_cgroup_root", "/sys/fs/cgroup/memory")
        if controller == "memory"
        else (V1_CFS_QUOTA, "dit_cpu_cgroup_root", "/sys/fs/cgroup/cpu")
    )
    if os.path.exists(os.path.join(parent, marker)):
        return "v1", None
    return None, (
        f"{parent} is neither a cgroup v2 directory nor a cgroup v1 {controller} hierarchy"
        + (" with CFS bandwidth control" if controller == "cpu" else "")
        + f"; set {variable} (cgroup v2: /sys/fs/cgroup, cgroup v1: {v1_root})"
    )


def limit_files(version: str, limit: int, swap: int, present: Callable[[str], bool]) -> list[tuple[str, str]]:
    """The limit files to write, ``[(name, value)]``: the memory limit, then the swap limit.

    ``present`` tells which optional files exist (swap accounting). cgroup v1 requires
    memory <= memory+swap at every step: the writer raises memory+swap first when it must.
    """
    if version == "v2":
        out = [(V2_MAX, str(limit))]
        if present(V2_SWAP):
            out.append((V2_SWAP, str(swap)))
        return out
    out = [(V1_LIMIT, str(limit))]
    if present(V1_MEMSW):
        out.append((V1_MEMSW, str(limit + swap)))
    return out


def cpu_files(
    version: str, quota_us: int, period_us: int, present: Callable[[str], bool] = lambda name: True
) -> list[tuple[str, str]]:
    """The CPU quota files to write, ``[(name, value)]``: v2 ``cpu.max``; v1 the period, then the quota.

    The cgroup also gets the highest CPU weight, so that its quota and not the node's other work sets
    what its processes get (a 30 % share is 30 % on a busy node too); the quota caps what they take.
    On v1 with RT group scheduling (``present`` tells) it gets a small real-time budget: a new v1 cpu
    group has none, and the device agent's SCHED_FIFO wait for the start instant is refused without.
    """
    if version == "v2":
        return [(V2_CPU_MAX, f"{quota_us} {period_us}"), (V2_CPU_WEIGHT, str(CPU_WEIGHT_MAX_V2))]
    out = [
        (V1_CFS_PERIOD, str(period_us)),
        (V1_CFS_QUOTA, str(quota_us)),
        (V1_CPU_SHARES, str(CPU_SHARES_MAX_V1)),
    ]
    if present(V1_RT_RUNTIME):
        out.append((V1_RT_RUNTIME, str(RT_BUDGET_US)))
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "memory_limit_bytes": {"type": "int"},
            "swap_limit_bytes": {"type": "int", "default": 0},
            "cpu_quota_us": {"type": "int"},
            "cpu_period_us": {"type": "int", "default": 100000},
            "field": {"type": "str", "default": "memory_limit"},
            "_dit_plan": {"type": "bool", "default": False},
        },
        required_one_of=[("memory_limit_bytes", "cpu_quota_us")],
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"].rstrip("/")
    field = p["field"]
    memory = p["memory_limit_bytes"] is not None
    cpu = p["cpu_quota_us"] is not None
    page = os.sysconf("SC_PAGE_SIZE")
    limit = (p["memory_limit_bytes"] or 0) // page * page
    swap = max(0, p["swap_limit_bytes"]) // page * page
    quota, period = p["cpu_quota_us"] or 0, p["cpu_period_us"]
    if memory and limit <= 0:
        module.fail_json(msg=f"{field}: {limit} bytes is not a usable memory limit")
    if cpu and not MIN_QUOTA_US <= period <= MAX_PERIOD_US:
        module.fail_json(
            msg=f"{field}: a CPU period of {period} us is outside {MIN_QUOTA_US}..{MAX_PERIOD_US} us"
        )
    if cpu and quota < MIN_QUOTA_US:
        module.fail_json(
            msg=f"{field}: a CPU quota of {quota} us per {period} us is below the kernel's minimum of {MIN_QUOTA_US} us"
        )
    version = None
    for controller, wanted in (("memory", memory), ("cpu", cpu)):
        if not wanted:
            continue
        found, problem = detect(os.path.dirname(path), controller)
        if problem or found is None:  # detect gives a version whenever it names no problem
            module.fail_json(msg=f"{field}: {problem}")
            return
        version = found
    assert version is not None
    exists = os.path.isdir(path)

    def wanted_files(present: Callable[[str], bool]) -> list[tuple[str, str]]:
        out = limit_files(version, limit, swap, present) if memory else []
        return out + (cpu_files(version, quota, period, present) if cpu else [])

    def present(name: str) -> bool:
        return os.path.exists(os.path.join(path, name)) if exists else True

    files = wanted_files(present)
    current = {name: read(os.path.join(path, name)) if exists else None for name, _ in files}
    differing = [(name, value) for name, value in files if not same(current[name], value)]
    limits = dict(files)
    diff = {
        "before": {"exists": exists, **{n: (c or "").strip() for n, c in current.items() if exists}},
        "after": {"exists": True, **limits},
    }
    if not exists:
        journal = [{"op": "cgroup", "undo": {"path": path}}]
    else:
        journal = [
            {"op": "file", "undo": {"path": os.path.join(path, name), "prior": current[name]}}
            for name, _ in differing
        ]
    if p["_dit_plan"] or module.check_mode or not journal:
        module.exit_json(changed=bool(journal), journal=journal, version=version, limits=limits, diff=diff)
    if not exists:
        try:
            os.mkdir(path, 0o755)
        except OSError as exc:
            module.fail_json(msg=f"{field}: creating cgroup {path} failed: {exc}")
        files = wanted_files(lambda name: os.path.exists(os.path.join(path, name)))
        differing = [
            (name, value) for name, value in files if not same(read(os.path.join(path, name)), value)
        ]
    memory_pair = [item for item in differing if item[0] in (V1_LIMIT, V1_MEMSW)]
    if version == "v1" and len(memory_pair) == 2:
        memsw_now = as_int(read(os.path.join(path, V1_MEMSW)))
        if memsw_now is not None and memsw_now < limit:
            # raise memory+swap before memory
            differing = [item for item in differing if item[0] == V1_MEMSW] + [
                item for item in differing if item[0] != V1_MEMSW
            ]
    warnings: list[str] = []
    for name, value in differing:
        target = os.path.join(path, name)
        try:
            with open(target, "w", encoding="ascii") as handle:
                handle.write(value)
        except OSError as exc:
            if name in OPTIONAL:
                warnings.append(
                    f"{field}: writing {value} to {target} failed: {exc} (SCHED_FIFO unavailable)"
                )
                continue
            module.fail_json(msg=f"{field}: writing {value} to {target} failed: {exc}")
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=True, version=version, limits=dict(files), diff=diff)


if __name__ == "__main__":
    main()
