"""The stage-by-stage profiler: layers.csv shape and values, warm-up exclusion, memory method."""

from __future__ import annotations

import csv
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from dit.device.fakemodel import FakeModel, build
from dit.device.profiler import (
    LAYERS_COLUMNS,
    CpuSampler,
    PeakMemory,
    peak_pct,
    profile_model,
    write_layers_csv,
)


class CountingModel(FakeModel):
    def __init__(self) -> None:
        base = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 3})
        super().__init__(base.stages, base.input_bytes, base.seed, name="counting")
        self.inputs = 0
        self.calls: list[int] = []

    def make_input(self) -> bytes:
        self.inputs += 1
        return super().make_input()

    def run_stage(self, stage: int, x: Any) -> bytes:
        self.calls.append(stage)
        return super().run_stage(stage, x)


def test_layers_csv_shape_and_values(tmp_path: Path) -> None:
    model = CountingModel()
    result = profile_model(model, repetitions=3, warmup=2)
    assert model.inputs == 5  # warm-up passes run, ...
    # a timing pass per repetition, all back to back, then the instrumented pass per repetition
    assert model.calls == [1, 2, 3, 4] * 10
    assert result.latency_method == "back_to_back"
    assert len(result.records) == 3 * 5  # ... but are not recorded
    path = tmp_path / "layers.csv"
    write_layers_csv(path, result)
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == LAYERS_COLUMNS
        rows = list(reader)
    assert [(int(r["rep"]), int(r["stage"])) for r in rows] == list(itertools.product(range(3), range(5)))
    for r in rows:
        stage = int(r["stage"])
        assert int(r["output_bytes"]) == model.output_bytes(stage)
        assert int(r["ops"]) == model.ops(stage)
        assert int(r["peak_mem_bytes"]) > 0
        assert float(r["cpu_pct"]) >= 0.0
        if stage == 0:
            assert (int(r["latency_ns"]), int(r["ops"]), int(r["output_bytes"])) == (0, 0, 256)
        else:
            assert int(r["latency_ns"]) > 0
    starts = [int(r["start_ns"]) for r in rows]
    assert starts == sorted(starts) and starts[0] >= 0
    summary = result.summary()
    assert summary["warmup"] == 2 and summary["repetitions"] == 3 and summary["stages"] == 4
    assert summary["peak_mem_method"] in ("clear_refs", "ru_maxrss")
    assert [s["stage"] for s in summary["per_stage"]] == [0, 1, 2, 3, 4]


def test_latency_is_monotonic_clock_around_run_stage() -> None:
    ticks = itertools.count(1000, 7)  # every clock read advances 7 ns
    model = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 0})
    result = profile_model(model, repetitions=2, origin_mono_ns=1000, clock=lambda: next(ticks))
    stage_rows = [r for r in result.records if r.stage > 0]
    assert {r.latency_ns for r in stage_rows} == {7}
    assert result.mean_latency_ns() == [0.0, 7.0, 7.0, 7.0, 7.0]
    assert result.records[0].start_ns == 0


def test_peak_memory_methods() -> None:
    auto = PeakMemory()
    assert auto.method in ("clear_refs", "ru_maxrss")
    auto.reset()
    assert auto.read() > 0
    fallback = PeakMemory(force_method="ru_maxrss")
    assert fallback.read() >= auto.read() // 2
    with pytest.raises(ValueError, match="unknown peak memory method"):
        PeakMemory(force_method="psutil")


def test_peak_memory_sees_a_stage_allocation() -> None:
    mem = PeakMemory()
    if mem.method != "clear_refs":
        pytest.skip("clear_refs not permitted here")
    mem.reset()
    before = mem.read()
    blob = bytearray(64 * 1024 * 1024)
    blob[::4096] = b"\x01" * len(blob[::4096])  # touch every page
    after = mem.read()
    del blob
    assert after - before >= 60 * 1024 * 1024


def test_negative_counts_are_refused() -> None:
    model = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 0})
    with pytest.raises(ValueError, match="must be >= 0"):
        profile_model(model, repetitions=-1)


class BurstModel:
    """One stage that idles 60 ms, then busy-spins 60 ms: mean CPU about 50 %, peak about 100 %."""

    name = "burst"
    num_stages = 1

    def make_input(self) -> bytes:
        return b"x"

    def run_stage(self, stage: int, x: Any) -> Any:
        time.sleep(0.06)
        end = time.monotonic_ns() + 60_000_000
        while time.monotonic_ns() < end:
            pass
        return x

    def encode(self, x: Any) -> bytes:
        return bytes(x)

    def decode(self, data: bytes, stage: int) -> Any:
        return data

    def output_bytes(self, stage: int) -> int:
        return 1

    def ops(self, stage: int) -> int:
        return 0

    def max_abs_diff(self, a: Any, b: Any) -> float:
        return 0.0


