#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Characterise the link, snapshot the node and pack its results for fetching."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_collect
version_added: "0.1.0"
short_description: Ping the edge server, snapshot the node and pack the run's results
description:
  - Sends O(ping_count) ICMP echo requests to O(ping_target) with C(ping) and records every RTT in
    integer nanoseconds (C(results/ping.json)); without a C(ping) binary, falls back to timing TCP
    connects to O(tcp_port) and records that method.
  - With O(ping_targets) it pings every link of the device instead (the edge server and the other
    devices, all at once) and C(results/ping.json) is a list of link records, one per target.
  - "Writes a system snapshot (C(results/snapshot.json)): load, memory, uptime, processes."
  - With O(run_id), writes what became of the run's device processes (C(results/processes.json)),
    read from their status records in C(logs/) before teardown reaps them. An entry with C(failed)
    true (exited non-zero, or gone without an exit code) degrades the run.
  - With O(stop_tags), first stops those processes of the run on this node (SIGTERM to each process
    group, then SIGKILL after O(stop_grace_s)), so what they write when they stop is packed too (the
    edge server writes C(results/edge_summary.json) then). Stopping changes nothing teardown undoes;
    teardown still reaps whatever is left.
  - Packs C(results/) and C(logs/) into O(archive) with every member prefixed by the host name.
  - Writes only inside the node's run root, which teardown removes.
options:
  node_root:
    description: The node's run root.
    type: path
    required: true
  archive:
    description: Path of the archive to write.
    type: path
    required: true
  ping_target:
    description: Address to ping; none on the edge server.
    type: str
  ping_targets:
    description:
      - Every link to characterise, each C(target) (the other node's inventory name) and C(address);
        takes precedence over O(ping_target).
    type: list
    elements: dict
  ping_count:
    description: Number of echo requests (per target).
    type: int
    default: 10
  tcp_port:
    description: Port for the TCP fallback.
    type: int
  run_id:
    description: The run id; checks the status records of the run's device processes.
    type: str
  stop_tags:
    description: Tags of the run's processes on this node to stop before packing (needs O(run_id)).
    type: list
    elements: str
    default: []
  stop_grace_s:
    description: Seconds a stopped process has to exit after SIGTERM before SIGKILL.
    type: float
    default: 30.0
  fetch_to:
    description:
      - A path on the controller the action plugin fetches the archive to in the same task, checked by its SHA-1
        (no separate fetch task, whose remote stat is one more module run per node). Not with become, whose
        read of a root-only file needs Ansible's own fetch, unless the archive came back inline.
    type: path
  inline_max_bytes:
    description:
      - An archive no larger than this comes back inside the module's result (C(archive_b64)), which the
        action plugin takes out, checks by its SHA-1 and writes to O(fetch_to); a larger one is fetched
        by a transfer. Set by the action plugin; 0 returns none inline.
      - A transfer starts processes of its own on the node (C(sftp-server), a shell), which take seconds on a Pi 4's
        share of a CPU, for archives of tens of kilobytes.
    type: int
    default: 0
extends_documentation_fragment:
  - dit.node
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: partial
    details: Nothing is measured, written or packed; the result names the archive and reports no change.
  diff_mode:
    support: none
    details: The archive is a new file of the run; there is nothing to compare.
author: The dit developers
"""

EXAMPLES = r"""
- name: Collect
  dit_collect:
    host: "{{ inventory_hostname }}"
    node_root: "{{ dit_node_root }}"
    archive: "{{ dit_node_root }}/collect.tar.gz"
    ping_target: "{{ dit_edge_address }}"
    run_id: "{{ dit_run_id }}"
"""

RETURN = r"""
archive:
  description: The archive to fetch.
  returned: always
  type: str
archive_sha1:
  description: The SHA-1 of the archive, as Ansible's fetch checksums a transfer (the action plugin's O(fetch_to) checks it).
  returned: when the archive was written
  type: str
archive_b64:
  description: The archive itself, base64, when it is no larger than O(inline_max_bytes); the action plugin removes it from the task's result.
  returned: when the archive is small enough
  type: str
