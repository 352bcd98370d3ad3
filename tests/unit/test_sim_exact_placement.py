"""dit.sim.exact_placement: the MILP's optimum is HeadSplit's cost model at the placement it returns,
no heuristic beats it, it respects the memory limits, and an instance built with a known optimum gets it."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("highspy", reason="the sim extra (HiGHS) is not installed")

from dit.sim.exact_placement import exact_place, gaps
from dit.sim.placement_model import PRESETS, STRATEGIES, PlacementError, place
from headsplit.placement import WorkerSpec, bytes_by_worker, estimate_token_s

MODEL = PRESETS["llama-tiny"]  # 4 layers x 8 query heads over 2 KV heads
BW = 12.5e6
TOKENS = 64


def workers(seed: int, n: int, memory_bytes: int = 10**9) -> list[WorkerSpec]:
    rng = random.Random(seed)
    return [
        WorkerSpec(f"worker{i + 1}", memory_bytes, rng.uniform(1e8, 1e9), rng.randint(1, 20) * 10**6)
        for i in range(n)
    ]


@pytest.mark.parametrize(("seed", "n"), [(1, 3), (2, 4), (3, 5)])
def test_the_optimum_is_the_cost_model_at_its_placement_and_no_heuristic_beats_it(seed: int, n: int) -> None:
    ws = workers(seed, n)
    placement, best = exact_place(MODEL, ws, context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
    assert best == pytest.approx(
        estimate_token_s(MODEL, ws, placement, context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
    )
    for strategy in STRATEGIES:
        heuristic = place(MODEL, ws, strategy, context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
        s = estimate_token_s(MODEL, ws, heuristic, context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
        assert best <= s * (1 + 1e-9), strategy


def test_one_fast_near_worker_with_room_for_all_takes_every_unit() -> None:
    # worker1: 100x faster and 1000x nearer than the others: any unit elsewhere costs a far round trip
    ws = [WorkerSpec("worker1", 10**9, 1e11, 10**5)] + [
        WorkerSpec(f"worker{i}", 10**9, 1e9, 10**8) for i in (2, 3)
    ]
    placement, best = exact_place(MODEL, ws, context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
    assert set(placement.values()) == {"worker1"}
    alone = {u: "worker1" for u in placement}
    assert best == pytest.approx(
        estimate_token_s(MODEL, ws, alone, context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
    )


def test_the_memory_limits_hold_and_an_impossible_instance_is_refused() -> None:
    need = bytes_by_worker(
        MODEL, {u: "w" for u in place(MODEL, workers(4, 1), "greedy", context_tokens=TOKENS)}, TOKENS
    )
    per_worker = need["w"] // 2  # three workers: room for 3/2 of the model, for half of it on one
    ws = workers(4, 3, memory_bytes=per_worker)
    placement, _ = exact_place(MODEL, ws, context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
    assert all(b <= per_worker for b in bytes_by_worker(MODEL, placement, TOKENS).values())
    with pytest.raises(PlacementError, match="no exact placement"):
        exact_place(
            MODEL, workers(4, 2, memory_bytes=need["w"] // 4), context_tokens=TOKENS, bandwidth_bytes_per_s=BW
        )


def test_gaps_are_measured_against_the_optimum() -> None:
    best, found = gaps(MODEL, workers(5, 3), context_tokens=TOKENS, bandwidth_bytes_per_s=BW)
    assert [g.strategy for g in found] == list(STRATEGIES)
    assert all(g.gap_percent is not None and g.gap_percent >= -1e-9 for g in found)
    assert best > 0
