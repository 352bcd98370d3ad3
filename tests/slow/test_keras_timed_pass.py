"""Keras models timed in ONE tf.function call with tf.timestamp() between the stages."""

from __future__ import annotations

import itertools
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dit.device.adapter import TimedPass
from dit.device.common import build_model
from dit.device.profiler import profile_model
from dit.models.catalogue import entry
from dit.models.equivalence import check_partition_equivalence

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # gaps between timed calls: alone

SMALL: list[tuple[str, dict[str, Any]]] = [
    ("alexnet", {"fc_units": 64}),
    ("gru_vqp", {}),
]


def build(name: str, params: dict[str, Any]) -> Any:
    return build_model({"name": name, "builder": entry(name).builder, "params": params, "seed": 5})


@pytest.mark.parametrize(("name", "params"), SMALL, ids=[c[0] for c in SMALL])
def test_stage_times_add_up_to_the_timed_call(name: str, params: dict[str, Any]) -> None:
    m = build(name, params)
    assert isinstance(m, TimedPass)
    x = m.make_input()
    staged = x
    for s in range(1, m.num_stages + 1):
        staged = m.run_stage(s, staged)
    y, _ = m.timed_pass(x)
    # the timed graph computes the same function as the stages and as the one-piece model
    assert m.max_abs_diff(y, staged) <= 1e-6
    assert m.max_abs_diff(y, m.forward(x)) <= 1e-5
    import tensorflow as tf

    noop = tf.function(tf.identity).get_concrete_function(tf.TensorSpec(m.specs[0].shape, tf.float32))
    xt = tf.constant(np.asarray(x, dtype=np.float32).reshape(m.specs[0].shape))
    gaps: list[int] = []
    calls: list[int] = []
    for _ in range(8):
        c0 = time.time_ns()
        noop(xt).numpy()
        calls.append(time.time_ns() - c0)
        w0 = time.time_ns()
        _, bounds = m.timed_pass(x)
        w1 = time.time_ns()
        assert len(bounds) == m.num_stages + 1
        stages = [b - a for a, b in itertools.pairwise(bounds)]
        assert all(t >= 0 for t in stages), stages  # ordered boundaries
        # the stages lie inside the call, and fill it but for one call's dispatch
        assert w0 - 1_000 <= bounds[0] and bounds[-1] <= w1 + 1_000
        assert sum(stages) == bounds[-1] - bounds[0]
        gaps.append((w1 - w0) - sum(stages))
    # what the call adds around the stages is about the dispatch of one (no-op) call
    assert statistics.median(gaps) <= 2 * statistics.median(calls) + 2_000_000, (gaps, calls)
    # the partition path (stages 1..p, encode/decode, p+1..N) is unchanged
    check_partition_equivalence(m, x, tolerance=1e-5)


def test_the_profile_makes_one_call_per_pass_for_its_latencies(monkeypatch: pytest.MonkeyPatch) -> None:
    m = build("gru_vqp", {})
    original = m.timed_pass
    seen: list[Sequence[int]] = []

    def spy(x: Any) -> tuple[Any, Sequence[int]]:
        y, bounds = original(x)
        seen.append(bounds)
        return y, bounds

    monkeypatch.setattr(m, "timed_pass", spy)
    result = profile_model(m, repetitions=3, warmup=1)
    assert result.latency_method == "one_call"
    assert len(seen) == 4  # one call per pass, warm-up included
    for rep, bounds in enumerate(seen[1:]):
        rows = [r for r in result.records if r.rep == rep and r.stage > 0]
        inside = [b - a for a, b in itertools.pairwise(bounds)]
        latencies = [r.latency_ns for r in rows]
        # the stages between the first and the last are the timestamps' differences; the first also
        # carries the call's entry (the profile's wall clock read before the call), the last the
        # call's return (the model's own wall clock read as the call returns)
        assert latencies[1:-1] == inside[1:-1]
        assert latencies[0] >= inside[0] and latencies[-1] >= inside[-1]


