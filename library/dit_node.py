#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Create (journaled) the per-run directory of a dit node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_node
short_description: Create the run directory of a dit node
description:
  - Creates O(path) (the node's run root) with C(results/) and C(logs/) inside and a C(.dit-run)
    marker holding the run id. The marker is what allows teardown to remove the tree: a directory
    without the marker of this run is never removed.
  - Journaled through the C(dit_node) action plugin (journal before change).
options:
  path:
    description: The node's run root, e.g. C(/var/tmp/dit/<run id>).
    type: path
    required: true
  run_id:
    description: The run id written into the marker.
    type: str
    required: true
author: dit developers
"""

EXAMPLES = r"""
- name: Create the node run directory
  dit_node:
    path: "{{ dit_node_root }}"
    run_id: "{{ dit_run_id }}"
"""

RETURN = r"""
path:
  description: The node's run root.
  returned: always
  type: str
journal:
  description: In plan mode, the change records this call needs (consumed by the action plugin).
  returned: plan mode
  type: list
"""

import os

from ansible.module_utils.basic import AnsibleModule

MARKER = ".dit-run"


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    run_id = module.params["run_id"]
    marker = os.path.join(path, MARKER)
    present = os.path.isdir(path) and os.path.isfile(marker)
    if present:
        with open(marker, encoding="utf-8") as handle:
            owner = handle.read().strip()
        if owner != run_id:
            module.fail_json(msg=f"{path} belongs to run {owner}, not {run_id}", path=path)
    if os.path.exists(path) and not present:
        module.fail_json(
            msg=f"{path} exists and is not a dit run directory; refusing to take it over", path=path
        )
    diff = {"before": {"path": path, "exists": present}, "after": {"path": path, "exists": True}}
    if module.params["_dit_plan"] or module.check_mode:
        journal = [] if present else [{"op": "mkdir", "undo": {"path": path, "run_id": run_id}}]
        module.exit_json(changed=bool(journal), path=path, journal=journal, diff=diff)
    if present:
        module.exit_json(changed=False, path=path)
    for sub in ("", "results", "logs"):
        os.makedirs(os.path.join(path, sub), mode=0o755, exist_ok=True)
    with open(marker, "w", encoding="utf-8") as handle:
        handle.write(run_id + "\n")
    module.exit_json(changed=True, path=path, diff=diff)


if __name__ == "__main__":
    main()
