"""Why a run should stop, if it should: SIGINT / SIGTERM while it runs, or ``dit stop``'s request file."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from dit.run.errors import Stopped

USER_STOP = "dit stop"
"""The stop reason of a run the user stopped with ``dit stop`` or NNPM's Stop (its request file)."""


class StopRequests:
    """The first reason to stop wins; teardown is never cancelled (it is what a stop runs)."""

    def __init__(self, requested: Callable[[], bool], warn: Callable[[str], None]) -> None:
        self._requested = requested  # the run directory's stop request (``dit stop``)
        self._warn = warn
        self.reason: str | None = None
        self.in_teardown = False

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.reason is None:
            # `dit stop` (NNPM's Stop too) writes its request file, then signals: the run says the
            # user stopped it, not that some SIGTERM did (issue 49, item 4)
            self.reason = USER_STOP if self._requested() else name
            self._warn(f"{name} received: stopping and tearing down")

    def should_cancel(self) -> bool:
        if self.in_teardown:
            return False
        if self.reason is None and self._requested():
            self.reason = USER_STOP
        return self.reason is not None

    def check(self) -> None:
        if self.should_cancel():
            raise Stopped(self.reason or "stop requested")

    @contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM ask for a stop while the block runs; the previous handlers come back after."""
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
