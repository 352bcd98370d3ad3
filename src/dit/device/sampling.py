"""The stop signal and the sampling schedule shared by the device commands (stdlib only).

``monitor``, ``power``, ``load`` and ``netem-vary`` all run until teardown sends SIGTERM (or until an
optional ``duration_s``), and the two tracers sample on an absolute schedule. One copy of each, here:

- :class:`StopSignal`: SIGTERM / SIGINT as a stop request that also ends a wait at once;
- :func:`deadline_ns`: the monotonic end of an optional duration;
- :func:`every`: call a sample function at ``start + k·interval`` (a missed tick is skipped, not
  bunched) until a stop or the deadline.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Final


class StopSignal:
    """SIGTERM / SIGINT as a stop request that also ends a wait at once.

    On Linux the two signals are blocked and :meth:`wait` sleeps in ``sigtimedwait``: a signal ends the
    wait immediately, and one arriving while a sample is taken stays pending until the next wait (a sample
    is never cut in half). Elsewhere a flag handler and plain sleeps. Processes started while the signals
    are blocked inherit the mask (a short-lived command does not mind); a long-lived child calls
    :meth:`release` first so that a signal to its group ends it. As a context manager, the previous mask
    is restored at the end (matters only when a command runs inside another process, e.g. a test).
    """

    SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
    HANDOVER: Final = signal.SIGHUP

    def __init__(self, handover: bool = False) -> None:
        """``handover``: SIGHUP too, as a hand-over request (:meth:`take_handover`), not a stop: a sweep's
        next variant keeps this process running and asks it to start its results anew."""
        self.requested = False
        self._handover = False
        self._waited = set(self.SIGNALS) | ({self.HANDOVER} if handover else set())
        self._blocking = hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask")
        self._previous: set[int] | None = None
        if self._blocking:
            self._previous = {int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, self._waited)}
        else:  # pragma: no cover - not Linux
            for sig in self._waited:
                signal.signal(sig, self._flag)

    def _flag(self, signum: int, frame: FrameType | None) -> None:  # pragma: no cover - not Linux
        if signum == self.HANDOVER:
            self._handover = True
        else:
            self.requested = True

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a stop was requested (before or during the wait). A
        hand-over request ends the wait too (False), and is kept for :meth:`take_handover`."""
        if self.requested:
            return True
        if self._blocking:
            info = signal.sigtimedwait(self._waited, max(0.0, seconds))
            if info is not None and info.si_signo == self.HANDOVER:
                self._handover = True
            elif info is not None:
                self.requested = True
        elif seconds > 0:  # pragma: no cover - not Linux
            time.sleep(seconds)
        return self.requested

    def take_handover(self) -> bool:
        """Whether a hand-over was requested since the last call (SIGHUP, with ``handover``)."""
        if self._consume_pending_handover():  # arrived while no wait ran
            self._handover = True
        asked, self._handover = self._handover, False
        return asked

    def _consume_pending_handover(self) -> bool:
        if self._blocking and self.HANDOVER in self._waited and self.HANDOVER in signal.sigpending():
            signal.sigtimedwait({self.HANDOVER}, 0)
            return True
        return False

    def poll(self) -> bool:
        """True when a stop was requested; never sleeps (for loops that are busy on purpose)."""
        return self.wait(0.0)

    @classmethod
    def release(cls) -> None:
        """In a forked child: take the signals back to their default action, unblocked."""
        for sig in (*cls.SIGNALS, cls.HANDOVER):
            signal.signal(sig, signal.SIG_DFL)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {*cls.SIGNALS, cls.HANDOVER})

    def close(self) -> None:
        if self._blocking and self._previous is not None:
            pending = signal.sigpending() & set(self.SIGNALS)
            if pending and not self._previous & pending:
                # a signal that arrived after the last wait: consume it, it was a stop request
                signal.sigtimedwait(pending, 0)
                self.requested = True
            if self.HANDOVER not in self._previous:
                self._consume_pending_handover()  # a hand-over nobody takes any more
            signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)
            self._previous = None

    def __enter__(self) -> StopSignal:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def deadline_ns(start_ns: int, duration_s: float | None) -> int | None:
    """``time.monotonic_ns()`` value at which a command with ``duration_s`` ends (None: until stopped)."""
    return None if duration_s is None else start_ns + round(duration_s * 1e9)


def every(
    stop: StopSignal,
    start_ns: int,
    interval_ns: int,
    end_ns: int | None,
    sample: Callable[[], None],
    clock: Callable[[], int] = time.monotonic_ns,
) -> int:
    """Call ``sample`` at ``start_ns + k·interval_ns`` (k ≥ 1) until a stop request or ``end_ns``.

    A tick missed because a sample overran is skipped, never bunched: the next call is the next tick in
    the future. Returns the number of samples taken.
    """
    if interval_ns <= 0:
        raise ValueError(f"interval_ns: {interval_ns} is not positive")
    taken = 0
    tick = start_ns + interval_ns
    while not stop.requested:
        now = clock()
        if end_ns is not None and tick > end_ns:
            break
        if now < tick:
            stop.wait((tick - now) / 1e9)
            continue
        sample()
        taken += 1
        now = clock()
        tick += interval_ns * max(1, (now - tick) // interval_ns + 1)
    return taken
