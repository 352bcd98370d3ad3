#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Send a device's shaped traffic to NFQUEUE: the run's iptables chain and its jump (journaled)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_nfqueue
short_description: Install the run's iptables chain that sends shaped traffic to the link emulator's queues
description:
  - The network condition's userspace backend (a kernel without C(sch_netem)). O(rules) are the rule
    specifications of the run's chain O(chain) in the C(mangle) table, in order, as built by
    C(dit.conditions.netem.nfqueue.build_userspace) on the controller; O(jump) is the rule that sends
    the interface's egress to the chain from C(POSTROUTING).
  - Reads the chain (C(iptables -S CHAIN)) and checks the jump (C(iptables -C POSTROUTING ...)). When
    both are as asked nothing is done (C(changed=false)); otherwise the chain is created (or flushed),
    filled, and the jump inserted first in C(POSTROUTING).
  - Journaled through the C(dit_nfqueue) action plugin. With O(_dit_plan) the module returns the
    records that undo it, newest last (delete the jump, flush the chain, delete the chain), and
    changes nothing. C(dit_restore) runs them only for the chain and interface of the run's undo scope.
  - The rules carry no C(--queue-bypass), so while no emulator listens the shaped traffic is dropped,
    never passed undelayed.
options:
  chain:
    description: The run's chain (C(DIT-) and 12 hex digits).
    type: str
    required: true
  dev:
    description: The interface whose egress is shaped (the jump's C(-o)).
    type: str
    required: true
  netns:
    description: Network namespace (C(ip netns exec NS iptables ...)); empty for the current one.
    type: str
    default: ""
  rules:
    description: The chain's rule specifications in order (each a list of words after C(-A CHAIN)).
    type: list
    elements: list
    required: true
  jump:
    description: The POSTROUTING rule specification that sends the interface's egress to the chain.
    type: list
    elements: str
    required: true
  _dit_plan:
    description: Set by the C(dit_nfqueue) action plugin, never by a playbook; return the undo records only.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the chain and returns the commands that would run and the undo records; runs none.
  diff_mode:
    support: full
    details: The chain's rules before and after.
  platform:
    support: full
    platforms: posix
    details: Linux nodes with iptables (legacy or nft) and nfnetlink_queue.
author: dit developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Send wlan0's shaped traffic to the link emulator
  dit_nfqueue:
    chain: DIT-0123456789ab
    dev: wlan0
    rules:
      - [-d, 10.0.0.5/32, -j, NFQUEUE, --queue-num, "4113"]
      - [-j, NFQUEUE, --queue-num, "4112"]
    jump: [-o, wlan0, -j, DIT-0123456789ab]
"""

RETURN = r"""
commands:
  description: The argv run, in order.
  returned: always
  type: list
journal:
  description: With _dit_plan, the records whose undo removes the jump and the chain.
  returned: with _dit_plan
  type: list
diff:
  description: The chain's rules before and after.
  returned: always
  type: dict
"""

import re
import subprocess
from typing import Any

from ansible.module_utils.basic import AnsibleModule

TABLE = "mangle"
HOOK = "POSTROUTING"
CHAIN = re.compile(r"^DIT-[0-9a-f]{12}\Z")


def prefix(netns: str) -> list[str]:
    base = ["iptables", "-w", "-t", TABLE]
    return ["ip", "netns", "exec", netns, *base] if netns else base


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(
            "{} failed ({}): {}".format(" ".join(argv), proc.returncode, (proc.stderr or proc.stdout).strip())
        )
    return proc


def current(netns: str, chain: str, jump: list[str]) -> tuple[list[str] | None, bool]:
    """The chain's ``-A`` lines (None: no such chain) and whether the jump is in place."""
    listed = _run([*prefix(netns), "-S", chain], check=False)
    lines = None
    if listed.returncode == 0:
        lines = [line.strip() for line in listed.stdout.splitlines() if line.startswith("-A ")]
    jumped = _run([*prefix(netns), "-C", HOOK, *jump], check=False).returncode == 0
    return lines, jumped


def undo_records(netns: str, chain: str, jump: list[str]) -> list[dict[str, Any]]:
    """Records in append order: replayed newest first, they remove the jump, flush and delete the chain."""
    pre = prefix(netns)
    steps = ([*pre, "-X", chain], [*pre, "-F", chain], [*pre, "-D", HOOK, *jump])
    return [{"op": "command", "undo": {"argv": list(argv), "ignore_errors": True}} for argv in steps]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "chain": {"type": "str", "required": True},
            "dev": {"type": "str", "required": True},
            "netns": {"type": "str", "default": ""},
            "rules": {"type": "list", "elements": "list", "required": True},
            "jump": {"type": "list", "elements": "str", "required": True},
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    chain, dev, netns = p["chain"], p["dev"], p["netns"] or ""
    rules = [[str(w) for w in rule] for rule in p["rules"]]
    jump = [str(w) for w in p["jump"]]
    if not CHAIN.match(chain):
        module.fail_json(msg=f"dit_nfqueue: chain {chain!r} is not a run's chain (DIT- and 12 hex digits)")
    if jump != ["-o", dev, "-j", chain]:
        module.fail_json(msg=f"dit_nfqueue: jump {jump} must be [-o, {dev}, -j, {chain}]")
    try:
        lines, jumped = current(netns, chain, jump)
        wanted = [" ".join(["-A", chain, *rule]) for rule in rules]
        pre = prefix(netns)
        commands: list[list[str]] = []
        if lines != wanted:
            commands.append([*pre, "-N", chain] if lines is None else [*pre, "-F", chain])
            commands += [[*pre, "-A", chain, *rule] for rule in rules]
        if not jumped:
            commands.append([*pre, "-I", HOOK, "1", *jump])
        diff = {"before": "\n".join(lines or []) + "\n", "after": "\n".join(wanted) + "\n"}
        result: dict[str, Any] = {"changed": bool(commands), "commands": commands, "diff": diff}
        if p["_dit_plan"] or module.check_mode:
            result["journal"] = undo_records(netns, chain, jump) if commands else []
            module.exit_json(**result)
        for argv in commands:
            _run(argv)
        module.exit_json(**result)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        module.fail_json(msg=f"dit_nfqueue: {exc}")


if __name__ == "__main__":
    main()
