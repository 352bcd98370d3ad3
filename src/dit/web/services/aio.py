"""One way for NNPM to run a child process from the event loop, and always reap it.

``asyncio.create_subprocess_exec`` followed by ``wait_for(proc.communicate(), …)`` leaves the child
running when the awaiting task is cancelled (the manager shutting down mid-probe, a client going
away): its transport outlives the event loop, and its ``__del__`` then fails at some later garbage
collection ("Event loop is closed"), in whatever code happens to run at that moment. Here the child
is killed and waited for on timeout *and* on cancellation, before the exception propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes


async def _lines(stream: asyncio.StreamReader, on_line: Callable[[str], None]) -> bytes:
    """Every line of ``stream`` to ``on_line`` as it comes; all of it, at the end."""
    seen = bytearray()
    while line := await stream.readline():
        seen += line
        on_line(line.decode("utf-8", "replace").rstrip("\r\n"))
    return bytes(seen)


async def run_reaped(
    argv: Sequence[str],
    timeout_s: float,
    on_stderr_line: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> Finished:
    """Run ``argv`` (stdout and stderr piped unless ``kwargs`` says otherwise) to completion; each line
    of its stderr goes to ``on_stderr_line`` as it is written, when one is given.

    Raises ``TimeoutError`` after ``timeout_s`` and ``OSError`` when it cannot start; in both cases, and
    on cancellation, no child process and no transport is left behind.
    """
    kwargs.setdefault("stdout", asyncio.subprocess.PIPE)
    kwargs.setdefault("stderr", asyncio.subprocess.PIPE)
    kwargs.setdefault("limit", 1024 * 1024)  # a long line of progress is read whole
    proc = await asyncio.create_subprocess_exec(*argv, **kwargs)

    async def finish() -> tuple[bytes | None, bytes | None]:
        if on_stderr_line is None or proc.stderr is None:
            return await proc.communicate()
        out_task = asyncio.ensure_future(proc.stdout.read() if proc.stdout else asyncio.sleep(0, b""))
        try:
            err = await _lines(proc.stderr, on_stderr_line)
            out = await out_task
        finally:
            out_task.cancel()  # nothing when it is done; not left pending when this is cancelled
        await proc.wait()
        return out, err

    try:
        out, err = await asyncio.wait_for(finish(), timeout_s)
    except BaseException:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        # shielded: a second cancellation must not leave the child unreaped either
        with contextlib.suppress(BaseException):
            await asyncio.shield(proc.wait())
        raise
    return Finished(proc.returncode if proc.returncode is not None else -1, out or b"", err or b"")
