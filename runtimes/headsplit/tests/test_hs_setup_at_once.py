"""The controller has its workers build their shares at once: a Chapter 6 variant's set-up lasts as long
as its slowest worker's, not the sum of all of them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("torch")

from headsplit.config import preset
from headsplit.controller import set_up_workers
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
