#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Make sure a directory dit writes on a node is root's alone, parents included (making what is missing)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_trusted_dir
version_added: "0.1.0"
short_description: Refuse a node directory another user could have prepared, or make it root's
description:
  - Checks that O(path) and every directory above it are owned by root and not writable by group or
    others (a root-owned sticky directory such as C(/tmp) is allowed above O(path), never as O(path)),
    and fails with one sentence naming the directory, its owner and the fix otherwise.
  - With O(create), makes the missing directories root's with O(mode), one component at a time without
    following a link, so that what is checked is what is made.
  - For the directories a runtime's plays put files in and run files from (under C(dit_remote_base),
    for example C(<dit_remote_base>/headsplit/files)). Not journaled, as C(ansible.builtin.file) is
    not; a run's own directory is made by C(dit_node).
options:
  path:
    description: The directory.
    type: path
    required: true
  create:
    description: Make the directory (and the missing ones above it) when it does not exist.
    type: bool
    default: true
  mode:
    description: The mode of a directory it makes, as an octal string.
    type: str
    default: "0755"
extends_documentation_fragment:
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Checks what exists and reports whether a directory would be made; makes nothing.
  diff_mode:
    support: none
author: The dit developers
"""

EXAMPLES = r"""
- name: The runtime's files directory is root's alone
  dit_trusted_dir:
    path: "{{ dit_remote_base | default('/var/lib/dit') }}/headsplit/files"
"""

RETURN = r"""
path:
  description: The directory.
  returned: always
  type: str
"""

import contextlib

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_trusted import UntrustedPath, check_trusted_dir

WHAT = "the node directory"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "create": {"type": "bool", "default": True},
            "mode": {"type": "str", "default": "0755"},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        mode = int(module.params["mode"], 8)
    except ValueError:
        module.fail_json(msg="mode: {!r} is not an octal mode such as 0755".format(module.params["mode"]))
    try:
        with contextlib.suppress(FileNotFoundError):
            check_trusted_dir(path, what=WHAT)
            module.exit_json(changed=False, path=path)
        if not module.params["create"]:
            module.fail_json(msg=f"{WHAT} {path} does not exist", path=path)
        if not module.check_mode:
            check_trusted_dir(path, what=WHAT, create=True, mode=mode)
    except UntrustedPath as exc:
        module.fail_json(msg=str(exc), path=path)
    module.exit_json(changed=True, path=path)


if __name__ == "__main__":
    main()
