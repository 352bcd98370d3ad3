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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes


async def run_reaped(argv: Sequence[str], timeout_s: float, **kwargs: Any) -> Finished:
    """Run ``argv`` (stdout and stderr piped unless ``kwargs`` says otherwise) to completion.

    Raises ``TimeoutError`` after ``timeout_s`` and ``OSError`` when it cannot start; in both cases, and
    on cancellation, no child process and no transport is left behind.
    """
    kwargs.setdefault("stdout", asyncio.subprocess.PIPE)
    kwargs.setdefault("stderr", asyncio.subprocess.PIPE)
    proc = await asyncio.create_subprocess_exec(*argv, **kwargs)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except BaseException:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        # shielded: a second cancellation must not leave the child unreaped either
        with contextlib.suppress(BaseException):
            await asyncio.shield(proc.wait())
        raise
    return Finished(proc.returncode if proc.returncode is not None else -1, out or b"", err or b"")
