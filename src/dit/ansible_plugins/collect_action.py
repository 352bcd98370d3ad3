"""``dit_collect``'s action plugin: the node packs its results and the archive is fetched in one task.

Ansible's ``fetch`` runs a ``stat`` module on the node before it copies (one more module run per node,
0.3-0.45 CPU-s each here, and one more task): the module already returns the archive's SHA-1, so the
copy is checked against it instead. An archive of at most :data:`INLINE_MAX_BYTES` (a run's results
are tens of kilobytes compressed) comes back inside the module's result, which saves the transfer's own
processes on the node (``sftp-server`` and a shell: seconds on the emulated rack's 25 % share of a CPU);
it is taken out of the result, so no event or log holds it. A larger one is transferred; with ``become``
(a root-only file read through ``sudo``) that is left to the playbook's ``fetch`` task (``fetched``
is false).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
from typing import Any

from dit.ansible_plugins.node_module import NodeModuleAction
from dit.trusted import write_file_nofollow

INLINE_MAX_BYTES = 8 * 1024 * 1024


class CollectAction(NodeModuleAction):
    # No remote temporary directory made before the module runs (and removed after it): two more
    # processes on the node for nothing, as the transfer back needs none.
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = dict(self._task.args)
        fetch_to = args.pop("fetch_to", None)
        if fetch_to:
            args["inline_max_bytes"] = INLINE_MAX_BYTES
        result.update(
            self._execute_module(module_name=self._task.action, module_args=args, task_vars=task_vars)
        )
        result["fetched"] = False
        inline = result.pop("archive_b64", None)
        digest = result.get("archive_sha1")
        if result.get("failed") or not fetch_to or not digest:
            return result
        if inline is not None:
            data = base64.b64decode(inline)
        elif self._play_context.become:
            return result
        else:
            data = self._transfer_back(str(result["archive"]))
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

    def _transfer_back(self, archive: str) -> bytes:
        """The archive fetched by the connection into a private temporary file, then read: it is written
        into raw/ without following a link (as dit writes every run file), where the connection
        plugin's own copy writes to whatever path it is given."""
        scratch = tempfile.mkdtemp(prefix="dit-collect-")
        try:
            local = os.path.join(scratch, "archive")
            self._connection.fetch_file(archive, local)
            with open(local, "rb") as handle:
                return handle.read()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
