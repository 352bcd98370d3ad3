"""``dit_collect``'s action plugin: a small archive comes back inside the module's result, checked and
written into raw/, and never left in the task's result; a large one is transferred."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dit.ansible_plugins.collect_action import INLINE_MAX_BYTES, CollectAction

ARCHIVE = b"\x1f\x8b packed results of device1"


def _action(
    module_result: dict[str, Any], become: bool = False
) -> tuple[CollectAction, list[Any], list[str]]:
    args = {"node_root": "/var/lib/dit/run-1", "archive": "/var/lib/dit/run-1/collect.tar.gz"}
    sent: list[Any] = []
    fetched: list[str] = []

    def fetch_file(remote: str, local: str) -> None:
        fetched.append(remote)
        Path(local).write_bytes(ARCHIVE)

    def execute_module(
        module_name: str, module_args: dict[str, Any], task_vars: dict[str, Any]
    ) -> dict[str, Any]:
        sent.append(dict(module_args))
        return dict(module_result)

    task = SimpleNamespace(args=args, action="dit_collect", async_val=0, check_mode=False)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None), fetch_file=fetch_file)
    action = CollectAction(task, connection, SimpleNamespace(check_mode=False, become=become), None, None)
    action._execute_module = execute_module
    return action, sent, fetched


def _packed(**extra: Any) -> dict[str, Any]:
    return {
        "changed": True,
        "archive": "/var/lib/dit/run-1/collect.tar.gz",
        "archive_sha1": hashlib.sha1(ARCHIVE).hexdigest(),
        **extra,
    }


@pytest.mark.parametrize("become", [False, True])
def test_a_small_archive_comes_back_in_the_result_and_is_written_without_a_transfer(
    tmp_path: Path, become: bool
) -> None:
    dest = tmp_path / "raw" / "device1.tar.gz"
    dest.parent.mkdir()
    action, sent, fetched = _action(_packed(archive_b64=base64.b64encode(ARCHIVE).decode()), become)
    action._task.args["fetch_to"] = str(dest)

    result = action.run(task_vars={})

    assert sent[0]["inline_max_bytes"] == INLINE_MAX_BYTES and "fetch_to" not in sent[0]
    assert fetched == []  # no sftp-server, no shell on the node
    assert result["fetched"] and dest.read_bytes() == ARCHIVE
    assert "archive_b64" not in result  # no event, no run.log line carries the archive


def test_a_larger_archive_is_transferred_and_checked(tmp_path: Path) -> None:
    dest = tmp_path / "device1.tar.gz"
    action, _sent, fetched = _action(_packed())
    action._task.args["fetch_to"] = str(dest)
    result = action.run(task_vars={})
    assert fetched == ["/var/lib/dit/run-1/collect.tar.gz"]
    assert result["fetched"] and dest.read_bytes() == ARCHIVE


def test_an_inline_archive_that_does_not_match_its_sha1_is_refused_and_not_written(tmp_path: Path) -> None:
    dest = tmp_path / "device1.tar.gz"
    action, _sent, _fetched = _action(_packed(archive_b64=base64.b64encode(b"something else").decode()))
    action._task.args["fetch_to"] = str(dest)
    result = action.run(task_vars={})
    assert result["failed"] and "is not the node's" in result["msg"]
    assert not dest.exists() and "archive_b64" not in result


def test_without_fetch_to_nothing_comes_back_inline() -> None:
    action, sent, fetched = _action(_packed())
    result = action.run(task_vars={})
    assert sent[0].get("inline_max_bytes", 0) == 0 and fetched == [] and not result["fetched"]
