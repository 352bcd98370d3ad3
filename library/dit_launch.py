#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Start the processes a runtime asked for on this node, tagged and journaled; wait for the main ones."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_launch
short_description: Start a runtime's processes of a dit run, optionally waiting for them to exit
description:
  - Starts every process of O(processes) as the leader of its own session (its own process group)
    with C(DIT_RUN_ID), C(DIT_HOST) and C(DIT_TAG) (the process name) in its environment, under the
    node's process settings (O(env), O(cgroup), O(cpus)), so that teardown and C(dit cleanup) find and
    reap it by run id alone. Its output goes to C(logs/<name>.out) and C(logs/<name>.err).
  - Each process's O(processes[].files) are written under O(node_root) before it starts.
  - With O(start_at_ns), every process gets C(DIT_START_AT_NS) in its environment (the run's common start
    instant); the process itself waits for it, so the timing does not depend on Ansible.
  - Without O(wait), waits only for each process's O(processes[].ready_file). With O(wait), waits for
    every process to exit; fails when one exits with a non-zero status, misses one of its
    O(processes[].result_files), or outlives O(timeout_s) (then every process of the task is killed).
  - Journaled through the C(dit_launch) action plugin (one process record per name, before any start).
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
    description: The node's run root (files, logs and results are relative to it).
    type: path
    required: true
  processes:
    description:
      - The processes, each C({name, argv, env, cwd, files, ready_file, result_files}); C(name) is the
        tag, unique per run and host; C(argv) a list (never a shell string); C(files) maps a path relative
        to O(node_root) to its text.
    type: list
    elements: dict
    required: true
  start_at_ns:
    description: The common start instant (time.time_ns epoch) put into C(DIT_START_AT_NS).
    type: int
  wait:
    description: Wait for every process to exit.
    type: bool
    default: false
  timeout_s:
    description: How long to wait (for a ready file, or with O(wait) for the exit) before failing.
    type: float
    default: 3600.0
  env:
    description: The node's process environment of the run (thread counts, seeds).
    type: dict
    default: {}
  cgroup:
    description:
      - A cgroup directory (v1 or v2) every process joins before it executes, or a list of
        them (on cgroup v1 one per hierarchy, e.g. the run's memory and cpu cgroups). A single path is
        never split on commas.
    type: raw
  cpus:
    description: CPU numbers the processes and their children are confined to.
    type: list
    elements: int
  _dit_plan:
    description:
      - Set by the C(dit_launch) action plugin, never by a playbook. Returns the C(journal) records (one
        process per name) without starting anything.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports the processes that would be started; starts nothing and writes no file.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
    details: Linux nodes (reads C(/proc)).
author: dit developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Run the runtime's main processes from the start instant
  dit_launch:
    run_id: "{{ dit_run_id }}"
    host: "{{ inventory_hostname }}"
    node_root: "{{ dit_node_root }}"
    processes:
      - name: controller
        argv: ["/usr/bin/python3", "{{ dit_node_root }}/controller.py"]
        result_files: ["results/edge_done.json"]
    start_at_ns: "{{ dit_start_at_ns | int }}"
    wait: true
"""

RETURN = r"""
processes:
  description: Per process name, C({pid, returncode, results, ready}); C(results) maps each result file to its JSON.
  returned: success
  type: dict
"""

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_procs import cgroup_dirs, read_json, spawn, tagged_env


def _tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _inside(root: str, rel: str) -> str:
    """``rel`` under ``root``; a path that would leave it is refused."""
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(os.path.normpath(root) + os.sep):
        raise ValueError(f"{rel!r} is not a path inside the node root")
    return path


def _kill_all(started: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in started.values():
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "host": {"type": "str", "required": True},
            "node_root": {"type": "path", "required": True},
            "processes": {"type": "list", "elements": "dict", "required": True},
            "start_at_ns": {"type": "int"},
            "wait": {"type": "bool", "default": False},
            "timeout_s": {"type": "float", "default": 3600.0},
            "env": {"type": "dict", "default": {}},
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
    names = [str(spec.get("name", "")) for spec in p["processes"]]
    if p["_dit_plan"] or module.check_mode:
        module.exit_json(
            changed=bool(names),
            journal=[
                {"op": "process", "undo": {"run_id": p["run_id"], "host": p["host"], "tag": name}}
                for name in names
            ],
        )
    root = p["node_root"]
    logs = os.path.join(root, "logs")
    if not os.path.isdir(logs):
        os.makedirs(logs)
    base_env = {str(k): str(v) for k, v in p["env"].items()}
    if p["start_at_ns"] is not None:
        base_env["DIT_START_AT_NS"] = str(p["start_at_ns"])
    started: dict[str, subprocess.Popen[bytes]] = {}
    info: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + p["timeout_s"]
    try:
        for spec in p["processes"]:
            name = str(spec["name"])
            for rel, text in sorted((spec.get("files") or {}).items()):
                path = _inside(root, rel)
                if not os.path.isdir(os.path.dirname(path)):
                    os.makedirs(os.path.dirname(path))
                with open(path + ".tmp", "w", encoding="utf-8") as handle:
                    handle.write(str(text))
                os.replace(path + ".tmp", path)
            for rel in list(spec.get("result_files") or []) + (
                [spec["ready_file"]] if spec.get("ready_file") else []
            ):
                if os.path.exists(_inside(root, rel)):
                    os.unlink(_inside(root, rel))  # a stale file must not pass for this run's
            extra = dict(base_env)
            extra.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
            env = tagged_env(os.environ, p["run_id"], p["host"], name, extra)
            err = os.path.join(logs, name + ".err")
            proc = spawn(
                [str(a) for a in spec["argv"]],
                env,
                spec.get("cwd") or root,
                os.path.join(logs, name + ".out"),
                err,
                p["cgroup"],
                p["cpus"],
            )
            started[name] = proc
            info[name] = {"pid": proc.pid, "returncode": None, "results": {}, "ready": None}
            if spec.get("ready_file"):
                ready_path = _inside(root, spec["ready_file"])
                while info[name]["ready"] is None:
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"{name} exited with status {proc.returncode} before it was ready\n{_tail(err)}"
                        )
                    if time.monotonic() > deadline:
                        raise RuntimeError("{} not ready after {:.0f} s".format(name, p["timeout_s"]))
                    time.sleep(0.02)
                    info[name]["ready"] = read_json(ready_path)
        if p["wait"]:
            while any(proc.poll() is None for proc in started.values()):
                if time.monotonic() > deadline:
                    _kill_all(started)
                    raise RuntimeError(
                        "{} did not finish within {:.0f} s; killed".format(", ".join(names), p["timeout_s"])
                    )
                time.sleep(0.05)
            for spec in p["processes"]:
                name = str(spec["name"])
                proc = started[name]
                info[name]["returncode"] = proc.returncode
                for rel in spec.get("result_files") or []:
                    info[name]["results"][rel] = read_json(_inside(root, rel))
                err = os.path.join(logs, name + ".err")
                if proc.returncode != 0:
                    raise RuntimeError(f"{name} exited with status {proc.returncode}\n{_tail(err)}")
                missing = [rel for rel, doc in info[name]["results"].items() if doc is None]
                if missing:
                    raise RuntimeError("{} exited without writing {}".format(name, ", ".join(missing)))
    except (OSError, ValueError, RuntimeError) as exc:
        if p["wait"]:
            _kill_all(started)
        message, _, stderr = str(exc).partition("\n")
        module.fail_json(msg=message, stderr=stderr, processes=info)
    module.exit_json(changed=True, processes=info)


if __name__ == "__main__":
    main()
