"""Journal-before-change for dit's node modules, as an Ansible action plugin.

A journaled module supports ``_dit_plan: true``: it reads the node's current state and returns
``journal`` — the change records (with the prior values needed to undo them) that applying its
arguments would need — without changing anything. This action runs the module that way first,
appends the records to the controller's ``journal.jsonl`` and only then runs the module for real.
When the plan is empty the node already is as asked: the module is not run again (``changed=0``).
In check mode the plan is the answer.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from dit.journal import Journal


class JournaledAction(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        module = self._task.action
        args = dict(self._task.args)
        plan: dict[str, Any] = self._execute_module(
            module_name=module, module_args={**args, "_dit_plan": True}, task_vars=task_vars
        )
        if plan.get("failed"):
            result.update(plan)
            return result
        records = plan.pop("journal", [])
        if not records or self._play_context.check_mode:
            result.update(plan)
            result["changed"] = bool(records)
            return result
        journal_path = task_vars.get("dit_journal_path")
        if not journal_path:
            raise AnsibleActionFail(
                f"{module}: dit_journal_path is not set; refusing to change a node unjournaled"
            )
        host = str(task_vars.get("inventory_hostname"))
        ids = Journal(_path(journal_path)).record_changes(host, records, source=module)
        applied: dict[str, Any] = self._execute_module(
            module_name=module, module_args=args, task_vars=task_vars
        )
        result.update(applied)
        result["journal_ids"] = ids
        return result


def _path(value: Any) -> Any:
    from pathlib import Path

    return Path(str(value))
