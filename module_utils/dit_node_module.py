# -*- coding: utf-8 -*-
"""The part of Ansible's ``AnsibleModule`` a dit module uses, stdlib-only, for the scripts a node runs.

dit's modules (``library/dit_*.py``) are written against ``ansible.module_utils.basic.AnsibleModule``,
and run so in their unit tests and from a checkout by hand. When dit runs them, it ships each as one
stdlib-only script (``dit.run.node_modules``) in which ``AnsibleModule`` is this class. Importing
Ansible's own from the zip Ansible ships compiles ``ansible.module_utils.basic`` and what it imports
from source on every call (about 0.25 CPU-s here, seconds on a board's share of a CPU); this costs
the interpreter's start.

What it relies on: Ansible's argument validation has already run on the controller
(``dit.ansible_plugins.node_module``: the same ``ModuleArgumentSpecValidator`` ``AnsibleModule`` runs),
so the arguments arrive checked, converted and with every default. Ansible substitutes them into the
script as a bytes literal (``_DIT_ANSIBLE_ARGS`` of ``__main__``): its own keys (check mode, diff,
no_log ...) beside the module's arguments, JSON encoded in base64 under ``_dit_args_b64``. Values the
spec marks ``no_log`` are shown masked in the invocation, and masked on the controller too. A script
whose arguments did not go through that validation refuses to run. Not kept: the file attributes
``AnsibleModule`` adds to a result that names a ``path`` (its owner, mode, size: ``add_path_info``),
which no dit module documents or reads.
"""

from __future__ import annotations

import base64
import json
import sys

ARGS_KEY = "_dit_args_b64"
#: What ``AnsibleModule`` shows in place of an option marked ``no_log``.
MASKED = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def masked(params, spec):
    """``params`` with every option ``spec`` marks ``no_log`` (suboptions included) shown as ``MASKED``,
    as ``AnsibleModule`` reports its invocation (a file's content is not sent back)."""
    out = {}
    for name, given in params.items():
        option = spec.get(name) or {}
        shown = given
        if option.get("no_log") and given is not None:
            shown = MASKED
        elif option.get("options") and isinstance(given, dict):
            shown = masked(given, option["options"])
        elif option.get("options") and isinstance(given, list):
            shown = [masked(item, option["options"]) if isinstance(item, dict) else item for item in given]
        out[name] = shown
    return out


class AnsibleModule:
    """``params``, ``check_mode``, ``exit_json``, ``fail_json`` and ``warn``, as Ansible's."""

    def __init__(self, argument_spec=None, supports_check_mode=False, **constraints):
        # ``constraints`` (required_one_of, required_together, ...) were checked on the controller.
        args = json.loads(sys.modules["__main__"]._DIT_ANSIBLE_ARGS)
        encoded = args.get(ARGS_KEY)
        self.params = json.loads(base64.b64decode(encoded).decode("utf-8")) if encoded else {}
        self.check_mode = bool(args.get("_ansible_check_mode"))
        self.no_log = bool(args.get("_ansible_no_log"))
        self._diff = bool(args.get("_ansible_diff"))
        self._name = args.get("_ansible_module_name") or "module"
        self._warnings = []
        self._spec = argument_spec or {}
        missing = sorted(set(argument_spec or {}) - set(self.params))
        if missing:
            # A validated call carries every option (None where it has no default).
            self.fail_json(
                msg="{}: arguments not validated on the controller (no {}): run it through dit's action "
                "plugin of the same name".format(self._name, ", ".join(missing))
            )
        if self.check_mode and not supports_check_mode:
            self.exit_json(skipped=True, msg=f"remote module ({self._name}) does not support check mode")

    def warn(self, warning):
        self._warnings.append(str(warning))

    def _print(self, result):
        if self._warnings:
            result["warnings"] = list(result.get("warnings", [])) + self._warnings
        if not self.no_log:
            result["invocation"] = {"module_args": masked(self.params, self._spec)}
        print(json.dumps(result))

    def exit_json(self, **kwargs):
        self._print(kwargs)
        sys.exit(0)

    def fail_json(self, msg, **kwargs):
        kwargs["failed"] = True
        kwargs["msg"] = msg
        self._print(kwargs)
        sys.exit(1)
