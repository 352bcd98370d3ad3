"""HeadSplit memory tracking: per-token samples, the 85 % trigger, and the placement's prediction.

Pure Python (no torch): runs in CI's default phase.
"""

from __future__ import annotations

import pytest

from headsplit.config import preset
from headsplit.memory import MemoryTracker, crossing_token, predict, squeeze
from headsplit.placement import WorkerSpec, place, worker_bytes
from headsplit.units import Unit, all_units


def test_tracker_flags_a_worker_above_85_percent_of_its_limit() -> None:
    tracker = MemoryTracker({"worker1": 1000, "worker2": 2000})
    assert tracker.over_threshold() == []
    tracker.record(0, "worker1", 850)  # exactly 85 %: not above
    tracker.record(0, "worker2", 100)
    assert tracker.over_threshold() == []
    assert not tracker.needs_replacement("worker1")
    tracker.record(1, "worker1", 851)
    assert tracker.needs_replacement("worker1")
    assert tracker.over_threshold() == ["worker1"]
    tracker.record(2, "worker2", 1900)
    assert tracker.over_threshold() == ["worker1", "worker2"]
    # after a re-placement the next sample decides
    tracker.record(3, "worker1", 400)
    assert tracker.over_threshold() == ["worker2"]
    assert tracker.latest("worker1") == 400 and tracker.peak("worker1") == 851
    assert tracker.latest("worker3") is None


def test_threshold_is_configurable() -> None:
    tracker = MemoryTracker({"worker1": 1000}, threshold=0.5)
    tracker.record(0, "worker1", 501)
    assert tracker.over_threshold() == ["worker1"]
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\]"):
        MemoryTracker({"worker1": 1000}, threshold=1.5)


def test_tracker_keeps_the_series_for_the_results_file() -> None:
    tracker = MemoryTracker({"worker1": 10**9, "worker2": 10**9})
    for token in range(3):
        tracker.record(token, "worker1", 100 + token)
        tracker.record(token, "worker2", 200 + token)
    assert tracker.to_json()[:3] == [
        {"token": 0, "worker": "worker1", "bytes": 100},
        {"token": 0, "worker": "worker2", "bytes": 200},
        {"token": 1, "worker": "worker1", "bytes": 101},
    ]
    assert len(tracker.samples) == 6


def test_tracker_rejects_bad_input_naming_it() -> None:
    with pytest.raises(ValueError, match=r"limits\['worker1'\] must be > 0 bytes"):
        MemoryTracker({"worker1": 0})
    with pytest.raises(ValueError, match="at least one worker"):
        MemoryTracker({})
    tracker = MemoryTracker({"worker1": 1000})
    with pytest.raises(ValueError, match="'worker9' has no limit"):
        tracker.record(0, "worker9", 1)
    with pytest.raises(ValueError, match="bytes for worker1 at token 4 must be >= 0"):
        tracker.record(4, "worker1", -1)
    with pytest.raises(ValueError, match="'worker9' has no limit"):
        tracker.needs_replacement("worker9")


def test_predict_is_the_placement_memory_model() -> None:
    cfg = preset("llama-tiny")
    ws = [WorkerSpec(f"worker{i}", 10**8, 1e9, 1_000_000) for i in (1, 2, 3)]
    placement = place(cfg, ws, "roundrobin", context_tokens=64)
    for w in ws:
        assert predict(cfg, placement, w.name, 64) == worker_bytes(cfg, placement, w.name, 64) > 0
    # dealing a KV group's query heads over several workers replicates its KV copy on each of them
    alone = predict(cfg, {u: "x" for u in all_units(cfg)}, "x", 64)
    assert sum(predict(cfg, placement, w.name, 64) for w in ws) > alone


def test_crossing_token_is_the_first_context_above_the_threshold() -> None:
    cfg = preset("llama-tiny")
    placement = {u: "worker1" for u in all_units(cfg)}
    limit = int(predict(cfg, placement, "worker1", 1000) / 0.85)  # crosses 85 % right after 1000 tokens
    token = crossing_token(cfg, placement, "worker1", limit)
    assert token is not None
    assert predict(cfg, placement, "worker1", token) > 0.85 * limit
    assert predict(cfg, placement, "worker1", token - 1) <= 0.85 * limit
    assert 995 <= token <= 1005
    assert crossing_token(cfg, placement, "worker1", 10) == 0  # already over with no context
    only_ffn = {Unit(0, "ffn"): "worker2"}
    assert crossing_token(cfg, only_ffn, "worker2", 10**9) is None  # no heads: no cache growth


def test_squeeze_puts_the_fastest_growing_worker_past_the_threshold_and_the_limit_at_the_tokens_asked() -> (
    None
):
    cfg = preset("tinyllama-half")
    ws = [WorkerSpec(f"worker{i}", 10**9, 1e9, 1_000_000) for i in (1, 2, 3, 4)]
    placement = place(cfg, ws, "greedy", context_tokens=64)
    prompt = 46
    got = squeeze(cfg, placement, prompt, replace_at=4, full_at=10)
    growth = {w.name: predict(cfg, placement, w.name, 1) - predict(cfg, placement, w.name, 0) for w in ws}
    assert growth[got.worker] == max(growth.values()) > 0
    # the engine samples after generated token i, the caches then holding prompt + i positions
    at = {i: predict(cfg, placement, got.worker, prompt + i) for i in range(12)}
    tracker = MemoryTracker({got.worker: got.limit_bytes}, got.threshold)
    crossed = []
    for i in range(12):
        tracker.record(i, got.worker, at[i])
        crossed.append(tracker.needs_replacement(got.worker))
    assert crossed.index(True) == 4 and all(crossed[4:])
    assert [at[i] > got.limit_bytes for i in range(12)].index(True) == 10
    assert 0 < got.threshold < 1
    assert got.to_json() == {"worker": got.worker, "limit_bytes": got.limit_bytes, "threshold": got.threshold,
                             "replace_at": 4, "full_at": 10}  # fmt: skip


def test_squeeze_takes_the_first_worker_by_name_among_equals_and_refuses_what_cannot_grow() -> None:
    cfg = preset("llama-tiny")
    units = all_units(cfg)
    heads = [u for u in units if u.kind == "head"]
    # worker10 and worker2 hold the same heads' worth of groups: worker2 comes first by name
    half = len(heads) // 2
    placement = {u: "worker1" for u in units if u.kind != "head"}
    placement.update({u: "worker2" for u in heads[:half]})
    placement.update({u: "worker10" for u in heads[half:]})
    assert squeeze(cfg, placement, 8, 1, 2).worker == "worker2"
    with pytest.raises(ValueError, match="no worker holds an attention head"):
        squeeze(cfg, {u: "worker1" for u in units if u.kind != "head"}, 8, 1, 2)
    with pytest.raises(ValueError, match="needs 0 < replace_at < full_at, got 3 and 3"):
        squeeze(cfg, placement, 8, 3, 3)
