#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Timed-start profiling and partitioned inference on a dit device (journaled)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_timed_profile
short_description: Profile a model and run partitioned inference from a common start instant
description:
  - Writes the device agent's configuration, starts the agent as a tagged session leader and waits
    for it. The agent sleeps until the wall clock reaches C(start_at_ns) of O(config), captures the
    origin pair C((time_ns, monotonic_ns)), profiles the model stage by stage and then runs
    partitioned inference against the edge service. All durations are integer nanoseconds.
  - The whole timing-critical sequence runs inside one process on the node; Ansible only starts it.
  - If the module (or the driver) dies, the agent keeps its session and run-id tag, so teardown or
    C(dit cleanup) reaps it.
options:
  run_id:
    description: The run id.
    type: str
    required: true
  host:
    description: The inventory name of this node.
    type: str
    required: true
  node_root:
    description: The node's run root (holds the agent and the results).
    type: path
    required: true
  python:
    description: Interpreter that runs the agent.
    type: str
    required: true
  config:
    description: The agent configuration (start_at_ns, model, repetitions, inference ...).
    type: dict
    required: true
  env:
    description: Extra environment (thread counts, seeds).
    type: dict
    default: {}
  timeout_s:
    description: Give up (and kill the agent) after this many seconds.
    type: float
    default: 3600.0
  cgroup:
    description:
      - A cgroup directory (v1 or v2) the process joins before it executes, or a list of
        them (on cgroup v1 one per hierarchy, e.g. the run's memory and cpu cgroups). A single path is
        never split on commas.
    type: raw
  cpus:
    description: CPU numbers the process and its children are confined to.
    type: list
    elements: int
  _dit_plan:
    description:
      - Set by the C(dit_timed_profile) action plugin, never by a playbook. The module reads the node's current
        state and returns the C(journal) records (with the prior values needed to undo) without changing
        anything; the plugin appends them to the run's journal before it runs the module for real.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Profiling is an action, not a state; check mode reports a change and starts nothing.
  diff_mode:
    support: none
    details: The agent writes new result files; there is no prior state to compare.
  platform:
    support: full
    platforms: posix
    details: Linux nodes (reads C(/proc) and sysfs).
author: dit developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Profile and infer from the common start instant
  dit_timed_profile:
    run_id: "{{ dit_run_id }}"
    host: "{{ inventory_hostname }}"
    node_root: "{{ dit_node_root }}"
    python: "{{ dit_python }}"
    config: "{{ dit_profile_config[inventory_hostname] }}"
"""

RETURN = r"""
origin:
  description: The agent's origin record (start_at_ns, origin_wall_ns, origin_mono_ns, lateness_ns).
  returned: success
  type: dict
summary:
  description: The agent's done.json summary.
  returned: success
  type: dict
"""

import json
import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_procs import cgroup_dirs, read_json, spawn, tagged_env

TAG = "profile"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "host": {"type": "str", "required": True},
            "node_root": {"type": "path", "required": True},
            "python": {"type": "str", "required": True},
            "config": {"type": "dict", "required": True},
            "env": {"type": "dict", "default": {}},
            "timeout_s": {"type": "float", "default": 3600.0},
            "cgroup": {"type": "raw"},
            "cpus": {"type": "list", "elements": "int"},
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:  # one cgroup directory (the old form) or a list of them
        p["cgroup"] = cgroup_dirs(p["cgroup"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    if p["_dit_plan"] or module.check_mode:
        # Profiling is an action, not a state: every call runs it.
        module.exit_json(
            changed=True,
            journal=[{"op": "process", "undo": {"run_id": p["run_id"], "host": p["host"], "tag": TAG}}],
        )
    root = p["node_root"]
    results = os.path.join(root, "results")
    config = dict(p["config"])
    config.update({"run_id": p["run_id"], "host": p["host"], "results_dir": results})
    config_path = os.path.join(root, "profile.json")
    with open(config_path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    os.replace(config_path + ".tmp", config_path)
    for stale in ("origin.json", "done.json"):
        if os.path.exists(os.path.join(results, stale)):
            os.unlink(os.path.join(results, stale))
    argv = [p["python"], os.path.join(root, "dit-device.pyz"), "profile", "--config", config_path]
    env = tagged_env(os.environ, p["run_id"], p["host"], TAG, {str(k): str(v) for k, v in p["env"].items()})
    err_path = os.path.join(root, "logs", TAG + ".err")
    proc = spawn(argv, env, root, os.path.join(root, "logs", TAG + ".out"), err_path, p["cgroup"], p["cpus"])
    deadline = time.monotonic() + p["timeout_s"]
    while proc.poll() is None:
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            module.fail_json(
                msg="profiling did not finish within {:.0f} s; agent killed".format(p["timeout_s"])
            )
        time.sleep(0.05)
    origin = read_json(os.path.join(results, "origin.json"))
    summary = read_json(os.path.join(results, "done.json"))
    if proc.returncode != 0 or summary is None:
        try:
            with open(err_path, encoding="utf-8", errors="replace") as handle:
                stderr = handle.read()[-4000:]
        except OSError:
            stderr = ""
        module.fail_json(
            msg=f"device agent exited with status {proc.returncode}", stderr=stderr, origin=origin
        )
    module.exit_json(changed=True, origin=origin, summary=summary)


if __name__ == "__main__":
    main()
