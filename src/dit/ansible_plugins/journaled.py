"""Journal-before-change for dit's node modules, as an Ansible action plugin.

Two ways to learn what a task will change, both recorded in the controller's ``journal.jsonl``
*before* the module changes anything:

- **plan** (the default): the module runs once with ``_dit_plan: true``, reads the node's current
  state and returns ``journal`` — the change records, with the prior values needed to undo them —
  without changing anything. An empty plan means the node already is as asked: the module is not
  run again (``changed=0``). In check mode the plan is the answer.
- **intent**: when the records follow from the task's arguments alone (create *this* run
  directory, start the process tagged *this*), a subclass returns them from :meth:`intent` and the
  module runs once. Their undo is idempotent and guarded (a directory is only removed when it
  carries this run's marker, a process only killed when it carries this run's tag), so recording
  an intent that turns out to change nothing is harmless; a record identical to one still pending
  for the same host is not written twice.

:meth:`known_plan` may answer for the plan mode when an earlier task already read the node's state
(``dit_lease``: the lease ``dit_facts`` read in the same preflight play), which saves the plan's module
call. :meth:`review` sees the plan before anything is journaled and may refuse the task (``dit_lease``
refuses a node another live run holds). :meth:`prepare` may add to the module's arguments after the
journal is written (``dit_node`` puts the files it ships there: the device code travels in the same
task and the same round trip, with no ``copy`` task per host).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail

from dit.ansible_plugins.node_module import NodeModuleAction
from dit.run.journal import Journal


def _key(record: dict[str, Any]) -> str:
    return json.dumps({"op": record.get("op"), "undo": record.get("undo")}, sort_keys=True)


class JournaledAction(NodeModuleAction):
    TRANSFERS_FILES = False
    _requires_connection = True

    def intent(self, args: dict[str, Any], task_vars: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The change records implied by ``args``, or None to ask the module (plan mode)."""
        return None

    def known_plan(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any] | None:
        """The plan, when an earlier task of the play already read what the module's plan mode would
        (one module call fewer on the node); None to ask the module. May take its own keys out of
        ``args``, which the module then does not get."""
        return None

    def review(self, plan: dict[str, Any], args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        """The module's arguments once its plan is known; raise AnsibleActionFail to refuse the task."""
        return args

    def prepare(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        """The module's arguments for the real run."""
        return args

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        module = self._task.action
        args = dict(self._task.args)
        records = self.intent(args, task_vars)
        if records is None:
            known = self.known_plan(args, task_vars)
            plan: dict[str, Any] = (
                known
                if known is not None
                else self._execute_module(
                    module_name=module, module_args={**args, "_dit_plan": True}, task_vars=task_vars
                )
            )
            if plan.get("failed"):
                result.update(plan)
                return result
            args = self.review(plan, args, task_vars)
            records = plan.pop("journal", [])
            if not records or self._play_context.check_mode:
                result.update(plan)
                result["changed"] = bool(records)
                return result
        elif self._play_context.check_mode:
            result.update(self._execute_module(module_name=module, module_args=args, task_vars=task_vars))
            return result
        ids = self._journal(module, records, task_vars)
        module_args = self.prepare(args, task_vars)
        applied: dict[str, Any] = self._execute_module(
            module_name=module, module_args=module_args, task_vars=task_vars
        )
        result.update(applied)
        result["journal_ids"] = ids
        return result

    def _journal(self, module: str, records: list[dict[str, Any]], task_vars: dict[str, Any]) -> list[str]:
        journal_path = task_vars.get("dit_journal_path")
        if not journal_path:
            raise AnsibleActionFail(
                f"{module}: dit_journal_path is not set; refusing to change a node unjournaled"
            )
        host = str(task_vars.get("inventory_hostname"))
        journal = Journal(Path(str(journal_path)))
        pending = {_key(dict(change.record)) for change in journal.pending() if change.host == host}
        fresh = [r for r in records if _key(r) not in pending]
        # the role a task came from says which condition made the change (dit.run.sweep keeps a
        # condition's changes across the variants of a sweep that apply it alike)
        role = self._task._role.get_name() if getattr(self._task, "_role", None) else None
        return journal.record_changes(host, fresh, source=module, role=role) if fresh else []
