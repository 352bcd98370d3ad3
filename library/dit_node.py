#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Create (journaled) the per-run directory of a dit node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_node
version_added: "0.1.0"
short_description: Create the run directory of a dit node
description:
  - Creates O(path) (the node's run root) with C(results/) and C(logs/) inside and a C(.dit-run)
    marker holding the run id. The marker is what allows teardown to remove the tree; a directory
    without the marker of this run is never removed.
  - Refuses, before it creates anything, when O(path) or any directory above it is not root's or is
    writable by others, since another user could then swap what dit runs as root (a root-owned sticky
    directory such as C(/tmp) is allowed above the node's dit directory). Missing directories are
    created root's, one component at a time without following links; shipped files are written
    through a new temporary name that follows no link.
  - Journaled through the C(dit_node) action plugin (journal before change).
options:
  path:
    description: The node's run root, for example C(/var/lib/dit/<run id>).
    type: path
    required: true
  run_id:
    description: The run id written into the marker.
    type: str
    required: true
  ship:
    description:
      - "Files to ship into O(path), C({name: controller path}). The action plugin reads them and
        passes them on as O(files), inside the module's own arguments: one round trip to the node
        rather than a temporary directory, a transfer per file and a permission fix-up (on a Pi 4's
        share of a CPU each of those starts a process of its own); a file already in place with the
        same SHA-256 is left alone."
    type: dict
  files:
    description:
      - Set by the action plugin from O(ship), C([{name, sha256, content}]), C(content) base64.
      - The SHA-256 is checked before a file is written; the content is never logged.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The file's name in O(path) (its base name is used).
        type: str
        required: true
      sha256:
        description: The SHA-256 of the decoded content, computed on the controller.
        type: str
        required: true
      content:
        description: The file's content, base64.
        type: str
        required: true
extends_documentation_fragment:
  - dit
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the run directory would be created; creates and copies nothing.
  diff_mode:
    support: partial
    details: Returns whether the run directory exists before and after; shipped files are listed in C(shipped), not diffed.
author: The dit developers
"""

EXAMPLES = r"""
- name: Create the node run directory
  dit_node:
    path: "{{ dit_node_root }}"
    run_id: "{{ dit_run_id }}"
    ship:
      dit-device.pyz: "{{ dit_device_pyz }}"
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

import base64
import binascii
import contextlib
import hashlib
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_trusted import UntrustedPath, check_trusted_dir, trusted_dir, write_at

MARKER = ".dit-run"
WHAT = "the node's run directory"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "ship": {"type": "dict"},
            "files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "name": {"type": "str", "required": True},
                    "sha256": {"type": "str", "required": True},
                    # the run's key is one of them: never in the task's logged invocation
                    "content": {"type": "str", "required": True, "no_log": True},
                },
            },
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    run_id = module.params["run_id"]
    marker = os.path.join(path, MARKER)
    try:
        # Every directory that exists on the way is checked before anything is read or made below it.
        with contextlib.suppress(FileNotFoundError):
            check_trusted_dir(path, what=WHAT)
    except UntrustedPath as exc:
        module.fail_json(msg=str(exc), path=path)
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
    changed = False
    shipped = []
    try:
        with trusted_dir(path, what=WHAT, create=True, mode=0o755) as root_fd:
            if not present:
                for sub in ("results", "logs"):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(sub, 0o755, dir_fd=root_fd)
                write_at(root_fd, MARKER, (run_id + "\n").encode())
                changed = True
            for item in module.params["files"]:
                name = os.path.basename(str(item["name"]))
                if _sha256_at(root_fd, name) == item["sha256"]:
                    continue
                try:
                    data = base64.b64decode(item["content"], validate=True)
                except (binascii.Error, ValueError):
                    module.fail_json(msg=f"{name}: the shipped content is not base64")
                if hashlib.sha256(data).hexdigest() != item["sha256"]:
                    module.fail_json(msg=f"{name}: the shipped content does not have the expected SHA-256")
                # 0600: what dit ships is run by this module's user (the device code, as edge, monitors,
                # load, link emulator), never read by another
                write_at(root_fd, name, data, mode=0o600)
                shipped.append(name)
                changed = True
    except UntrustedPath as exc:
        module.fail_json(msg=str(exc), path=path)
    module.exit_json(changed=changed, path=path, shipped=shipped, diff=diff)


def _sha256_at(dir_fd: int, name: str) -> str | None:
    """The SHA-256 of file ``name`` in the directory ``dir_fd`` (a link there is not followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


if __name__ == "__main__":
    main()