def test_a_burst_shows_a_peak_above_its_mean(tmp_path: Path) -> None:
    result = profile_model(BurstModel(), repetitions=2)
    assert result.cpu_peak_method == "helper_process"  # Linux: sampled from outside, no GIL taken
    stage = [r for r in result.records if r.stage == 1]
    for r in stage:
        assert r.cpu_pct < 75.0  # idle half
        # the busy half, sampled every 2 ms: at least 1.5 x the mean (about 2 x on an idle machine;
        # relative, because on a crowded machine the spin gets only part of a core)
        assert r.cpu_peak_pct >= 1.5 * r.cpu_pct and r.cpu_peak_pct > r.cpu_pct
    path = tmp_path / "layers.csv"
    write_layers_csv(path, result)
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["stage"] == "1"]
    assert all(float(r["cpu_peak_pct"]) > float(r["cpu_pct"]) for r in rows)
    assert result.summary()["per_stage"][1]["max_cpu_peak_pct"] == max(r.cpu_peak_pct for r in stage)


def test_peak_over_hand_built_samples() -> None:
    ms = 1_000_000
    # 4 ms idle, 4 ms at one core, 4 ms at two cores; a 0.2 ms late sample is merged into the next window
    samples = [(0, 0), (4 * ms, 0), (8 * ms, 4 * ms), (8 * ms + ms // 5, 4 * ms), (12 * ms, 12 * ms)]
    assert peak_pct(samples, 2 * ms, 50.0) == 200.0
    assert peak_pct(samples[:1], 2 * ms, 42.5) == 42.5  # too few samples: the mean
    assert peak_pct([(0, 0), (4 * ms, ms)], 2 * ms, 60.0) == 60.0  # never below the mean


def test_the_thread_sampler_sees_the_burst_too() -> None:
    """The fallback where the helper process cannot run (not Linux): a sampling thread."""
    sampler = CpuSampler(2_000_000)
    try:
        sampler.begin()
        c0, t0 = time.process_time_ns(), time.monotonic_ns()
        BurstModel().run_stage(1, b"x")
        c1, t1 = time.process_time_ns(), time.monotonic_ns()
        mean = 100.0 * (c1 - c0) / (t1 - t0)
        peak = sampler.end_window(t0, t1, mean)
    finally:
        sampler.close()
    assert peak >= 1.5 * mean and peak > mean


def test_sampling_can_be_disabled() -> None:
    result = profile_model(BurstModel(), repetitions=1, cpu_sample_interval_ns=0)
    assert all(r.cpu_peak_pct == r.cpu_pct for r in result.records if r.stage == 1)
    assert result.summary()["cpu_sample_interval_ns"] == 0
    assert result.summary()["cpu_peak_method"] == "off"


def test_the_profile_command_names_a_bad_sampling_interval(tmp_path: Path) -> None:
    from dit.device.agent import run_profile
    from dit.device.common import ConfigError

    cfg = {
        "run_id": "r",
        "host": "device1",
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "results_dir": str(tmp_path),
        "cpu_sample_interval_ms": -1,
    }
    with pytest.raises(ConfigError, match="cpu_sample_interval_ms: -1"):
        run_profile(cfg)


def test_stop_ends_the_profile_between_repetitions() -> None:
    """``stop`` is asked before every repetition (not during the warm-up); the result holds the
    repetitions done, each with its timing pass and its stage-by-stage pass."""
    model = build({"name": "fake", "params": {"profile": "tiny"}, "seed": 0})
    asked: list[int] = []

    def stop() -> bool:
        asked.append(len(asked))
        return len(asked) > 3  # three repetitions, then stop

    result = profile_model(model, repetitions=50, warmup=2, stop=stop)
    assert result.repetitions == 3 and len(asked) == 4
    assert sorted({r.rep for r in result.records}) == [0, 1, 2]
    assert len(result.records) == 3 * (model.num_stages + 1)
    assert all(r.latency_ns > 0 for r in result.records if r.stage > 0)
    assert result.latency_method == "back_to_back"
    assert profile_model(model, repetitions=5, stop=lambda: False).repetitions == 5
    assert profile_model(model, repetitions=5, stop=lambda: True).records == []