ping:
  description: The link record (target, method, sent, received, rtt_ns), a list of them with ping_targets.
  returned: when ping_target or ping_targets is set
  type: raw
stopped:
  description: The processes O(stop_tags) named that were running (pid, pgid, tag, host).
  returned: when stop_tags is set
  type: list
  elements: dict
processes:
  description: Per device process with a status record - tag, state, exit_code, error, failed, stderr_tail.
  returned: when run_id is set
  type: list
  elements: dict
"""

import base64
import hashlib
import json
import os
import tarfile
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_ping import ping, ping_all
from ansible.module_utils.dit_procs import process_states, reap


def _snapshot() -> dict[str, Any]:
    def read(path: str) -> str:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except OSError:
            return ""

    mem: dict[str, int] = {}
    for line in read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            mem[key] = int(parts[0]) * 1024
    return {
        "wall_ns": time.time_ns(),
        "monotonic_ns": time.monotonic_ns(),
        "loadavg": os.getloadavg(),
        "uptime_s": float((read("/proc/uptime").split() or ["0"])[0]),
        "mem_total_bytes": mem.get("MemTotal"),
        "mem_available_bytes": mem.get("MemAvailable"),
        "processes": sum(1 for name in os.listdir("/proc") if name.isdigit()),
    }


def _write_json(path: str, data: Any) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "node_root": {"type": "path", "required": True},
            "archive": {"type": "path", "required": True},
            "ping_target": {"type": "str"},
            "ping_targets": {"type": "list", "elements": "dict"},
            "ping_count": {"type": "int", "default": 10},
            "tcp_port": {"type": "int"},
            "run_id": {"type": "str"},
            "stop_tags": {"type": "list", "elements": "str", "default": []},
            "stop_grace_s": {"type": "float", "default": 30.0},
            "fetch_to": {"type": "path"},  # the action plugin's (action_plugins/dit_collect.py)
            "inline_max_bytes": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, archive=p["archive"])
    results = os.path.join(p["node_root"], "results")
    if not os.path.isdir(results):
        module.fail_json(msg="{} has no results directory; did apply run?".format(p["node_root"]))
    if p["stop_tags"] and not p["run_id"]:
        module.fail_json(msg="stop_tags needs run_id: only the run's own processes are stopped")
    out = {"archive": p["archive"]}
    if p["stop_tags"]:  # first: what a process writes as it exits is packed below
        out["stopped"] = []
        for tag in p["stop_tags"]:
            found, survivors = reap(p["run_id"], p["host"], tag, p["stop_grace_s"])
            if survivors:
                module.fail_json(msg=f"could not stop the {tag} process of the run", survivors=survivors)
            out["stopped"].extend(found)
    if p["ping_targets"]:  # every link of the device: a list, the edge first
        out["ping"] = ping_all(p["ping_targets"], p["ping_count"], p["tcp_port"])
        _write_json(os.path.join(results, "ping.json"), out["ping"])
    elif p["ping_target"]:
        out["ping"] = ping("edge", p["ping_target"], p["ping_count"], p["tcp_port"])
        _write_json(os.path.join(results, "ping.json"), out["ping"])
    _write_json(os.path.join(results, "snapshot.json"), _snapshot())
    if p["run_id"]:
        out["processes"] = process_states(os.path.join(p["node_root"], "logs"), p["run_id"])
        _write_json(os.path.join(results, "processes.json"), out["processes"])
    tmp = p["archive"] + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for sub in ("results", "logs"):
            base = os.path.join(p["node_root"], sub)
            if not os.path.isdir(base):
                continue
            for name in sorted(os.listdir(base)):
                path = os.path.join(base, name)
                if os.path.isfile(path):
                    tar.add(path, arcname="{}/{}_{}".format(sub, p["host"], name))
    os.replace(tmp, p["archive"])
    with open(p["archive"], "rb") as packed:
        data = packed.read()
    out["archive_sha1"] = hashlib.sha1(data).hexdigest()  # noqa: S324 - a transfer check, as fetch's
    if len(data) <= p["inline_max_bytes"]:
        out["archive_b64"] = base64.b64encode(data).decode("ascii")
    module.exit_json(changed=True, **out)


if __name__ == "__main__":
    main()
