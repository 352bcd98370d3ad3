"""What ansible-runner raises inside a StageSession's thread reaches the driver's thread as itself.

CI caught it: with preflight..collect in one start, a full disk under the artifacts raised OSError in
the session's thread and the run said ``collect failed: failed (OSError: [Errno 28] ...)`` instead of
``no space left on device: the file system is full`` (dit.run.rundir.describe_failure needs the OSError).
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

from dit.run.ansible_exec import ChainedStage, StageSession


def test_an_os_error_in_the_session_s_thread_is_raised_in_the_caller_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(**_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "artifacts"))

    monkeypatch.setattr(ansible_runner, "run", full_disk)  # the module ansible_exec calls it through
    session = StageSession(
        [ChainedStage("preflight"), ChainedStage("apply")],
        tmp_path / "ansible",
        inventory=str(tmp_path / "inventory.yml"),
        limit="all",
        on_event=lambda _event: None,
        should_cancel=lambda: False,
        forks=1,
    )
    with pytest.raises(OSError) as raised:
        session.run("preflight", {}, {})
    assert raised.value.errno == errno.ENOSPC
    assert session.closed  # nothing more is handed over: teardown runs on its own
