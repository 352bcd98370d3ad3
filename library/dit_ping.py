#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ping every link of a node and return the round-trip times (the netem check's unshaped baseline)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_ping
version_added: "0.1.0"
short_description: Measure the round-trip times of a node's links, changing nothing
description:
  - Sends O(count) ICMP echo requests to every target of O(targets) at once (C(ping)) and returns
    every RTT in integer nanoseconds, one link record per target. The preflight stage runs it before
    anything is applied, so the records are the unshaped baseline of the netem self-check
    (the driver writes them to C(raw/<host>/<host>_ping_baseline.json)).
  - Without a C(ping) binary a target with a C(tcp_port) is timed by TCP connects instead.
  - Reads only; runs in check mode too (pings change nothing).
options:
  targets:
    description: The links, each C(target) (the other node's inventory name), C(address), optional C(tcp_port).
    type: list
    elements: dict
    required: true
  count:
    description: Number of echo requests per target.
    type: int
    default: 10
extends_documentation_fragment:
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Measures as in a normal run; nothing on the node changes either way.
  diff_mode:
    support: none
    details: Nothing changes.
  platform:
    details: Linux nodes (C(ping) from iputils).
author: The dit developers
"""

EXAMPLES = r"""
- name: Ping the edge server and the other devices, unshaped
  dit_ping:
    targets:
      - {target: edge, address: 192.168.50.1}
      - {target: device2, address: 192.168.50.12}
"""

RETURN = r"""
pings:
  description: One link record per target (target, address, method, sent, received, rtt_ns).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_ping import ping_all


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "targets": {"type": "list", "elements": "dict", "required": True},
            "count": {"type": "int", "default": 10},
        },
        supports_check_mode=True,
    )
    p = module.params
    for index, item in enumerate(p["targets"]):
        if not item.get("address"):
            module.fail_json(msg=f"targets[{index}]: no address")
    if not 1 <= p["count"] <= 1000:
        module.fail_json(msg="count: {} is outside 1..1000".format(p["count"]))
    module.exit_json(changed=False, pings=ping_all(p["targets"], p["count"]))


if __name__ == "__main__":
    main()
