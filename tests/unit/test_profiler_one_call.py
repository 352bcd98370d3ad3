"""The profiler times a :class:`~dit.device.adapter.TimedPass` model with one call per repetition."""

from __future__ import annotations

import itertools
from typing import Any

from dit.device.adapter import TimedPass
from dit.device.fakemodel import FakeModel, build
from dit.device.profiler import profile_model


class OneCallModel(FakeModel):
    """The tiny fake model plus a ``timed_pass`` whose boundaries advance by known amounts."""

    STEPS = (1_000, 20_000, 300, 4_000)  # ns per stage, on the model's (fake) wall clock
    # the call's fixed cost before boundary 0, and the model's own work after its last boundary
    ENTRY, RETURN = 100, 50

    def __init__(self) -> None:
        base = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 3})
        super().__init__(base.stages, base.input_bytes, base.seed, name="one-call")
        self.timed_calls = 0
        self.stage_calls: list[int] = []
        self.events: list[str] = []
        self.wall = 5_000_000

    def run_stage(self, stage: int, x: Any) -> bytes:
        self.stage_calls.append(stage)
        self.events.append("stage")
        return super().run_stage(stage, x)

    def timed_pass(self, x: Any) -> tuple[Any, list[int]]:
        self.timed_calls += 1
        self.events.append("timed")
        bounds = [self.wall + self.ENTRY]  # boundary 0 a little after the profiler read the wall clock
        for step in self.STEPS:
            bounds.append(bounds[-1] + step)
            x = FakeModel.run_stage(self, len(bounds) - 1, x)
        self.wall = bounds[-1] + self.RETURN  # the wall clock when the call has returned
        return x, bounds


def test_latency_comes_from_one_timed_call_per_repetition() -> None:
    model = OneCallModel()
    assert isinstance(model, TimedPass)
    mono = itertools.count(10_000, 10)
    result = profile_model(
        model, repetitions=3, warmup=2, clock=lambda: next(mono), wall_clock=lambda: model.wall
    )
    assert model.timed_calls == 5  # one call per pass, warm-up included
    assert result.latency_method == "one_call"
    assert result.summary()["latency_method"] == "one_call"
    first, *middle, last = OneCallModel.STEPS
    # the call's entry cost goes to stage 1; what the model does after its last boundary (fetching
    # its timestamps) is not inference and is left out
    expected = [OneCallModel.ENTRY + first, *middle, last]
    for rep in range(3):
        rows = [r for r in result.records if r.rep == rep and r.stage > 0]
        assert [r.latency_ns for r in rows] == expected
        # starts: the monotonic reading before the call (stage 1 starts there), then the boundaries
        starts = [r.start_ns for r in rows]
        assert [b - a for a, b in itertools.pairwise(starts)] == expected[:-1]
    # the stage-by-stage pass still runs (CPU, memory) on every pass, after all the timed calls ran
    # back to back (a stage-by-stage pass between them would leave the thread pools cold)
    assert model.stage_calls == [1, 2, 3, 4] * 5
    assert model.events == ["timed"] * 5 + ["stage"] * 20


def test_one_call_can_be_turned_off() -> None:
    model = OneCallModel()
    result = profile_model(model, repetitions=2, one_call=False, cpu_sample_interval_ns=0)
    assert model.timed_calls == 0
    assert result.latency_method == "per_stage_call"
    assert all(r.latency_ns not in OneCallModel.STEPS for r in result.records if r.stage > 0)


def test_a_model_without_timed_pass_is_timed_by_its_stages_back_to_back() -> None:
    """Latencies come from the stages called one after the other with only clock reads between
    them, never from the instrumented pass, whose gaps let a CPU quota refill."""
    model = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 0})
    assert not isinstance(model, TimedPass)
    ticks = itertools.count(0, 1_000)
    reads: list[str] = []
    real_run_stage = model.run_stage

    def run_stage(stage: int, x: Any) -> bytes:
        reads.append(f"stage{stage}")
        return real_run_stage(stage, x)

    def clock() -> int:
        reads.append("clock")
        return next(ticks)

    model.run_stage = run_stage  # type: ignore[method-assign]
    result = profile_model(model, repetitions=1, clock=clock, cpu_sample_interval_ns=0)
    assert result.latency_method == "back_to_back"
    timing = reads[reads.index("stage1") - 1 : reads.index("stage4") + 2]
    assert timing == ["clock", "stage1", "clock", "stage2", "clock", "stage3", "clock", "stage4", "clock"]
    # each latency is exactly one tick of the fake clock: nothing else was timed
    assert [r.latency_ns for r in result.records if r.stage > 0] == [1_000] * 4
