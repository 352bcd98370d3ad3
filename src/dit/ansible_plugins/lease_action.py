"""``dit_lease``'s action plugin: the controller decides whether a node's lease may be taken."""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean

from dit.ansible_plugins.journaled import JournaledAction
from dit.run.lease_decision import Decision, State, classify, decide, named_run_id


class LeaseAction(JournaledAction):
    """Reads the node's lease (plan mode), refuses a live holder, breaks a stale one only when asked.

    The holder's liveness can only be checked here: it is a driver process on a controller. Two runs
    that both find the node free race for it; the node's compare-and-swap lets one win, and the loser
    gets the same refusal, naming the winner in full, as a run that found the winner's lease at once.
    """

    _broken: str | None = None

    def _decide(
        self, current: str | None, args: dict[str, Any], task_vars: dict[str, Any], break_stale: bool
    ) -> tuple[State, Decision]:
        """The one decision on a lease's content, whichever path found it."""
        holder = args.get("holder") or {}
        state, found = classify(current, str(args["run_id"]), str(holder.get("controller_host", "")))
        node = str(task_vars.get("inventory_hostname"))
        return state, decide(state, found, node, str(args["path"]), break_stale)

    def known_plan(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any] | None:
        """The plan from the lease ``dit_facts`` read (``seen: {lease: <content or null>}``), as the
        module's plan mode would return it: the release of this run's lease to journal unless the lease
        already names this run. The take itself stays a compare-and-swap on the node, so a run that took
        the node since it was read is refused there (``held``), as in plan mode."""
        seen = args.pop("seen", None)
        if not isinstance(seen, dict) or "lease" not in seen:
            return None
        current = seen["lease"]
        if current is not None and not isinstance(current, str):
            raise AnsibleActionFail(
                f"seen.lease must be the lease file's text or null, not {type(current).__name__}"
            )
        run_id, path = str(args["run_id"]), str(args["path"])
        ours = current is not None and named_run_id(current) == run_id  # as the module's plan decides it
        journal = [] if ours else [{"op": "lease", "undo": {"path": path, "run_id": run_id}}]
        after = current if ours else json.dumps(args["holder"], sort_keys=True) + "\n"
        diff = {"before": current or "", "after": after}  # as the module's plan reports it (a dry run's)
        return {"changed": bool(journal), "current": current, "journal": journal, "diff": diff}

    def review(self, plan: dict[str, Any], args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        current = plan.get("current")
        state, decision = self._decide(
            current, args, task_vars, boolean(args.get("break_stale", False), strict=False)
        )
        if not decision.take:
            raise AnsibleActionFail(decision.message, result={"current": current, "lease_state": state.value})
        if decision.breaks:
            self._broken = decision.message
            return {**args, "replaces": current}
        return args

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        held = result.get("held")
        if result.get("failed") and isinstance(held, str):
            # Lost the race: the node's lease changed after review() looked. The winner was never
            # reviewed, so it is not broken now, whatever --break-stale-lease says; the run is refused
            # as if it had found that lease first.
            state, decision = self._decide(held, dict(self._task.args), task_vars or {}, False)
            if decision.message:
                result["msg"] = decision.message
                result["lease_state"] = state.value
            return result
        if self._broken and not result.get("failed"):
            result["lease_broken"] = self._broken
            result.setdefault("warnings", []).append(self._broken)
        return result