LAYER_STAGE = {"tiny1": 1, "heavy1": 2, "heavy2": 2, "heavy3": 2, "tiny2": 3}


def bracket_model() -> Any:
    """Three stages: a tiny dense layer, three 2048-wide ones, a tiny one."""
    from dit.models.keras_staged import KerasStagedModel, import_keras

    keras = import_keras()
    keras.utils.set_random_seed(3)
    inp = keras.Input((64,))
    h = keras.layers.Dense(8, name="tiny1")(inp)
    h = keras.layers.Dense(2048, name="heavy1")(h)
    h = keras.layers.Dense(2048, name="heavy2")(h)
    h = keras.layers.Dense(2048, name="heavy3")(h)
    out = keras.layers.Dense(8, name="tiny2")(h)
    m = KerasStagedModel("bracket", keras.Model(inp, out), [0, 3], {"seed": 1})
    assert m.stage_names == ["input", "tiny1", "heavy3", "tiny2"]
    return m


def test_the_executor_runs_each_stage_between_its_timestamps(tmp_path: Path) -> None:
    """The TensorFlow profiler's trace of one timed call: every op of stage k that depends on the
    stage input (all but the variable reads) runs after timestamp k-1 and before timestamp k."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    m = bracket_model()
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    m.timed_pass(x)
    tf.profiler.experimental.start(str(tmp_path))
    m.timed_pass(x)
    tf.profiler.experimental.stop()
    (trace,) = tmp_path.glob("**/*.xplane.pb")
    space = xplane_pb2.XSpace()
    space.ParseFromString(trace.read_bytes())
    stamps: list[tuple[int, int]] = []  # (start, end) ns of each Timestamp op
    ops: list[tuple[int, int, int, str]] = []  # (stage, start, end, name)
    for plane in space.planes:
        for line in plane.lines:
            for e in line.events:
                name = plane.event_metadata[e.metadata_id].name
                start = line.timestamp_ns * 1000 + e.offset_ps
                end = start + e.duration_ps
                layer = re.search(r"/(tiny1|heavy1|heavy2|heavy3|tiny2)(_\d+)?/", name)
                if re.fullmatch(r"Timestamp(_\d+)?:Timestamp", name):
                    stamps.append((start, end))
                elif layer and "ReadVariableOp" not in name:
                    ops.append((LAYER_STAGE[layer.group(1)], start, end, name))
    stamps.sort()
    # a timestamp between each two stages; the call's start and end are the wall clock around it
    assert len(stamps) == m.num_stages - 1, stamps
    assert {stage for stage, *_ in ops} == {1, 2, 3}, ops
    for stage, start, end, name in ops:
        after = stamps[stage - 2][1] if stage > 1 else -1
        before = stamps[stage - 1][0] if stage < m.num_stages else 2**63
        assert after <= start and end <= before, (name, stage)


def test_the_timestamps_bracket_their_stage() -> None:
    """A heavy middle stage between two tiny ones: its boundaries, and only its, enclose the work."""
    import tensorflow as tf

    m = bracket_model()
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    m.timed_pass(x)
    noop = tf.function(tf.identity).get_concrete_function(tf.TensorSpec((1, 64), tf.float32))
    xt = tf.constant(x)
    noop(xt).numpy()
    times, calls = [], []
    for _ in range(9):
        c0 = time.time_ns()
        noop(xt).numpy()
        calls.append(time.time_ns() - c0)
        _, b = m.timed_pass(x)
        times.append([b[1] - b[0], b[2] - b[1], b[3] - b[2]])
    tiny1, heavy, tiny2 = (statistics.median(t[i] for t in times) for i in range(3))
    # Stage 1 also holds the call's entry (boundary 0 is the wall clock before the call): 0.2-0.6 ms of
    # dispatch depending on the load, which once made it more than a fifth of the heavy stage in CI.
    dispatch = statistics.median(calls)
    assert heavy > 5 * max(tiny1 - dispatch, tiny2, 1_000), (tiny1, heavy, tiny2, dispatch)
