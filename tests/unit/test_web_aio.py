"""The web manager's child processes are reaped when the task awaiting them is cancelled or times out.

Before, a cancelled probe (the manager stopping mid-round) left ``ping`` running and its transport
alive past the event loop; a later garbage collection then raised "Event loop is closed" inside
whatever code ran at that moment (once, inside ``ast.parse``, failing an unrelated test).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from pathlib import Path

import psutil
import pytest

from dit.web.services.aio import run_reaped
from dit.web.services.probe import Target, ping


def _children() -> set[int]:
    """Live child processes of this process (pytest's: other tests' helpers may be among them)."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
    return found


async def _cancel_after(coro: object, delay_s: float, before: set[int]) -> None:
    task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
    await asyncio.sleep(delay_s)
    assert _children() - before, "the child process should be running by now"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancelled_run_leaves_no_child() -> None:
    before = _children()
    asyncio.run(_cancel_after(run_reaped(["sleep", "30"], 60.0), 0.3, before))
    assert _children() - before == set()


def test_a_timed_out_run_leaves_no_child_and_says_so() -> None:
    before = _children()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await run_reaped(["sleep", "30"], 0.3)

    asyncio.run(main())
    assert _children() - before == set()


def test_a_finished_run_gives_status_and_output() -> None:
    done = asyncio.run(run_reaped(["sh", "-c", "echo out; echo err >&2; exit 3"], 10.0))
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")


def test_a_ping_probe_cancelled_mid_round_leaves_no_ping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "ping"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    before = _children()
    asyncio.run(_cancel_after(ping(Target("device1", "192.0.2.1", 22)), 0.3, before))
    assert _children() - before == set()
