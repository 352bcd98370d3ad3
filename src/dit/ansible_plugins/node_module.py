"""Run a dit module as dit ships it: its arguments validated here, on the controller, by Ansible itself.

The module a node runs (:mod:`dit.run.node_modules`) imports nothing of Ansible, so the validation
``AnsibleModule`` would do on the node (types and conversions, defaults, choices, suboptions,
required and mutually dependent options, unknown names refused) runs here, with the same
``ModuleArgumentSpecValidator`` and the keyword arguments the module passes to ``AnsibleModule``; the
node gets the validated arguments, every default included, as one base64-encoded JSON argument (no
text of theirs is in what Ansible substitutes into the script). Values an option marks ``no_log`` are
masked in what comes back, as ``AnsibleModule`` masks them. A module not built by dit (a checkout's
``library/`` run by hand, or by molecule) is left to Ansible and its own ``AnsibleModule``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ansible.module_utils.common.arg_spec import ModuleArgumentSpecValidator
from ansible.module_utils.common.json import Direction, get_module_encoder
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase
from ansible.plugins.action.normal import ActionModule as NormalAction

from dit.run.node_modules import ARGS_KEY, recorded_kwargs

_CONSTRAINTS = ("mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by")


def validate(name: str, kwargs: dict[str, Any], args: dict[str, Any]) -> tuple[dict[str, Any], set[str], str]:
    """``args`` as ``AnsibleModule(**kwargs)`` would hold them in ``params``, the values to mask, and the
    message ``AnsibleModule`` would fail with ('' when they are valid)."""
    validator = ModuleArgumentSpecValidator(
        kwargs.get("argument_spec") or {}, *(kwargs.get(key) for key in _CONSTRAINTS)
    )
    result = validator.validate(dict(args))
    no_log: set[str] = set(result._no_log_values)
    if not result.error_messages:
        return result.validated_parameters, no_log, ""
    msg = result.errors.msg
    if isinstance(result.errors[0], UnsupportedError):
        msg = f"Unsupported parameters for ({name}) module: {msg}"
    return result.validated_parameters, no_log, msg


class NodeModuleAction(ActionBase):  # type: ignore[misc]
    """An action whose module calls go through :func:`validate` when the module is one dit built."""

    def _execute_module(
        self,
        module_name: str | None = None,
        module_args: dict[str, Any] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, Any]:
        name = module_name or self._task.action
        given = dict(self._task.args if module_args is None else module_args)
        found = self._shared_loader_obj.module_loader.find_plugin_with_context(
            name, collection_list=self._task.collections
        )
        recorded = recorded_kwargs(found.plugin_resolved_path) if found.resolved else None
        if recorded is None:
            return super()._execute_module(name, given, *args, **kwargs)  # type: ignore[no-any-return]
        short = name.rsplit(".", 1)[-1]
        params, no_log, msg = validate(short, recorded, given)
        if msg:
            return {"failed": True, "msg": msg}
        encoder = get_module_encoder("legacy", Direction.CONTROLLER_TO_MODULE)
        wrapped = {ARGS_KEY: base64.b64encode(json.dumps(params, cls=encoder).encode()).decode("ascii")}
        result: dict[str, Any] = super()._execute_module(name, wrapped, *args, **kwargs)
        return remove_values(result, no_log) if no_log else result


class NormalNodeModuleAction(NodeModuleAction, NormalAction):  # type: ignore[misc]
    """Ansible's ``normal`` action (what runs a module with no action plugin of its own), validating."""
