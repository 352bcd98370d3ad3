#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Undo a dit run's changes on one node from its journal records, reap its processes, verify."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_restore
short_description: Replay a node's journal backwards and reap every process of the run
description:
  - O(records) are this node's pending journal records, newest first. Each is undone in that order.
    Undoing is idempotent. The record kinds (C(op)) and their C(undo) data follow.
  - C(process) C({run_id, host, tag}) kills the tagged process groups.
  - C(mkdir) C({path, run_id}) removes a run directory carrying this run's marker.
  - C(file) C({path, prior}) writes the prior content back (C(prior=null) removes a file the run created).
  - C(rmdir) C({path}) removes an (empty) directory the run created, such as a cgroup.
  - C(cgroup) C({path}) removes a cgroup the run created. Any process still in it is moved to the
    parent cgroup first (the run's own processes are reaped by their newer C(process) records).
  - C(command) C({argv, dry_run, log}) runs an undo command (an argv list); with C(dry_run) it is
    only appended to C(log) as JSON, as local mode does for privileged network commands.
  - Then every process of the run on this node is killed by process group (SIGTERM, then SIGKILL),
    and the module fails loudly if any process carrying the run id survives.
options:
  run_id:
    description: The run id.
    type: str
    required: true
  host:
    description: The inventory name of this node.
    type: str
    required: true
  records:
    description: Pending journal records of this node, newest first.
    type: list
    elements: dict
    default: []
  grace_s:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 5.0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports the processes that would be reaped and whether any record would change the node; undoes nothing.
  diff_mode:
    support: none
    details: Undo records restore prior content; the records themselves are the description of the change.
  platform:
    support: full
    platforms: posix
    details: Linux nodes (reads C(/proc) and sysfs).
author: dit developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Undo the run on this node
  dit_restore:
    run_id: "{{ dit_run_id }}"
    host: "{{ inventory_hostname }}"
    records: "{{ dit_undo[inventory_hostname] | default([]) }}"
"""

RETURN = r"""
undone:
  description: Ids of the journal records undone (or found already undone).
  returned: always
  type: list
reaped:
  description: Processes of the run found and killed.
  returned: always
  type: list
"""

import errno
import json
import os
import shutil
import subprocess
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_procs import find_tagged, reap

MARKER = ".dit-run"


def _undo_mkdir(undo: dict[str, Any], check: bool) -> bool:
    path = undo["path"]
    if not os.path.exists(path):
        return False
    marker = os.path.join(path, MARKER)
    try:
        with open(marker, encoding="utf-8") as handle:
            owner = handle.read().strip()
    except OSError as exc:
        raise ValueError(f"{path} has no {MARKER} marker; not removing it") from exc
    if owner != undo["run_id"]:
        raise ValueError("{} belongs to run {}, not {}; not removing it".format(path, owner, undo["run_id"]))
    if not check:
        shutil.rmtree(path)
    return True


def _undo_file(undo: dict[str, Any], check: bool) -> bool:
    path = undo["path"]
    prior = undo.get("prior")
    if prior is None:
        if os.path.exists(path):
            if not check:
                os.unlink(path)
            return True
        return False
    try:
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
    except OSError:
        current = None
    if current == prior:
        return False
    if not check:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(prior)
    return True


def _undo_rmdir(undo: dict[str, Any], check: bool) -> bool:
    path = undo["path"]
    if not os.path.isdir(path):
        return False
    if not check:
        os.rmdir(path)
    return True


def _undo_command(undo: dict[str, Any], check: bool) -> bool:
    argv = [str(a) for a in undo["argv"]]
    if check:
        return True
    if undo.get("dry_run"):
        with open(undo["log"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"argv": argv, "undo": True}) + "\n")
        return True
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0 and not undo.get("ignore_errors"):
        detail = (proc.stderr or proc.stdout).strip()
        raise ValueError(f"undo command {argv} failed: {detail}")
    return True


def _undo_cgroup(undo: dict[str, Any], check: bool, timeout_s: float = 5.0) -> bool:
    path = undo["path"].rstrip("/")
    if not os.path.isdir(path):
        return False
    if check:
        return True
    parent_procs = os.path.join(os.path.dirname(path), "cgroup.procs")
    deadline = time.monotonic() + timeout_s
    while True:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as handle:
            pids = handle.read().split()
        for pid in pids:  # a process left in the cgroup moves out (it is not killed: not ours)
            try:
                with open(parent_procs, "w", encoding="ascii") as handle:
                    handle.write(pid)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return True
        except OSError as exc:  # EBUSY while an exiting task still holds the cgroup
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


UNDO = {
    "mkdir": _undo_mkdir,
    "file": _undo_file,
    "rmdir": _undo_rmdir,
    "cgroup": _undo_cgroup,
    "command": _undo_command,
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "host": {"type": "str", "required": True},
            "records": {"type": "list", "elements": "dict", "default": []},
            "grace_s": {"type": "float", "default": 5.0},
        },
        supports_check_mode=True,
    )
    p = module.params
    check = module.check_mode
    undone, reaped, changed, errors = [], [], False, []
    for record in p["records"]:
        op, undo = record.get("op"), record.get("undo") or {}
        try:
            if op == "process":
                if check:
                    found = find_tagged(undo["run_id"], undo.get("host"), undo.get("tag"))
                else:
                    found, left = reap(undo["run_id"], undo.get("host"), undo.get("tag"), p["grace_s"])
                    if left:
                        raise ValueError(f"processes survived SIGKILL: {left}")
                reaped.extend(found)
                changed = changed or bool(found)
            elif op in UNDO:
                changed = UNDO[op](undo, check) or changed
            else:
                raise ValueError(f"unknown journal op {op!r}")
            undone.append(record["id"])
        except (OSError, ValueError, KeyError) as exc:
            errors.append("{} {}: {}".format(op, record.get("id"), exc))
    if check:
        survivors = find_tagged(p["run_id"], p["host"])
    else:
        found, survivors = reap(p["run_id"], p["host"], None, p["grace_s"])
        reaped.extend(found)
        changed = changed or bool(found)
    result = {"changed": changed, "undone": [] if check else undone, "reaped": reaped, "survivors": survivors}
    if errors or (survivors and not check):
        msg = "; ".join(errors)
        if survivors:
            msg = ("processes of run {} survive on {}: {}. ".format(p["run_id"], p["host"], survivors)) + msg
        module.fail_json(msg=msg.strip(), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
