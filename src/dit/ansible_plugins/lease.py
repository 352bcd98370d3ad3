"""``dit_lease``'s action plugin: the controller decides whether a node's lease may be taken."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean

from dit.ansible_plugins.journaled import JournaledAction
from dit.lease import classify, decide


class LeaseAction(JournaledAction):
    """Reads the node's lease (plan mode), refuses a live holder, breaks a stale one only when asked.

    The holder's liveness can only be checked here: it is a driver process on a controller.
    """

    _broken: str | None = None

    def review(self, plan: dict[str, Any], args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        current = plan.get("current")
        holder = args.get("holder") or {}
        state, found = classify(current, str(args["run_id"]), str(holder.get("controller_host", "")))
        decision = decide(
            state,
            found,
            str(task_vars.get("inventory_hostname")),
            str(args["path"]),
            boolean(args.get("break_stale", False), strict=False),
        )
        if not decision.take:
            raise AnsibleActionFail(decision.message, result={"current": current, "lease_state": state.value})
        if decision.breaks:
            self._broken = decision.message
            return {**args, "replaces": current}
        return args

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        if self._broken and not result.get("failed"):
            result["lease_broken"] = self._broken
            result.setdefault("warnings", []).append(self._broken)
        return result
