"""Action plugins whose journal records follow from their arguments (intent mode)."""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail

from dit.ansible_plugins.journaled import JournaledAction
from dit.device.build import ZIPAPP_NAME
from dit.run.journal import Journal

#: The SHA-256 of the device zipapp the run ships (the driver sets it for every stage).
PYZ_SHA256_VAR = "dit_device_pyz_sha256"


def verify_zipapp(args: dict[str, Any], argvs: Iterable[object], task_vars: dict[str, Any]) -> dict[str, Any]:
    """``args`` with ``verify``: every path of ``argvs`` that names the device zipapp, to its shipped SHA-256.

    The module then runs it by descriptor after checking it (``module_utils/dit_procs.py``
    ``open_verified``), so a zipapp swapped on the node after it was shipped is refused, not run as root.
    """
    digest = task_vars.get(PYZ_SHA256_VAR)
    if not digest:
        return args
    paths = {
        str(arg)
        for argv in argvs
        if isinstance(argv, list)
        for arg in argv
        if posixpath.basename(str(arg)) == ZIPAPP_NAME
    }
    return {**args, "verify": dict.fromkeys(sorted(paths), str(digest))} if paths else args


class ProcessAction(JournaledAction):
    """``dit_proc``: the record is the process tag it will start.

    A process found running with the tag is this run's own only when this run's journal already
    records starting it (the same task applied twice, as molecule's idempotence step does); then
    ``dit_proc`` is told so (``_dit_adopt``). Any other is another run's that shares the run id, and
    ``dit_proc`` refuses to start beside it or to report it as started.
    """

    def intent(self, args: dict[str, Any], task_vars: dict[str, Any]) -> list[dict[str, Any]] | None:
        tag = args.get("tag")
        if not tag:
            return None
        record = {"op": "process", "undo": {"run_id": args["run_id"], "host": args["host"], "tag": tag}}
        if self._recorded(record, task_vars):
            args["_dit_adopt"] = True
        return [record]

    def prepare(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        return verify_zipapp(args, [args.get("argv")], task_vars)

    def _recorded(self, record: dict[str, Any], task_vars: dict[str, Any]) -> bool:
        journal_path = task_vars.get("dit_journal_path")
        if not journal_path:
            return False
        host = str(task_vars.get("inventory_hostname"))
        wanted = (record["op"], record["undo"])
        return any(
            (c.op, dict(c.undo)) == wanted
            for c in Journal(Path(str(journal_path))).pending()
            if c.host == host
        )


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

    def prepare(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        processes = args.get("processes")
        specs = processes if isinstance(processes, list) else []
        return verify_zipapp(args, [spec.get("argv") for spec in specs if isinstance(spec, dict)], task_vars)


class NodeAction(JournaledAction):
    """``dit_node``: the record is the run directory; ``ship`` files are transferred first."""

    def intent(self, args: dict[str, Any], task_vars: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [{"op": "mkdir", "undo": {"path": args["path"], "run_id": args["run_id"]}}]

    def prepare(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        """``ship``'s files into the module's own arguments (``files``, base64): the module runs in the
        same round trip, where a transfer would take a temporary directory, one copy per file and a
        permission fix-up, each a process on the node (about 4 s a task on the emulated rack's 25 %
        share of a CPU against 1.5 s for the module alone). What dit ships is small (the device
        zipapp, about 140 KB, and the run's key)."""
        ship = args.pop("ship", None) or {}
        if not ship:
            return args
        files = []
        for name, value in sorted(ship.items()):
            source = str(value)
            if not os.path.isfile(source):
                raise AnsibleActionFail(f"dit_node: ship.{name}: {source} is not a file on the controller")
            with open(source, "rb") as handle:
                data = handle.read()
            files.append(
                {
                    "name": name,
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "content": base64.b64encode(data).decode("ascii"),
                }
            )
        return {**args, "files": files}
