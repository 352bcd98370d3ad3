"""Action plugins whose journal records follow from their arguments (intent mode)."""

from __future__ import annotations

import hashlib
import os
from typing import Any, ClassVar

from ansible.errors import AnsibleActionFail

from dit.ansible_plugins.journaled import JournaledAction


class ProcessAction(JournaledAction):
    """``dit_proc`` / ``dit_timed_profile``: the record is the process tag it will start."""

    TAGS: ClassVar[dict[str, str]] = {"dit_timed_profile": "profile"}

    def intent(self, args: dict[str, Any], task_vars: dict[str, Any]) -> list[dict[str, Any]] | None:
        tag = args.get("tag") or self.TAGS.get(self._task.action.rsplit(".", 1)[-1])
        if not tag:
            return None
        return [{"op": "process", "undo": {"run_id": args["run_id"], "host": args["host"], "tag": tag}}]


class LaunchAction(JournaledAction):
    """``dit_launch``: one record per process name (its tag) it will start."""

    def intent(self, args: dict[str, Any], task_vars: dict[str, Any]) -> list[dict[str, Any]] | None:
        processes = args.get("processes")
        if not isinstance(processes, list):
            return None  # templated later or malformed: let the module's plan say
        return [
            {
                "op": "process",
                "undo": {"run_id": args["run_id"], "host": args["host"], "tag": str(spec["name"])},
            }
            for spec in processes
            if isinstance(spec, dict) and "name" in spec
        ]


class NodeAction(JournaledAction):
    """``dit_node``: the record is the run directory; ``ship`` files are transferred first."""

    def intent(self, args: dict[str, Any], task_vars: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [{"op": "mkdir", "undo": {"path": args["path"], "run_id": args["run_id"]}}]

    def prepare(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        ship = args.pop("ship", None) or {}
        if not ship:
            return args
        if not self._connection._shell.tmpdir:
            self._make_tmp_path()
        files = []
        for name, value in sorted(ship.items()):
            source = str(value)
            if not os.path.isfile(source):
                raise AnsibleActionFail(f"dit_node: ship.{name}: {source} is not a file on the controller")
            with open(source, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            remote = self._connection._shell.join_path(self._connection._shell.tmpdir, f"ship-{digest[:16]}")
            self._transfer_file(source, remote)
            files.append({"name": name, "tmp": remote, "sha256": digest})
        self._fixup_perms2([self._connection._shell.tmpdir, *(f["tmp"] for f in files)])
        return {**args, "files": files}
