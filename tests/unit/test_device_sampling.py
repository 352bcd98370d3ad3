"""dit.device.sampling: the stop signal and the absolute sampling schedule the device commands share."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dit.device.sampling import StopSignal, deadline_ns, every

SRC = Path(__file__).resolve().parents[2] / "src"


class FakeStop(StopSignal):
    """A stop signal on a fake clock: a wait advances the clock instead of sleeping."""

    def __init__(self, clock: list[int], stop_after: int | None = None) -> None:
        self.requested = False
        self.clock = clock
        self.waits = 0
        self.stop_after = stop_after

    def wait(self, seconds: float) -> bool:
        self.waits += 1
        self.clock[0] += round(seconds * 1e9)
        if self.stop_after is not None and self.waits >= self.stop_after:
            self.requested = True
        return self.requested


def test_every_samples_on_an_absolute_schedule_and_skips_missed_ticks() -> None:
    clock = [1_000]
    taken: list[int] = []

    def sample() -> None:
        taken.append(clock[0])
        if len(taken) == 2:
            clock[0] += 350  # an overrun: the ticks at 1300 and 1400 are skipped, not bunched

    stop = FakeStop(clock)
    n = every(stop, 1_000, 100, 1_700, sample, clock=lambda: clock[0])
    assert taken == [1_100, 1_200, 1_600, 1_700]
    assert n == 4


def test_every_ends_at_a_stop_request() -> None:
    clock = [0]
    taken: list[int] = []
    stop = FakeStop(clock, stop_after=3)
    assert every(stop, 0, 10, None, lambda: taken.append(clock[0]), clock=lambda: clock[0]) == 2
    assert taken == [10, 20]
    with pytest.raises(ValueError, match="interval_ns: 0"):
        every(stop, 0, 0, None, lambda: None)


def test_deadline() -> None:
    assert deadline_ns(5, None) is None
    assert deadline_ns(5, 1.5) == 1_500_000_005


def test_stop_signal_ends_a_wait_at_once_and_restores_the_mask() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with StopSignal() as stop:
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        assert not stop.poll()
        # Directed at this thread: a process-directed signal may go to another thread of the test
        # process (one that does not block it) and end the whole test run.
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # blocked: pending until the wait
        start = time.monotonic()
        assert stop.wait(30)
        assert time.monotonic() - start < 5
        assert stop.poll()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    with StopSignal() as late:
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # after the last wait: taken at close
    assert late.requested
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before


def test_a_released_child_dies_of_sigterm() -> None:
    code = (
        "import os, time, sys; sys.path.insert(0, sys.argv[1]);"
        "from dit.device.sampling import StopSignal;"
        "stop = StopSignal();"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    StopSignal.release(); time.sleep(30); os._exit(0)\n"
        "os.kill(pid, 15); _, status = os.waitpid(pid, 0); print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(SRC)], capture_output=True, text=True, timeout=20)
    assert proc.stdout.strip() == str(int(signal.SIGTERM)), proc.stderr
