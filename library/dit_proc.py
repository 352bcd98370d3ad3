#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Start a tagged, session-leading device process of a dit run (journaled)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_proc
version_added: "0.1.0"
short_description: Start a tagged background process of a dit run
description:
  - Starts O(argv) as the leader of a new session (its own process group) with C(DIT_RUN_ID),
    C(DIT_HOST) and C(DIT_TAG) in its environment, so that teardown (and C(dit cleanup) after a
    crash) can find and kill it by run id alone.
  - A live process of this run, host and tag that this run did not start is an error, never adopted
    (another run with the same run id would otherwise be reported as this one's). One that this run's
    journal records as started (the same task applied twice) is left alone and nothing is started;
    the C(dit_proc) action plugin tells the module which case it is.
  - With O(ready_file), waits until the process writes that JSON file and returns its content.
  - Sets C(DIT_STATUS_FILE) to C(logs/<tag>.status.json) under O(cwd); the device agent keeps its
    status record there (running, then its exit code), which C(dit_collect) checks before teardown.
  - Journaled through the C(dit_proc) action plugin (journal before change).
options:
  tag:
    description: The process tag, unique per run and host (for example C(edge)).
    type: str
    required: true
  argv:
    description: The command as an argv list (never a shell string).
    type: list
    elements: str
    required: true
  cwd:
    description: Working directory.
    type: path
    required: true
  env:
    description: Extra environment variables.
    type: dict
    default: {}
  ready_file:
    description: JSON file the process writes when ready.
    type: path
  ready_timeout:
    description: Seconds to wait for O(ready_file).
    type: float
    default: 60.0
  config:
    description: JSON configuration written to O(config_path) before the process starts.
    type: dict
  config_path:
    description: Where O(config) is written (atomically); required with O(config).
    type: path
  _dit_adopt:
    description:
      - Set by the C(dit_proc) action plugin, never by a playbook, when this run's journal already
        records this tag as started (the same task applied twice); a live process of this run, host
        and tag is then left alone. Without it such a process is an error, never adopted.
    type: bool
    default: false
extends_documentation_fragment:
  - dit
  - dit.run
  - dit.node
  - dit.process
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the process would be started; starts nothing and writes no configuration.
  diff_mode:
    support: partial
    details: Whether a process of this tag runs, before and after; only when nothing is started (check mode, plan, already started by this run).
author: The dit developers
"""

EXAMPLES = r"""
- name: Start the edge inference service
  dit_proc:
    run_id: "{{ dit_run_id }}"
    host: "{{ inventory_hostname }}"
    tag: edge
    argv: ["/usr/bin/python3", "{{ dit_node_root }}/dit-device.pyz", "edge", "--config", "{{ dit_node_root }}/edge.json"]
    cwd: "{{ dit_node_root }}"
    ready_file: "{{ dit_node_root }}/edge.ready"
"""

RETURN = r"""
pids:
  description: PIDs of the tagged processes.
  returned: always
  type: list
ready:
  description: Content of O(ready_file), when given.
  returned: when ready_file is set
  type: dict
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_procs import (
    STATUS_ENV,
    cgroup_dirs,
    find_tagged,
    read_json,
    spawn,
    status_path,
    tagged_env,
)
from ansible.module_utils.dit_trusted import UntrustedPath


def _tail(path: str, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "host": {"type": "str", "required": True},
            "tag": {"type": "str", "required": True},
            "argv": {"type": "list", "elements": "str", "required": True},
            "cwd": {"type": "path", "required": True},
            "env": {"type": "dict", "default": {}},
            "ready_file": {"type": "path"},
            "ready_timeout": {"type": "float", "default": 60.0},
            "config": {"type": "dict"},
            "config_path": {"type": "path"},
            "cgroup": {"type": "raw"},
            "cpus": {"type": "list", "elements": "int"},
            "verify": {"type": "dict", "default": {}},
            "_dit_plan": {"type": "bool", "default": False},
            "_dit_adopt": {"type": "bool", "default": False},
        },
        required_together=[("config", "config_path")],
        supports_check_mode=True,
    )
    p = module.params
    try:  # one cgroup directory (the old form) or a list of them
        p["cgroup"] = cgroup_dirs(p["cgroup"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    running = find_tagged(p["run_id"], p["host"], p["tag"])
    ready = read_json(p["ready_file"]) if p["ready_file"] else None
    if running and not p["_dit_adopt"]:
        module.fail_json(
            msg="a process tagged {} of run {} already runs on {} (pid {}) and this run did not start it: "
            "refusing to adopt it".format(
                p["tag"], p["run_id"], p["host"], ", ".join(str(r["pid"]) for r in running)
            ),
            pids=[r["pid"] for r in running],
        )
    if p["_dit_plan"] or module.check_mode or running:
        journal = (
            []
            if running
            else [{"op": "process", "undo": {"run_id": p["run_id"], "host": p["host"], "tag": p["tag"]}}]
        )
        module.exit_json(
            changed=bool(journal),
            journal=journal,
            pids=[r["pid"] for r in running],
            ready=ready,
            diff={"before": {"running": bool(running)}, "after": {"running": True}},
        )
    if p["config_path"]:
        with open(p["config_path"] + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(p["config"], handle, sort_keys=True)
        os.replace(p["config_path"] + ".tmp", p["config_path"])
    if p["ready_file"] and os.path.exists(p["ready_file"]):
        os.unlink(p["ready_file"])
    logs = os.path.join(p["cwd"], "logs")
    if not os.path.isdir(logs):
        os.makedirs(logs)
    out = os.path.join(logs, p["tag"] + ".out")
    err = os.path.join(logs, p["tag"] + ".err")
    status = status_path(logs, p["tag"])
    if os.path.exists(status):
        os.unlink(status)
    extra = {str(k): str(v) for k, v in p["env"].items()}
    extra[STATUS_ENV] = status  # the device agent records its exit code there (dit_collect reads it)
    env = tagged_env(os.environ, p["run_id"], p["host"], p["tag"], extra)
    try:
        proc = spawn(p["argv"], env, p["cwd"], out, err, p["cgroup"], p["cpus"], p["verify"])
    except UntrustedPath as exc:
        module.fail_json(msg=str(exc))
    if p["ready_file"]:
        deadline = time.monotonic() + p["ready_timeout"]
        while ready is None:
            if proc.poll() is not None:
                module.fail_json(
                    msg="{} exited with status {} before it was ready".format(p["tag"], proc.returncode),
                    stderr=_tail(err),
                )
            if time.monotonic() > deadline:
                module.fail_json(
                    msg="{} not ready after {:.0f} s".format(p["tag"], p["ready_timeout"]), stderr=_tail(err)
                )
            time.sleep(0.02)
            ready = read_json(p["ready_file"])
    module.exit_json(changed=True, pids=[proc.pid], ready=ready)


if __name__ == "__main__":
    main()
