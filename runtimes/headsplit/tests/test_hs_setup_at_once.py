"""The controller has its workers build their shares at once: a Chapter 6 variant's set-up lasts as long
as its slowest worker's, not the sum of all of them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("torch")

from headsplit.config import preset
from headsplit.controller import set_up_workers, time_unit_steps
from headsplit.rpc import RpcCallFailed
from headsplit.units import Unit, all_units

CFG = preset("llama-tiny")


class MeetingTransport:
    """Each worker's set-up waits for every other's to have started: calls made one after another never
    meet, and the barrier breaks (its timeout) instead of hanging."""

    def __init__(self, workers: int, failing: str | None = None) -> None:
        self.barrier = threading.Barrier(workers, timeout=10)
        self.failing = failing
        self.done: list[str] = []

    def setup(self, worker: str, cfg: Any, checkpoint: dict[str, str] | None, units: list[Unit]) -> int:
        self.barrier.wait()
        if worker == self.failing:
            raise RpcCallFailed(f"{worker}.remote_setup: failed 4 times, last error: EOF")
        self.done.append(worker)
        return len(units)


def _shares(n: int) -> dict[str, tuple[None, list[Unit]]]:
    units = all_units(CFG)
    return {f"worker{i + 1}": (None, units[i::n]) for i in range(n)}


def test_every_worker_sets_up_at_the_same_time() -> None:
    tr = MeetingTransport(4)
    set_up_workers(tr, CFG, _shares(4))
    assert sorted(tr.done) == ["worker1", "worker2", "worker3", "worker4"]


def test_a_failed_set_up_is_raised_after_the_others_ended() -> None:
    tr = MeetingTransport(3, failing="worker2")
    with pytest.raises(RpcCallFailed, match=r"^worker2\.remote_setup: failed 4 times"):
        set_up_workers(tr, CFG, _shares(3))
    assert sorted(tr.done) == ["worker1", "worker3"]  # their calls ended; nothing is left running


class MeetingTimer:
    """Each worker's timing of its unit steps waits for every other's to have started: timings made one
    after another never meet, and the barrier breaks instead of hanging."""

    def __init__(self, workers: int) -> None:
        self.barrier = threading.Barrier(workers, timeout=10)

    def unit_step_s(self, worker: str, cfg: Any, context_tokens: int) -> tuple[float, float, float]:
        self.barrier.wait()
        n = int(worker.removeprefix("worker"))
        return 0.01 * n, 0.001 * n, 0.02 * n + context_tokens * 1e-6


def test_every_worker_times_its_unit_steps_at_the_same_time() -> None:
    """A drift of the machine's speed while the costs are timed falls on every worker alike; each
    worker's own figures come back under its name."""
    got = time_unit_steps(MeetingTimer(4), CFG, ["worker1", "worker2", "worker3", "worker4"], 10)
    assert got == {f"worker{n}": (0.01 * n, 0.001 * n, 0.02 * n + 10e-6) for n in range(1, 5)}
