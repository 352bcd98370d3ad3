#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Create a memory-limited cgroup (v2 or v1, detected at run time) for a dit run, journaled."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_cgroup
short_description: Create a cgroup with a memory limit for the processes of a dit run
description:
  - Creates the cgroup directory O(path) and sets its memory limit. The cgroup version is read
    from the parent directory at run time. cgroup v2 (the parent has C(cgroup.controllers) with
    C(memory) in its C(cgroup.subtree_control)) gets C(memory.max) and, when swap accounting
    exists, C(memory.swap.max). cgroup v1 (the parent is a memory hierarchy, with
    C(memory.limit_in_bytes)) gets C(memory.limit_in_bytes) and, when present,
    C(memory.memsw.limit_in_bytes) (memory plus swap).
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
    required: true
  swap_limit_bytes:
    description: Swap the processes may use beyond O(memory_limit_bytes); 0 allows none.
    type: int
    default: 0
  field:
    description: Scenario field named in error messages.
    type: str
    default: memory_limit
  _dit_plan:
    description:
      - Set by the C(dit_cgroup) action plugin, never by a playbook. The module reads the node's current
        state and returns the C(journal) records (with the prior values needed to undo) without changing
        anything; the plugin appends them to the run's journal before it runs the module for real.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the current limits and reports what would change; creates and writes nothing.
  diff_mode:
    support: full
    details: Returns whether the cgroup exists and its limit files before and after.
  platform:
    support: full
    platforms: posix
    details: Linux nodes (reads C(/proc) and sysfs).
author: dit developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Limit the run's device processes to 512 MiB
  dit_cgroup:
    path: /sys/fs/cgroup/dit-myrun-device1
    memory_limit_bytes: 536870912
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


def detect(parent: str) -> tuple[str | None, str | None]:
    """``(version, problem)``: the cgroup version under ``parent``, or why it cannot hold a limit."""
    controllers = read(os.path.join(parent, "cgroup.controllers"))
    if controllers is not None:
        if "memory" not in controllers.split():
            return (
                None,
                f"cgroup v2 at {parent} has no memory controller (cgroup.controllers: {controllers.strip()})",
            )
        subtree = read(os.path.join(parent, "cgroup.subtree_control")) or ""
        if "memory" not in subtree.split():
            return None, (
                f"the memory controller is not enabled for the children of {parent} "
                f"(cgroup.subtree_control: {subtree.strip() or 'empty'})"
            )
        return "v2", None
    if os.path.exists(os.path.join(parent, V1_LIMIT)):
        return "v1", None
    return None, (
        f"{parent} is neither a cgroup v2 directory nor a cgroup v1 memory hierarchy; "
        "set dit_cgroup_root (cgroup v2: /sys/fs/cgroup, cgroup v1: /sys/fs/cgroup/memory)"
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "memory_limit_bytes": {"type": "int", "required": True},
            "swap_limit_bytes": {"type": "int", "default": 0},
            "field": {"type": "str", "default": "memory_limit"},
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"].rstrip("/")
    page = os.sysconf("SC_PAGE_SIZE")
    limit = p["memory_limit_bytes"] // page * page
    swap = max(0, p["swap_limit_bytes"]) // page * page
    if limit <= 0:
        module.fail_json(msg="{}: {} bytes is not a usable memory limit".format(p["field"], limit))
    version, problem = detect(os.path.dirname(path))
    if problem or version is None:  # detect gives a version whenever it names no problem
        module.fail_json(msg="{}: {}".format(p["field"], problem))
        return
    exists = os.path.isdir(path)

    def present(name: str) -> bool:
        return os.path.exists(os.path.join(path, name)) if exists else True

    files = limit_files(version, limit, swap, present)
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
            module.fail_json(msg="{}: creating cgroup {} failed: {}".format(p["field"], path, exc))
        files = limit_files(version, limit, swap, lambda name: os.path.exists(os.path.join(path, name)))
        differing = [
            (name, value) for name, value in files if not same(read(os.path.join(path, name)), value)
        ]
    if version == "v1" and len(differing) == 2:
        memsw_now = as_int(read(os.path.join(path, V1_MEMSW)))
        if memsw_now is not None and memsw_now < limit:
            differing.reverse()  # raise memory+swap before memory
    for name, value in differing:
        target = os.path.join(path, name)
        try:
            with open(target, "w", encoding="ascii") as handle:
                handle.write(value)
        except OSError as exc:
            module.fail_json(msg="{}: writing {} to {} failed: {}".format(p["field"], value, target, exc))
    module.exit_json(changed=True, version=version, limits=dict(files), diff=diff)


if __name__ == "__main__":
    main()
