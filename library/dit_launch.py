#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Start the processes a runtime asked for on this node, tagged and journaled; wait for the main ones."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_launch
version_added: "0.1.0"
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
  - "The two-phase start (O(phase)): a process with O(processes[].prepared_file) is started by the
    C(prepare) phase before the common instant is picked, with C(DIT_START_AT_FILE) (O(node_root)/O(start_at_file)),
    C(DIT_PREPARED_FILE) (its prepared file), C(DIT_START_AT_TIMEOUT_S) (O(timeout_s) + 600 s) and
    C(DIT_STATUS_FILE) (C(logs/<name>.status.json)) in its environment; it prepares, writes its prepared
    file, and waits for the start-at file. The C(start) phase writes the start-at file (atomically:
    C({\"start_at_ns\": ...})), starts the other processes as the one-phase start does, and waits
    for all of them to exit; the prepared ones are not its children, so it follows them by pid
    (O(prepared)) and takes their exit code from their status record (running, then its exit code).
    One that is gone without an exit code there has failed."
  - Journaled through the C(dit_launch) action plugin (one process record per name, before any start;
    a record the prepare phase journaled is not written again by the start phase).
options:
  node_root:
    description: The node's run root (files, logs and results are relative to it).
    type: path
    required: true
  processes:
    description:
      - The processes, each C({name, argv, env, cwd, files, ready_file, result_files, prepared_file});
        C(name) is the tag, unique per run and host; C(argv) a list (never a shell string); C(files) maps a
        path relative to O(node_root) to its text; C(prepared_file) (relative to O(node_root)) marks a
        process of the two-phase start (O(phase)).
    type: list
    elements: dict
    required: true
  start_at_ns:
    description: The common start instant (time.time_ns epoch) put into C(DIT_START_AT_NS).
    type: int
  wait:
    description: Wait for every process to exit (implied by O(phase=start)).
    type: bool
    default: false
  timeout_s:
    description:
      - How long to wait (for a ready or prepared file, or with O(wait) for the exit) before failing.
    type: float
    default: 3600.0
  phase:
    description:
      - C(all) (the one-phase start) starts every process of O(processes).
      - C(prepare) starts only those with a C(prepared_file) and waits until each has written it (failing
        when one exits first or O(timeout_s) passes; then it kills the ones it started). Returns their pids.
      - C(start) writes O(start_at_file) with O(start_at_ns) when a process has a C(prepared_file), starts
        the others with C(DIT_START_AT_NS), and waits for every process of O(processes) to exit.
    type: str
    choices: [all, prepare, start]
    default: all
  prepared:
    description:
      - With O(phase=start), the C(processes) result of the C(prepare) phase (name to C({pid, ...})), or
        name to pid; every process with a C(prepared_file) must be in it.
    type: dict
    default: {}
  start_at_file:
    description:
      - The start-at file of the two-phase start, relative to O(node_root), the same for both phases.
    type: str
    default: start_at.json
  announce:
    description:
      - With O(phase=start), write O(start_at_file) even when no process of O(processes) is prepared, for
        a service already running on the node that reads the instant there (the edge service profiles its
        capacity again from it).
    type: bool
    default: false
  env:
    description: The node's process environment of the run (thread counts, seeds).
    type: dict
    default: {}
  _dit_plan:
    description:
      - Set by the C(dit_launch) action plugin, never by a playbook. Returns the C(journal) records (one
        process per name) without starting anything.
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
    details: Reports the processes that would be started; starts nothing and writes no file.
  diff_mode:
    support: none
  platform:
    details: Linux nodes (reads C(/proc)).
author: The dit developers
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

- name: Prepare the agent before the instant is picked (two-phase start)
  dit_launch:
    run_id: "{{ dit_run_id }}"
    host: "{{ inventory_hostname }}"
    node_root: "{{ dit_node_root }}"
    processes:
      - name: profile
        argv: ["/usr/bin/python3", "{{ dit_node_root }}/dit-device.pyz", "profile", "--config", "profile.json"]
        prepared_file: profile.prepared.json
        result_files: ["results/done.json"]
    phase: prepare
  register: dit_prepared

- name: Start it at the instant and wait for it
  dit_launch:
    run_id: "{{ dit_run_id }}"
    host: "{{ inventory_hostname }}"
    node_root: "{{ dit_node_root }}"
    processes:
      - name: profile
        argv: ["/usr/bin/python3", "{{ dit_node_root }}/dit-device.pyz", "profile", "--config", "profile.json"]
        prepared_file: profile.prepared.json
        result_files: ["results/done.json"]
    phase: start
    prepared: "{{ dit_prepared.processes }}"
    start_at_ns: "{{ dit_start_at_ns | int }}"
"""

RETURN = r"""
processes:
  description:
    - Per process name, C({pid, returncode, results, ready}); C(results) maps each result file to its JSON.
    - With O(phase=prepare), also C(prepared), the JSON of its prepared file.
  returned: success
  type: dict
entered_ns:
  description:
    - The node's wall clock (time.time_ns) when the module began, before it parsed its arguments. Against
      the controller's clock when the task was sent, it is how long the task took to reach the node (SSH,
      module transfer, the interpreter's start inside the node's CPU share). The profile playbook sizes
      the start lead from the prepare phase's, and the start phase's, against O(start_at_ns), is how far
      ahead of the instant the start-at file was written.
  returned: always, except in check mode
  type: int
start_at_ns:
  description: O(start_at_ns), as given (null without it).
  returned: success, except in check mode
  type: int
"""

import contextlib
import json
import os
import signal
import subprocess
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_procs import (
    PREPARED_FILE_ENV,
    START_AT_ENV,
    START_AT_FILE_ENV,
    START_WAIT_TIMEOUT_ENV,
    STATUS_ENV,
    alive_as,
    cgroup_dirs,
    read_json,
    spawn,
    status_path,
    tagged_env,
)
from ansible.module_utils.dit_trusted import UntrustedPath

# A prepared process waits for the start-at file at most this long beyond the prepare phase's own
# timeout: the slowest node may prepare until that timeout, and the instant is picked after it.
START_WAIT_SLACK_S = 600.0
POLL_S = 0.02


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


def _write_atomic(path: str, text: str) -> None:
    """Write a process's file 0600: it carries what the scenario named (a paragraph dit read from a
    file only its author may read, a profile's costs), and the processes that read it run as this
    module's user; a planted link at the temporary name is refused (O_NOFOLLOW)."""
    if not os.path.isdir(os.path.dirname(path)):
        os.makedirs(os.path.dirname(path))
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(fd, 0o600)  # a stale temporary file keeps its old mode through O_CREAT
        handle.write(text)
    os.replace(tmp, path)


def _unlink(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)  # a stale file must not pass for this run's


def _kill_all(started: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in started.values():
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _kill_prepared(prepared: dict[str, int], run_id: str) -> None:
    """Kill the prepared processes (not children of this module: started by the prepare phase) that are
    still theirs: each leads its own session, so its pid is its process group."""
    for name, pid in prepared.items():
        if alive_as(pid, run_id, name):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def _prepared_pids(given: dict[str, Any]) -> dict[str, int]:
    """The prepare phase's ``processes`` result (name -> {pid, ...}) or name -> pid, as name -> pid."""
    out: dict[str, int] = {}
    for name, value in given.items():
        pid: Any = value.get("pid") if isinstance(value, dict) else value
        if isinstance(pid, bool) or not isinstance(pid, (int, str)) or not str(pid).isdigit():
            raise ValueError(f"prepared.{name}: {pid!r} is not a process id")
        out[str(name)] = int(pid)
    return out


class Launcher:
    """The node's part of one task: its settings, the processes it started, what it learnt of each."""

    def __init__(self, p: dict[str, Any]) -> None:
        self.p = p
        self.root: str = p["node_root"]
        self.logs = os.path.join(self.root, "logs")
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self.prepared: dict[str, int] = {}  # name -> pid of the processes of the prepare phase
        self.info: dict[str, dict[str, Any]] = {}
        self.deadline = time.monotonic() + p["timeout_s"]
        self.start_at_file = _inside(self.root, p["start_at_file"])

    def err(self, name: str) -> str:
        return os.path.join(self.logs, name + ".err")

    def start(self, spec: dict[str, Any], extra: dict[str, str]) -> subprocess.Popen[bytes]:
        """Write the process's files, remove its stale ones, start it (tagged, own session)."""
        p = self.p
        name = str(spec["name"])
        for rel, text in sorted((spec.get("files") or {}).items()):
            _write_atomic(_inside(self.root, rel), str(text))
        stale = list(spec.get("result_files") or [])
        stale += [spec[key] for key in ("ready_file", "prepared_file") if spec.get(key)]
        for rel in stale:
            _unlink(_inside(self.root, rel))
        env_extra = {str(k): str(v) for k, v in p["env"].items()}
        env_extra.update(extra)
        env_extra.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        env = tagged_env(os.environ, p["run_id"], p["host"], name, env_extra)
        proc = spawn(
            [str(a) for a in spec["argv"]],
            env,
            spec.get("cwd") or self.root,
            os.path.join(self.logs, name + ".out"),
            self.err(name),
            p["cgroup"],
            p["cpus"],
            p["verify"],
        )
        self.started[name] = proc
        self.info[name] = {"pid": proc.pid, "returncode": None, "results": {}, "ready": None}
        return proc

    def wait_file(self, name: str, proc: subprocess.Popen[bytes], rel: str, what: str) -> Any:
        """The JSON a just-started process writes to ``rel``; fails if it exits first or the time is up."""
        path = _inside(self.root, rel)
        while True:
            doc = read_json(path)
            if doc is not None:
                return doc
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {proc.returncode} before it was {what}\n{_tail(self.err(name))}"
                )
            if time.monotonic() > self.deadline:
                raise RuntimeError("{} not {} after {:g} s".format(name, what, self.p["timeout_s"]))
            time.sleep(POLL_S)

    def start_main(self, spec: dict[str, Any], start_at_ns: int | None) -> None:
        """One process of the one-phase start (DIT_START_AT_NS), waited for until ready if it says so."""
        extra = {START_AT_ENV: str(start_at_ns)} if start_at_ns is not None else {}
        proc = self.start(spec, extra)
        if spec.get("ready_file"):
            name = str(spec["name"])
            self.info[name]["ready"] = self.wait_file(name, proc, spec["ready_file"], "ready")

    def prepare(self, specs: list[dict[str, Any]]) -> None:
        """Phase prepare: start every process with a prepared_file, then wait until each has prepared."""
        _unlink(self.start_at_file)  # the instant of this start is written by the start phase only
        timeout = str(self.p["timeout_s"] + START_WAIT_SLACK_S)
        for spec in specs:
            name = str(spec["name"])
            status = status_path(self.logs, name)
            _unlink(status)
            extra = {
                START_AT_FILE_ENV: self.start_at_file,
                PREPARED_FILE_ENV: _inside(self.root, spec["prepared_file"]),
                START_WAIT_TIMEOUT_ENV: timeout,
                STATUS_ENV: status,  # its exit status, for the start phase (not its parent)
            }
            self.start(spec, extra)
        for spec in specs:
            name = str(spec["name"])
            doc = self.wait_file(name, self.started[name], spec["prepared_file"], "prepared")
            self.info[name]["prepared"] = doc

    def release(self, start_at_ns: int) -> None:
        """Phase start: the common instant, for every prepared process of the node (atomically)."""
        _write_atomic(self.start_at_file, json.dumps({"start_at_ns": start_at_ns}) + "\n")

    def _prepared_running(self) -> bool:
        return any(alive_as(pid, self.p["run_id"], name) for name, pid in self.prepared.items())

    def wait_exit(self, specs: list[dict[str, Any]], names: list[str]) -> None:
        """Every process of ``specs``: its own children and the prepared ones, until each has exited."""
        while any(proc.poll() is None for proc in self.started.values()) or self._prepared_running():
            if time.monotonic() > self.deadline:
                self.kill()
                raise RuntimeError(
                    "{} did not finish within {:g} s; killed".format(", ".join(names), self.p["timeout_s"])
                )
            time.sleep(0.05)
        for spec in specs:
            name = str(spec["name"])
            # A prepared process is not this module's child: its exit code is in its status record.
            code = self._prepared_exit(name) if name in self.prepared else self.started[name].returncode
            self.info[name]["returncode"] = code
            for rel in spec.get("result_files") or []:
                self.info[name]["results"][rel] = read_json(_inside(self.root, rel))
            if code != 0:
                raise RuntimeError(f"{name} exited with status {code}\n{_tail(self.err(name))}")
            missing = [rel for rel, doc in self.info[name]["results"].items() if doc is None]
            if missing:
                raise RuntimeError("{} exited without writing {}".format(name, ", ".join(missing)))

    def _prepared_exit(self, name: str) -> int:
        """A prepared process's exit code, from its status record (it is not this module's child)."""
        path = status_path(self.logs, name)
        record = read_json(path)
        if (
            isinstance(record, dict)
            and record.get("state") == "exited"
            and isinstance(record.get("exit_code"), int)
        ):
            return int(record["exit_code"])
        raise RuntimeError(
            f"{name} (pid {self.prepared[name]}) ended without recording an exit status in {path} "
            f"(killed by a signal?)\n{_tail(self.err(name))}"
        )

    def kill(self) -> None:
        _kill_all(self.started)
        _kill_prepared(self.prepared, self.p["run_id"])


def main() -> None:
    entered_ns = time.time_ns()
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
            "verify": {"type": "dict", "default": {}},
            "phase": {"type": "str", "default": "all", "choices": ["all", "prepare", "start"]},
            "prepared": {"type": "dict", "default": {}},
            "start_at_file": {"type": "str", "default": "start_at.json"},
            "announce": {"type": "bool", "default": False},
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
    phase = p["phase"]
    two_phase = [spec for spec in p["processes"] if spec.get("prepared_file")]
    one_phase = [spec for spec in p["processes"] if not spec.get("prepared_file")]
    waits = p["wait"] or phase == "start"
    launcher: Launcher | None = None
    try:
        launcher = Launcher(p)
        if not os.path.isdir(launcher.logs):
            os.makedirs(launcher.logs)
        if phase == "prepare":
            launcher.prepare(two_phase)
        elif phase == "start":
            given = _prepared_pids(p["prepared"])
            for spec in two_phase:
                name = str(spec["name"])
                if name not in given:
                    raise RuntimeError(f"{name}: has a prepared_file, but the prepare phase did not start it")
                launcher.prepared[name] = given[name]
                launcher.info[name] = {
                    "pid": launcher.prepared[name],
                    "returncode": None,
                    "results": {},
                    "ready": None,
                }
            if two_phase or p["announce"]:
                if p["start_at_ns"] is None:
                    raise ValueError(
                        "start_at_ns: required to start prepared processes or to announce the instant"
                    )
                launcher.release(p["start_at_ns"])
            for spec in one_phase:
                launcher.start_main(spec, p["start_at_ns"])
            launcher.wait_exit(p["processes"], names)
        else:
            for spec in p["processes"]:
                launcher.start_main(spec, p["start_at_ns"])
            if waits:
                launcher.wait_exit(p["processes"], names)
    except (OSError, ValueError, RuntimeError, UntrustedPath) as exc:
        if launcher is not None and (waits or phase == "prepare"):
            launcher.kill()  # prepared processes of a failed prepare phase would wait for nothing
        message, _, stderr = str(exc).partition("\n")
        module.fail_json(
            msg=message, stderr=stderr, processes=launcher.info if launcher else {}, entered_ns=entered_ns
        )
    module.exit_json(
        changed=True,
        processes=launcher.info if launcher else {},
        entered_ns=entered_ns,
        start_at_ns=p["start_at_ns"],
    )


if __name__ == "__main__":
    main()
