"""HeadSplit placement: every strategy covers the model once, fits memory, and keeps its shape.

Pure Python (no torch): runs in CI's default phase.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from headsplit.config import PRESETS, ModelConfig, preset
from headsplit.placement import (
    STRATEGIES,
    PlacementError,
    Strategy,
    WorkerSpec,
    bytes_by_worker,
    estimate_token_s,
    kv_copy_bytes,
    kv_flops,
    migration_bytes,
    moves,
    place,
    placement_from_json,
    placement_to_json,
    replace,
    step_rates,
    unit_flops,
    worker_bytes,
)
from headsplit.units import Unit, all_units, kv_cache_bytes_per_token, kv_weight_bytes, weight_bytes

GB = 1_000_000_000


def workers(
    n: int, memory_bytes: int = 4 * GB, flops_per_s: float = 2e9, rtt_ns: int = 10_000_000
) -> list[WorkerSpec]:
    return [WorkerSpec(f"worker{i}", memory_bytes, flops_per_s, rtt_ns) for i in range(1, n + 1)]


def model_bytes(cfg: ModelConfig, tokens: int) -> int:
    """The model's memory with one KV copy per group: what a single worker holding everything needs."""
    return sum(weight_bytes(cfg, u) for u in all_units(cfg)) + cfg.n_layers * cfg.n_kv_heads * kv_copy_bytes(
        cfg, tokens
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-tiny", "tinyllama", "gpt2-small"])
def test_every_unit_is_placed_exactly_once(strategy: Strategy, model: str) -> None:
    cfg = preset(model)
    ws = workers(4)
    trace: list[Unit] = []
    placement = place(cfg, ws, strategy, context_tokens=256, trace=trace)
    assert list(placement) == all_units(cfg)
    assert set(placement.values()) <= {w.name for w in ws}
    # the strategy placed each unit once (no unit placed twice and overwritten)
    assert sorted(trace) == sorted(all_units(cfg))
    assert len(trace) == len(set(trace))


def test_tinyllama_has_748_units() -> None:
    assert len(place(preset("tinyllama"), workers(4), "greedy", context_tokens=512)) == 22 * (32 + 2) == 748


def test_worker_bytes_counts_one_kv_copy_per_group_present() -> None:
    cfg = preset("llama-tiny")  # 8 query heads, 2 KV heads: heads 0-3 share KV head 0, heads 4-7 KV head 1
    head, copy = (
        weight_bytes(cfg, Unit(0, "head", 0)),
        kv_weight_bytes(cfg) + 10 * kv_cache_bytes_per_token(cfg),
    )
    placement = {u: "worker2" for u in all_units(cfg)}
    placement[Unit(0, "head", 0)] = placement[Unit(0, "head", 1)] = "worker1"  # same group: one copy
    assert worker_bytes(cfg, placement, "worker1", 10) == 2 * head + copy
    placement[Unit(0, "head", 4)] = "worker1"  # a second group: a second copy
    assert worker_bytes(cfg, placement, "worker1", 10) == 3 * head + 2 * copy
    # worker2 still holds heads of both layer-0 groups, so it keeps its copies of them
    total = sum(weight_bytes(cfg, u) for u in all_units(cfg))
    assert worker_bytes(cfg, placement, "worker2", 10) == total - 3 * head + cfg.n_layers * 2 * copy
    assert worker_bytes(cfg, placement, "nobody", 10) == 0
    # the cache grows with the tokens, by one per-token slice per copy
    assert worker_bytes(cfg, placement, "worker1", 11) - worker_bytes(cfg, placement, "worker1", 10) == (
        2 * kv_cache_bytes_per_token(cfg)
    )


def test_placement_never_exceeds_a_workers_memory() -> None:
    """Property over seeded random worker sets and limits: each strategy fits or raises PlacementError."""
    rng = random.Random(20260601)
    outcomes: Counter[tuple[str, bool]] = Counter()
    small = [PRESETS[name] for name in ("gpt2-tiny", "llama-tiny", "tinyllama-half")]
    for _ in range(60):
        cfg = rng.choice(small)
        tokens = rng.choice([0, 1, 64, 256])
        need = model_bytes(cfg, tokens)
        n = rng.randint(1, 6)
        ws = [
            WorkerSpec(
                f"worker{i}",
                # from a sixth to 2.5 times an even share of the model, so both outcomes occur
                max(1, int(need * rng.uniform(0.15, 2.5) / n)),
                rng.uniform(1e8, 1e10),
                rng.randrange(0, 50_000_000),
            )
            for i in range(1, n + 1)
        ]
        rng.shuffle(ws)
        for strategy in STRATEGIES:
            try:
                placement = place(cfg, ws, strategy, context_tokens=tokens)
            except PlacementError as exc:
                assert exc.worker in {w.name for w in ws}
                assert exc.needed_bytes > exc.limit_bytes == {w.name: w.memory_bytes for w in ws}[exc.worker]
                outcomes[strategy, False] += 1
                continue
            outcomes[strategy, True] += 1
            assert list(placement) == all_units(cfg)
            used = bytes_by_worker(cfg, placement, tokens)
            for w in ws:
                assert used.get(w.name, 0) <= w.memory_bytes, (strategy, w)
            if sum(w.memory_bytes for w in ws) < need:
                pytest.fail(f"{strategy} placed {cfg.name} in less memory than it needs")
    for strategy in STRATEGIES:  # the property was exercised both ways for every strategy
        assert outcomes[strategy, True] >= 10 and outcomes[strategy, False] >= 5, outcomes


def test_generous_workers_never_fail() -> None:
    cfg = preset("tinyllama-half")
    ws = workers(5, memory_bytes=model_bytes(cfg, 512) * 2)
    for strategy in STRATEGIES:
        place(cfg, ws, strategy, context_tokens=512)


def test_greedy_places_ffn_and_projection_before_any_head() -> None:
    cfg = preset("tinyllama")
    trace: list[Unit] = []
    place(cfg, workers(4), "greedy", context_tokens=256, trace=trace)
    n_serial = 2 * cfg.n_layers
    assert {u.kind for u in trace[:n_serial]} == {"ffn", "proj"}
    assert all(u.kind == "head" for u in trace[n_serial:])
    assert len(trace) == len(all_units(cfg))


def test_roundrobin_deals_heads_in_turn() -> None:
    cfg = preset("llama-tiny")
    placement = place(cfg, workers(3), "roundrobin", context_tokens=16)
    heads = [u for u in all_units(cfg) if u.kind == "head"]
    assert [placement[u] for u in heads[:6]] == ["worker1", "worker2", "worker3"] * 2
    # the rotation continues across layers: layer 1's head 0 is the 9th head dealt
    assert placement[Unit(1, "head", 0)] == "worker3"
    for layer in range(cfg.n_layers):
        assert placement[Unit(layer, "proj")] == placement[Unit(layer, "ffn")] == f"worker{layer % 3 + 1}"


@pytest.mark.parametrize("speeds", [(2e9, 2e9, 2e9, 2e9), (2e9, 4e9, 1e9, 2e9)])
def test_layerwise_keeps_each_layer_whole_and_contiguous(speeds: tuple[float, ...]) -> None:
    cfg = preset("tinyllama")
    ws = [WorkerSpec(f"worker{i}", 4 * GB, s, 10_000_000) for i, s in enumerate(speeds, 1)]
    placement = place(cfg, ws, "layerwise", context_tokens=256)
    owner: list[str] = []
    for layer in range(cfg.n_layers):
        on = {w for u, w in placement.items() if u.layer == layer}
        assert len(on) == 1, f"layer {layer} is split over {on}"
        owner.append(on.pop())
    # contiguous blocks, in worker-name order
    blocks = [w for i, w in enumerate(owner) if i == 0 or owner[i - 1] != w]
    assert blocks == sorted(set(owner), key=lambda name: int(name[6:]))
    counts = Counter(owner)
    assert sum(counts.values()) == cfg.n_layers
    if speeds[1] > speeds[0]:  # twice as fast: about twice the layers
        assert counts["worker2"] > counts["worker1"] > counts["worker3"]


def test_layerwise_respects_memory_before_speed() -> None:
    cfg = preset("tinyllama")
    per_layer = model_bytes(cfg, 256) // cfg.n_layers + 1
    # worker1 is 10x faster but holds only 3 layers
    ws = [WorkerSpec("worker1", 3 * per_layer + 1, 2e10, 0), *workers(3)[1:]]
    placement = place(cfg, ws, "layerwise", context_tokens=256)
    assert Counter(w for u, w in placement.items() if u.kind == "ffn")["worker1"] == 3


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_infeasible_raises_placement_error_naming_the_worker(strategy: Strategy) -> None:
    cfg = preset("tinyllama")
    ws = workers(4, memory_bytes=500_000_000)  # 2 GB in all, the model needs ~3.9 GB
    with pytest.raises(PlacementError) as caught:
        place(cfg, ws, strategy, context_tokens=256)
    exc = caught.value
    assert exc.worker in {w.name for w in ws}
    assert exc.limit_bytes == 500_000_000
    assert exc.needed_bytes > exc.limit_bytes
    assert exc.worker in str(exc) and "500.0 MB" in str(exc) and strategy in str(exc)
    assert isinstance(exc, ValueError)


def test_heterogeneous_faster_worker_gets_more_compute_under_greedy() -> None:
    cfg = preset("tinyllama")
    ws = [WorkerSpec(f"worker{i}", 4 * GB, 4e9 if i == 3 else 2e9, 10_000_000) for i in range(1, 5)]
    placement = place(cfg, ws, "greedy", context_tokens=256)
    flops: dict[str, float] = {}
    for u, w in placement.items():
        flops[w] = flops.get(w, 0.0) + unit_flops(cfg, u, 256)
    fast = flops.pop("worker3")
    assert fast > 1.5 * max(flops.values()), (fast, flops)


def test_greedy_balances_homogeneous_workers() -> None:
    cfg = preset("tinyllama")
    placement = place(cfg, workers(4), "greedy", context_tokens=256)
    used = bytes_by_worker(cfg, placement, 256)
    assert max(used.values()) < 1.25 * min(used.values()), used
    assert set(Counter(placement.values())) == {f"worker{i}" for i in range(1, 5)}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_placement_is_deterministic_and_independent_of_worker_order(strategy: Strategy) -> None:
    cfg = preset("llama-tiny")
    ws = [WorkerSpec(f"worker{i}", 10**8, 1e9 * (1 + i % 2), 1_000_000 * i) for i in range(1, 6)]
    first = place(cfg, ws, strategy, context_tokens=64)
    assert place(cfg, list(reversed(ws)), strategy, context_tokens=64) == first
    assert place(cfg, ws, strategy, context_tokens=64) == first


def test_names_sort_naturally() -> None:
    cfg = preset("gpt2-tiny")
    ws = [WorkerSpec(f"worker{i}", 10**8, 1e9, 0) for i in (10, 2, 1)]
    placement = place(cfg, ws, "roundrobin", context_tokens=8)
    assert [placement[Unit(0, "head", h)] for h in range(3)] == ["worker1", "worker2", "worker10"]


def test_bad_input_names_the_field() -> None:
    cfg = preset("gpt2-tiny")
    with pytest.raises(ValueError, match="strategy must be one of layerwise, roundrobin, greedy"):
        place(cfg, workers(2), "fastest", context_tokens=8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"workers\[1\].name 'worker1' appears twice"):
        place(cfg, [*workers(1), *workers(1)], "greedy", context_tokens=8)
    with pytest.raises(ValueError, match=r"workers\[0\].memory_bytes \(worker1\) must be > 0"):
        place(cfg, workers(1, memory_bytes=0), "greedy", context_tokens=8)
    with pytest.raises(ValueError, match=r"workers\[0\].flops_per_s"):
        place(cfg, workers(1, flops_per_s=0.0), "greedy", context_tokens=8)
    with pytest.raises(ValueError, match="context_tokens must be >= 0"):
        place(cfg, workers(1), "greedy", context_tokens=-1)
    with pytest.raises(ValueError, match="at least one worker"):
        place(cfg, [], "greedy", context_tokens=8)


# --- re-placement ---------------------------------------------------------------------------------


def shrink(ws: list[WorkerSpec], name: str, memory_bytes: int) -> list[WorkerSpec]:
    return [WorkerSpec(w.name, memory_bytes, w.flops_per_s, w.rtt_ns) if w.name == name else w for w in ws]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replace_moves_units_off_the_full_worker_only_and_fits(strategy: Strategy) -> None:
    cfg = preset("tinyllama")
    ws = workers(4)
    current = place(cfg, ws, strategy, context_tokens=128)
    horizon = 2048
    need = worker_bytes(cfg, current, "worker2", horizon)
    tight = shrink(ws, "worker2", int(need / 0.95))  # worker2 will be at 95 % of its limit: over 85 %
    new = replace(cfg, tight, current, tokens_so_far=128, tokens_ahead=horizon - 128)
    moved = moves(current, new)
    assert moved, "nothing moved off the full worker"
    assert {src for _, src, _ in moved} == {"worker2"}
    assert all(dst != "worker2" for _, _, dst in moved)
    after = bytes_by_worker(cfg, new, horizon)
    for w in tight:
        assert after.get(w.name, 0) <= 0.85 * w.memory_bytes, w.name
    # it moved little: heads before the big units, and not more than needed plus one group's worth
    assert Counter(u.kind for u, _, _ in moved)["ffn"] == 0
    freed = need - after["worker2"]
    assert freed < need - 0.85 * tight[1].memory_bytes + 8 * weight_bytes(
        cfg, Unit(0, "head", 0)
    ) + kv_copy_bytes(cfg, horizon)


def test_replace_relieves_two_full_workers_at_once() -> None:
    cfg = preset("tinyllama")
    ws = workers(4)
    current = place(cfg, ws, "roundrobin", context_tokens=128)
    tight = ws
    for name in ("worker1", "worker3"):
        tight = shrink(tight, name, int(worker_bytes(cfg, current, name, 1024) / 0.9))
    new = replace(cfg, tight, current, tokens_so_far=128, tokens_ahead=896)
    moved = moves(current, new)
    assert {src for _, src, _ in moved} == {"worker1", "worker3"}
    assert {dst for _, _, dst in moved} <= {"worker2", "worker4"}
    after = bytes_by_worker(cfg, new, 1024)
    assert all(after[w.name] <= 0.85 * w.memory_bytes for w in tight)


def test_replace_keeps_a_placement_that_fits() -> None:
    cfg = preset("tinyllama")
    ws = workers(4)
    current = place(cfg, ws, "greedy", context_tokens=256)
    new = replace(cfg, ws, current, tokens_so_far=256, tokens_ahead=256)
    assert new == current and new is not current
    assert moves(current, new) == []
    assert migration_bytes(cfg, current, new, 256) == 0


def test_replace_moves_heads_to_the_worker_with_most_headroom() -> None:
    cfg = preset("llama-tiny")
    current = {u: "worker1" for u in all_units(cfg)}  # everything on worker1, nothing elsewhere
    total = worker_bytes(cfg, current, "worker1", 100)
    ws = [WorkerSpec("worker1", int(total / 0.9), 1e9, 0), WorkerSpec("worker2", 10 * total, 1e9, 0)]
    ws.append(WorkerSpec("worker3", 2 * total, 1e9, 0))
    new = replace(cfg, ws, current, tokens_so_far=10, tokens_ahead=90)
    moved = moves(current, new)
    assert moved and all(u.kind == "head" for u, _, _ in moved)
    assert {dst for _, _, dst in moved} == {"worker2"}
    # a whole group moved: the destination got one KV copy per group, with the cache at tokens_so_far
    groups = {(u.layer, cfg.kv_head_of(u.head)) for u, _, _ in moved}
    assert migration_bytes(cfg, current, new, 10) == len(moved) * weight_bytes(cfg, moved[0][0]) + len(
        groups
    ) * kv_copy_bytes(cfg, 10)
    assert len(moved) == len(groups) * cfg.group_size


def test_replace_takes_measured_overhead_into_account() -> None:
    cfg = preset("tinyllama")
    ws = workers(4)
    current = place(cfg, ws, "greedy", context_tokens=256)
    assert replace(cfg, ws, current, tokens_so_far=256, tokens_ahead=256) == current
    # the engine measured 3 GB more on worker4 than the model counts: it must shed units
    new = replace(
        cfg, ws, current, tokens_so_far=256, tokens_ahead=256, overhead_bytes={"worker4": 2_700_000_000}
    )
    moved = moves(current, new)
    assert moved and {src for _, src, _ in moved} == {"worker4"}
    assert worker_bytes(cfg, new, "worker4", 512) + 2_700_000_000 <= 0.85 * 4 * GB


def test_replace_falls_back_to_the_limit_then_fails_naming_the_worker() -> None:
    cfg = preset("tinyllama")
    ws = workers(4)
    current = place(cfg, ws, "greedy", context_tokens=256)
    # every worker at ~90 % of its limit: nobody can go under 85 %, but all still fit under 100 %
    tight = [WorkerSpec(w.name, int(worker_bytes(cfg, current, w.name, 512) / 0.9), 2e9, 0) for w in ws]
    assert replace(cfg, tight, current, tokens_so_far=256, tokens_ahead=256) == current
    # worker1 over its very limit and nobody has room
    tighter = shrink(tight, "worker1", worker_bytes(cfg, current, "worker1", 512) // 2)
    with pytest.raises(PlacementError) as caught:
        replace(cfg, tighter, current, tokens_so_far=256, tokens_ahead=256)
    assert caught.value.worker == "worker1"
    assert caught.value.needed_bytes > caught.value.limit_bytes == tighter[0].memory_bytes
    assert "worker1" in str(caught.value)


def test_replace_rejects_a_placement_of_another_model() -> None:
    cfg = preset("llama-tiny")
    current = place(cfg, workers(2), "greedy", context_tokens=8)
    del current[Unit(0, "ffn")]
    with pytest.raises(ValueError, match=r"L0.ffn is not placed"):
        replace(cfg, workers(2), current, tokens_so_far=8, tokens_ahead=8)
    current[Unit(0, "ffn")] = "worker9"
    with pytest.raises(ValueError, match="worker9"):
        replace(cfg, workers(2), current, tokens_so_far=8, tokens_ahead=8)


def test_moves_and_migration_bytes_by_hand() -> None:
    cfg = preset("llama-tiny")
    old = {u: "worker1" for u in all_units(cfg)}
    new = dict(old)
    new[Unit(1, "head", 0)] = "worker2"
    new[Unit(1, "head", 1)] = "worker2"  # same KV group: one KV slice
    new[Unit(2, "proj")] = "worker3"
    assert moves(old, new) == [
        (Unit(1, "head", 0), "worker1", "worker2"),
        (Unit(1, "head", 1), "worker1", "worker2"),
        (Unit(2, "proj"), "worker1", "worker3"),
    ]
    expected = 2 * weight_bytes(cfg, Unit(1, "head", 0)) + weight_bytes(cfg, Unit(2, "proj"))
    assert migration_bytes(cfg, old, new, 0) == expected + kv_weight_bytes(cfg)
    assert migration_bytes(cfg, old, new, 7) == expected + kv_weight_bytes(
        cfg
    ) + 7 * kv_cache_bytes_per_token(cfg)
    with pytest.raises(ValueError, match="differ in their units"):
        moves(old, {u: w for u, w in new.items() if u.kind != "ffn"})


def test_placement_json_round_trip() -> None:
    cfg = preset("llama-tiny")
    placement = place(cfg, workers(3), "greedy", context_tokens=32)
    doc = placement_to_json(placement)
    assert doc["L0.head0"] == placement[Unit(0, "head", 0)] and doc["L3.ffn"] == placement[Unit(3, "ffn")]
    assert placement_from_json(cfg, doc, ["worker1", "worker2", "worker3"]) == placement
    with pytest.raises(ValueError, match=r"placement.units\['L0.head0'\]: 'worker9' is not one of"):
        placement_from_json(cfg, {**doc, "L0.head0": "worker9"}, ["worker1", "worker2", "worker3"])
    with pytest.raises(ValueError, match=r"placement.units\['L9.ffn'\]: llama-tiny has no such unit"):
        placement_from_json(cfg, {**doc, "L9.ffn": "worker1"}, ["worker1", "worker2", "worker3"])
    with pytest.raises(ValueError, match=r"placement.units\['head0'\]: not a unit key like"):
        placement_from_json(cfg, {**doc, "head0": "worker1"}, ["worker1", "worker2", "worker3"])
    with pytest.raises(ValueError, match=r"placement.units: L2.proj is not placed"):
        placement_from_json(
            cfg, {k: v for k, v in doc.items() if k != "L2.proj"}, ["worker1", "worker2", "worker3"]
        )


def test_estimate_token_s_by_hand_on_one_worker() -> None:
    cfg = preset("llama-tiny")
    ws = [WorkerSpec("worker1", 10**9, 1e9, 2_000_000)]
    placement = place(cfg, ws, "greedy", context_tokens=10)
    per_layer = (
        cfg.n_heads * unit_flops(cfg, Unit(0, "head", 0), 10)
        + cfg.n_kv_heads * kv_flops(cfg)
        + unit_flops(cfg, Unit(0, "proj"), 10)
        + unit_flops(cfg, Unit(0, "ffn"), 10)
    ) / 1e9
    # X from the controller into layer 0 and the last layer's output back: one round trip (+15 %) and
    # 4 * hidden bytes at 12.5 MB/s each; everything else stays on the worker
    edges = 2 * (1.15 * 0.002 + 4 * cfg.hidden / 12.5e6)
    assert estimate_token_s(cfg, ws, placement, context_tokens=10) == pytest.approx(
        cfg.n_layers * per_layer + edges
    )


@pytest.mark.parametrize("rtt_ms", [0, 10, 25])
def test_greedy_is_no_slower_than_roundrobin_in_its_cost_model(rtt_ms: int) -> None:
    cfg = preset("tinyllama")
    ws = workers(4, rtt_ns=rtt_ms * 1_000_000)
    cost = {
        s: estimate_token_s(cfg, ws, place(cfg, ws, s, context_tokens=256), context_tokens=256)
        for s in STRATEGIES
    }
    assert cost["greedy"] <= cost["roundrobin"] * 1.001, cost
    if rtt_ms == 0:  # with free links, spreading the heads beats keeping each layer on one worker
        assert cost["greedy"] < cost["layerwise"], cost


#: TinyLlama's decode steps at 64 tokens of context as engine.time_unit_steps timed them on the project's
#: 2-core machine (one thread, loaded): a layer's 32 heads with their 4 KV copies 17 ms (0.53 ms a head,
#: mostly kernel dispatch), the projection 3.6 ms, the FFN 25 ms. The matmul micro-benchmark's 30 GFLOP/s
#: priced the same head at 9 us and the heads of a layer at 0.3 ms.
TINYLLAMA_STEP_S = (17e-3, 3.6e-3, 25e-3)


def heads_spread(cfg: ModelConfig, placement: dict[Unit, str]) -> list[int]:
    """Per layer, how many workers hold its query heads."""
    return [
        len({placement[Unit(layer, "head", h)] for h in range(cfg.n_heads)}) for layer in range(cfg.n_layers)
    ]


def test_step_rates_give_back_the_timed_steps() -> None:
    cfg = preset("tinyllama")
    head_rate, proj_rate, ffn_rate = step_rates(cfg, 64, TINYLLAMA_STEP_S)
    heads = cfg.n_heads * unit_flops(cfg, Unit(0, "head", 0), 64) + cfg.n_kv_heads * kv_flops(cfg)
    assert heads / head_rate == pytest.approx(17e-3)
    assert unit_flops(cfg, Unit(0, "proj"), 64) / proj_rate == pytest.approx(3.6e-3)
    assert unit_flops(cfg, Unit(0, "ffn"), 64) / ffn_rate == pytest.approx(25e-3)
    with pytest.raises(ValueError, match=r"step_s must give the \(heads, proj, ffn\) seconds"):
        step_rates(cfg, 64, (17e-3, 0.0, 25e-3))


def test_greedy_at_measured_step_costs_splits_heads_unless_messages_dominate() -> None:
    """Priced at what a head's decode step costs (0.53 ms), greedy spreads every layer's heads over the
    4 workers when a message costs what one did on a token's path on the emulated rack (6 ms), and
    predicts that faster than layer-wise; when a message costs
    100 ms it keeps every layer's heads on the worker its input comes from wherever that also holds
    the projection (the heads a message would take off it cost less than the message). Priced at the
    matmul micro-benchmark's rate (a head 9 us), no layer's heads went beyond the two workers its
    messages visit anyway: nearly layer-wise, as measured on the rack (issue 47)."""
    cfg = preset("tinyllama")
    rates = step_rates(cfg, 64, TINYLLAMA_STEP_S)

    def greedy(message_ms: float, unit_rates: tuple[float, float, float] | None) -> dict[Unit, str]:
        ws = [WorkerSpec(f"worker{i}", 64 * GB, 30e9, int(message_ms * 1e6), unit_rates) for i in range(1, 5)]
        return place(cfg, ws, "greedy", context_tokens=64)

    cheap = greedy(6, rates)
    assert heads_spread(cfg, cheap) == [4] * cfg.n_layers
    ws = [WorkerSpec(f"worker{i}", 64 * GB, 30e9, 6_000_000, rates) for i in range(1, 5)]
    layerwise = place(cfg, ws, "layerwise", context_tokens=64)
    assert estimate_token_s(cfg, ws, cheap, context_tokens=64) < estimate_token_s(
        cfg, ws, layerwise, context_tokens=64
    )
    # the matmul's price: heads leave the layer's input worker only for the projection's, where the
    # layer crosses a link anyway
    matmul = greedy(6, None)
    assert max(heads_spread(cfg, matmul)) <= 2, heads_spread(cfg, matmul)

    dear = greedy(100, rates)
    whole = 0
    for layer, spread in enumerate(heads_spread(cfg, dear)):
        source = dear[Unit(layer - 1, "ffn")] if layer else None
        if source == dear[Unit(layer, "proj")]:
            assert spread == 1, (layer, spread)
            assert dear[Unit(layer, "head", 0)] == source
            whole += 1
    assert whole >= cfg.n_layers / 2
