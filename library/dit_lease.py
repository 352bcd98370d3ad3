#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Take a dit node's lease (journaled): one run at a time per node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_lease
version_added: "0.1.0"
short_description: Take the lease of a dit node for one run
description:
  - Writes O(holder) to O(path) (C(lease.json) in the node's dit directory) when no run holds the
    node or this run (O(run_id)) already does. Another run's lease is only replaced when its exact
    content is O(replaces); anything else found there fails the task and names the holder.
  - Refuses, before it reads the lease, when its directory or any directory above it is not root's or
    is writable by others (naming the directory, its owner and the fix); a missing directory is made
    root's, one component at a time without following links.
  - Whether a holder still lives is decided on the controller by the C(dit_lease) action plugin
    (C(dit.run.lease_decision)), which reads the lease through this module's plan mode, refuses a live or
    unverifiable holder, and passes O(replaces) only for a lease it decided to break
    (O(break_stale)).
  - The lease is released by C(dit_restore) (journal record C(lease)) at teardown or C(dit cleanup),
    and only while it still names this run.
  - Journaled through the C(dit_lease) action plugin (journal before change).
options:
  path:
    description: The lease file, C(<dit directory>/lease.json).
    type: path
    required: true
  run_id:
    description: The run taking the lease.
    type: str
    required: true
  holder:
    description:
      - The lease content, C({run_id, controller_host, controller_pid, pid_started_s, since_wall_ns,
        run_dir}); its C(run_id) must be O(run_id).
    type: dict
    required: true
  break_stale:
    description:
      - Evaluated by the action plugin on the controller, ignored by the module. Take the node from a
        holder whose driver is gone, or that ran on another controller host and cannot be checked.
        A holder alive on this controller host is never broken.
    type: bool
    default: false
  replaces:
    description: Set by the action plugin, the exact content of the lease it decided to break.
    type: str
  seen:
    description:
      - The lease as an earlier task of the play read it, a dict whose key C(lease) holds the lease
        file's content or null (the C(lease) that C(dit_facts) returns, read after the same directory
        check). The action plugin decides on it instead of calling this module's plan mode, and takes
        it out of the module's arguments. The take stays a compare-and-swap, so a lease that changed
        since is refused as in plan mode (RV(held)).
    type: dict
  _dit_plan:
    description:
      - Set by the C(dit_lease) action plugin, never by a playbook. The module reads the node's current
        lease and returns the C(journal) record (the release of this run's lease) without changing
        anything; the plugin appends it to the run's journal before it runs the module for real.
extends_documentation_fragment:
  - dit
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the lease would be written; writes nothing.
  diff_mode:
    support: full
    details: The lease file's content before and after.
  platform:
    details: Linux nodes (C(flock) on the lease's directory).
author: The dit developers
"""

EXAMPLES = r"""
- name: Take this node's lease
  dit_lease:
    path: "{{ dit_lease_dir | default('/var/lib/dit') }}/lease.json"
    run_id: "{{ dit_run_id }}"
    holder: "{{ dit_lease }}"
    break_stale: "{{ dit_break_stale_lease | default(false) }}"
"""

RETURN = r"""
current:
  description: The lease file's content before the task (null when there was none).
  returned: always
  type: str
held:
  description:
    - When the take was refused because another run holds the node (it took the lease after the
      controller read it), that lease's exact content, read under the lock. The action plugin turns
      it into the same refusal as for a holder found in plan mode.
  returned: failed, when another run holds the lease
  type: str
journal:
  description: In plan mode, the change record this call needs (consumed by the action plugin).
  returned: plan mode
  type: list
  elements: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_lease_file import (
    LeaseError,
    LeaseHeld,
    check_directory,
    read_text,
    run_id_of,
    take,
)
from ansible.module_utils.dit_trusted import UntrustedPath


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "holder": {"type": "dict", "required": True},
            "break_stale": {"type": "bool", "default": False},
            "replaces": {"type": "str"},
            "seen": {"type": "dict"},  # the action plugin's, never passed on
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if str(p["holder"].get("run_id")) != p["run_id"]:
        module.fail_json(msg="holder.run_id must be the run id {}".format(p["run_id"]))
    try:  # before the lease is read: a lease another user could have put there decides nothing
        check_directory(p["path"])
    except UntrustedPath as exc:
        module.fail_json(msg=str(exc))
    current = read_text(p["path"])
    ours = current is not None and run_id_of(current) == p["run_id"]
    after = json.dumps(p["holder"], sort_keys=True)
    diff = {"before": current or "", "after": current if ours else after + "\n"}
    if p["_dit_plan"] or module.check_mode:
        journal = [] if ours else [{"op": "lease", "undo": {"path": p["path"], "run_id": p["run_id"]}}]
        module.exit_json(changed=bool(journal), current=current, journal=journal, diff=diff)
    try:
        changed = take(p["path"], p["holder"], p["replaces"])
    except LeaseHeld as exc:
        # another run took the node between the controller's look (plan mode) and this take: the
        # action plugin names that holder in full, as it names one it saw in the first place
        module.fail_json(
            msg="cannot take the lease {}: {}".format(p["path"], exc), current=current, held=exc.current
        )
    except (LeaseError, OSError, UntrustedPath) as exc:
        module.fail_json(msg="cannot take the lease {}: {}".format(p["path"], exc), current=current)
    module.exit_json(changed=changed, current=current, diff=diff)


if __name__ == "__main__":
    main()
