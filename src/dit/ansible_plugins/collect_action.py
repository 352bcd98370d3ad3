"""``dit_collect``'s action plugin: the node packs its results and the archive is fetched in one task.

Ansible's ``fetch`` runs a ``stat`` module on the node before it copies (one more module run per node,
0.3-0.45 CPU-s each here, and one more task): the module already returns the archive's SHA-1, so the
copy is checked against it instead. With ``become`` (a root-only file read through ``sudo``) nothing is
fetched here: the playbook's ``fetch`` task does it (``fetched`` is false).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Any

from ansible.plugins.action import ActionBase

from dit.trusted import write_file_nofollow


class CollectAction(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = dict(self._task.args)
        fetch_to = args.pop("fetch_to", None)
        result.update(
            self._execute_module(module_name=self._task.action, module_args=args, task_vars=task_vars)
        )
        result["fetched"] = False
        digest = result.get("archive_sha1")
        if result.get("failed") or not fetch_to or not digest or self._play_context.become:
            return result
        # Into a private temporary file, then written into raw/ without following a link (as dit writes
        # every run file): the connection plugin's own copy writes to whatever path it is given.
        scratch = tempfile.mkdtemp(prefix="dit-collect-")
        try:
            local = os.path.join(scratch, "archive")
            self._connection.fetch_file(str(result["archive"]), local)
            with open(local, "rb") as handle:
                data = handle.read()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        got = hashlib.sha1(data).hexdigest()  # noqa: S324 - a transfer check, as fetch's
        if got != digest:
            result.update(
                failed=True, msg=f"fetching {result['archive']}: SHA-1 {got} is not the node's {digest}"
            )
            return result
        write_file_nofollow(str(fetch_to), data)
        result["fetched"] = True
        result["dest"] = str(fetch_to)
        return result
