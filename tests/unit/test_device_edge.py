"""Edge scheduling at stage boundaries: RR rounds in device order, SJF by remaining workload."""

from __future__ import annotations

import itertools
import threading

import pytest

import dit.device.edge as edge_module
from dit.device.common import ConfigError
from dit.device.edge import (
    MAX_CAPACITY_REPETITIONS,
    EdgeConfig,
    Executor,
    Job,
    Scheduler,
    capacity_repetitions,
)
from dit.device.fakemodel import build
from dit.device.protocol import Message

N = 11
OPS = [0.0, 44, 10, 60, 8, 52, 52, 44, 7, 36, 17, 6]


def job(device_index: int, point: int, seq: int = 0) -> Job:
    def reply(_msg: Message) -> None:
        return None

    return Job(
        device=f"device{device_index + 1}",
        device_index=device_index,
        round=0,
        repetition=0,
        point=point,
        payload=b"",
        recv_start_ns=0,
        ack_ns=0,
        seq=seq,
        reply=reply,
    )


def step(s: Scheduler) -> tuple[str, int]:
    j = s.pick()
    assert j is not None
    stage = j.next_stage
    j.next_stage += 1
    if j.next_stage > s.num_stages:
        s.complete(j)
    return j.device, stage


def drain(s: Scheduler) -> list[tuple[str, int]]:
    order = []
    while s.pending:
        order.append(step(s))
    return order


def test_rr_gives_one_stage_per_round_in_device_order() -> None:
    s = Scheduler("RR", N, OPS)
    s.add(job(1, 9, seq=0))  # arrival order must not matter, device order does
    s.add(job(0, 2, seq=1))
    order = drain(s)
    assert order[:4] == [("device1", 3), ("device2", 10), ("device1", 4), ("device2", 11)]
    assert order[4:] == [("device1", st) for st in range(5, 12)]


def test_rr_newcomer_joins_the_next_round() -> None:
    s = Scheduler("RR", N, OPS)
    s.add(job(1, 0))
    s.add(job(2, 0))
    assert step(s) == ("device2", 1)
    s.add(job(0, 0, seq=5))  # arrives mid-round: device3 still gets its stage of this round
    assert step(s) == ("device3", 1)
    assert [step(s) for _ in range(3)] == [("device1", 1), ("device2", 2), ("device3", 2)]


def test_sjf_runs_the_smallest_remaining_workload_first() -> None:
    s = Scheduler("SJF", N, OPS)
    s.add(job(0, 2))
    s.add(job(1, 9))
    order = drain(s)
    assert order == [("device2", 10), ("device2", 11)] + [("device1", st) for st in range(3, 12)]


def test_sjf_preempts_at_a_stage_boundary_when_a_smaller_job_arrives() -> None:
    s = Scheduler("SJF", N, OPS)
    s.add(job(0, 0))
    assert [step(s) for _ in range(3)] == [("device1", 1), ("device1", 2), ("device1", 3)]
    s.add(job(1, 10))  # remaining 6 < device1's remaining
    assert drain(s)[:2] == [("device2", 11), ("device1", 4)]


def test_sjf_ties_go_by_device_order_and_estimates_are_used() -> None:
    s = Scheduler("SJF", N, OPS)
    s.add(job(2, 5, seq=0))
    s.add(job(1, 5, seq=1))
    assert step(s) == ("device2", 6)
    # measured latencies can rank differently from ops: stage 11 is slow here
    slow_last = [0.0] + [1.0] * 10 + [100.0]
    t = Scheduler("SJF", N, slow_last)
    t.add(job(0, 10))
    t.add(job(1, 5))
    assert t.remaining(t.pending[0]) == 100.0 and t.remaining(t.pending[1]) == 105.0
    assert step(t) == ("device1", 11)


def test_bad_scheduler_arguments() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        Scheduler("FIFO", N, OPS)
    with pytest.raises(ValueError, match="need 12 stage estimates"):
        Scheduler("RR", N, OPS[:-1])


def test_executor_runs_stages_one_at_a_time_and_reports() -> None:
    model = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 1})
    done: list[Job] = []
    stages: list[tuple[str, int, int, int]] = []
    finished = threading.Event()

    def on_done(j: Job) -> None:
        done.append(j)
        if len(done) == 2:
            finished.set()

    ex = Executor(
        model,
        Scheduler("RR", 4, [0.0, 2, 3, 2, 1]),
        on_done,
        lambda j, s, a, b: stages.append((j.device, s, a, b)),
    )
    x = model.make_input()
    a, b = job(0, 0), job(1, 2)
    a.payload = x
    b.payload = model.run_stage(2, model.run_stage(1, x))
    b.next_stage = 3
    ex.start()
    ex.submit([a, b])
    assert finished.wait(30)
    ex.stop()
    ex.join(30)
    assert [(d, s) for d, s, _, _ in stages] == [
        ("device1", 1),
        ("device2", 3),
        ("device1", 2),
        ("device2", 4),
        ("device1", 3),
        ("device1", 4),
    ]
    intervals = sorted((start, end) for _, _, start, end in stages)
    assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(intervals))  # never overlap
    reference = model.run_stage(4, model.run_stage(3, model.run_stage(2, model.run_stage(1, x))))
    for j in done:
        assert j.error is None and j.result == reference
        assert j.remote_ns == sum(e - s for d, _, s, e in stages if d == j.device)


def test_executor_reports_a_failing_stage() -> None:
    model = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 1})
    done: list[Job] = []
    ev = threading.Event()

    def on_done(j: Job) -> None:
        done.append(j)
        ev.set()

    ex = Executor(model, Scheduler("SJF", 4, [0.0, 1, 1, 1, 1]), on_done)
    bad = job(0, 1)
    bad.payload = b"wrong size"
    ex.start()
    ex.submit([bad])
    assert ev.wait(30)
    ex.stop()
    ex.join(30)
    assert done[0].error is not None and "stage 2" in done[0].error and "1024 bytes, got 10" in done[0].error


class _Timed:
    """A stage model whose every stage takes ``stage_s`` on a clock of its own (``now_ns``, which the
    test puts in place of ``time.monotonic_ns``): a pass of 2 stages lasts ``2 * stage_s``, whatever
    else runs on the machine."""

    num_stages = 2

    def __init__(self, stage_s: float) -> None:
        self.stage_s = stage_s
        self.calls = 0
        self.clock_ns = 0

    def now_ns(self) -> int:
        return self.clock_ns

    def make_input(self) -> bytes:
        return b""

    def run_stage(self, stage: int, x: bytes) -> bytes:
        self.calls += 1
        self.clock_ns += round(self.stage_s * 1e9)
        return x


def _sized(model: _Timed, repetitions: int, min_s: float, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(edge_module.time, "monotonic_ns", model.now_ns)
    try:
        return capacity_repetitions(model, repetitions, min_s)
    finally:
        monkeypatch.undo()


def test_capacity_repetitions_last_the_minimum_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _Timed(0.01)  # a pass is 20 ms; a repetition costs two passes: 40 ms
    assert _sized(m, 3, 0.0, monkeypatch) == 3 and m.calls == 0  # 0: exactly the scenario's, no pass
    assert _sized(m, 3, 1.0, monkeypatch) == 25  # 1 s / 40 ms
    assert m.calls == 4  # two timed passes
    assert _sized(_Timed(0.5), 3, 1.0, monkeypatch) == 3  # a slow model keeps its repetitions
    assert _sized(_Timed(0.000001), 3, 600.0, monkeypatch) == MAX_CAPACITY_REPETITIONS


def _cfg(profile: object) -> dict[str, object]:
    return {
        "policy": "RR",
        "devices": ["device1"],
        "model": {"name": "fake"},
        "profile": profile,
        "results_dir": "/tmp/r",
        "ready_file": "/tmp/r.json",
    }


def test_edge_config_reads_and_checks_the_profile_minimum() -> None:
    assert EdgeConfig.from_dict(_cfg({"repetitions": 2, "min_seconds": 1.5})).profile_min_s == 1.5
    assert EdgeConfig.from_dict(_cfg({"repetitions": 2})).profile_min_s == 0.0
    for bad in (-1, "2", True, 7200):
        with pytest.raises(ConfigError, match="profile: min_seconds"):
            EdgeConfig.from_dict(_cfg({"repetitions": 2, "min_seconds": bad}))
