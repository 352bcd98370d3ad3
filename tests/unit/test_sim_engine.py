"""dit.sim.engine: a hand-computed token, KV growth per token, out of memory and re-placement."""

from __future__ import annotations

import pytest

pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")

from dit.sim.engine import Device, SimConfig, SimError, simulate
from dit.sim.galaxy import head_shares, simulate_galaxy
from dit.sim.placement_model import place
from dit.sim.spec import worker_specs
from headsplit.config import ModelConfig
from headsplit.units import Unit

# d = 8, head_dim = 4, ffn 16, two heads with a KV head each: per unit at 1 key
#   head 2*8*4 + 4*1*4 = 80 FLOPs, its KV copy 4*8*4 = 128, projection 2*8*8 = 128, FFN (gpt2) 4*8*16 = 512
TINY = ModelConfig(
    "hand", "gpt2", n_layers=2, n_heads=2, n_kv_heads=2, hidden=8, ffn_hidden=16, vocab=16, max_positions=64
)
A = Device("a", flops_per_s=1000.0, memory_bytes=10**9, rtt_s=0.01, bandwidth_bytes_per_s=1000.0)
B = Device("b", flops_per_s=2000.0, memory_bytes=10**9, rtt_s=0.03, bandwidth_bytes_per_s=1000.0)
SPLIT = {
    Unit(0, "head", 0): "a",
    Unit(0, "head", 1): "b",
    Unit(0, "proj"): "a",
    Unit(0, "ffn"): "a",
    Unit(1, "head", 0): "b",
    Unit(1, "head", 1): "b",
    Unit(1, "proj"): "b",
    Unit(1, "ffn"): "b",
}


def test_one_token_over_two_devices_takes_the_hand_computed_time() -> None:
    # Every message is pushed: one way (half the round trip) + bytes over bandwidth.
    # Layer 0 from the controller. a: X (32 B) in 0.005 + 0.032, head0 + KV 208/1000 -> 0.245.
    #   b: X in 0.015 + 0.032 = 0.047, head1 + KV 208/2000 -> 0.151, its output (16 B) to a over the
    #   a-b link (rtt (0.01 + 0.03) / 2 = 0.02, one way 0.01) + 0.016 -> 0.177. Projection on a after
    #   both: 0.245 + 0.128, FFN on a + 0.512 -> 0.885.
    # Layer 1 from a: X to b 0.01 + 0.032 -> 0.927, two heads + two KV copies 416/2000 -> 1.135,
    #   projection 128/2000 -> 1.199, FFN 512/2000 -> 1.455; the output to the controller 0.015 + 0.032
    #   -> 1.502.
    result = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=1))
    assert result.token_s == [pytest.approx(1.502, abs=1e-9)]
    assert result.oom is None and result.migrations == []
    # messages: X to a and to b, b's outputs to a, X to b, the last X home; the longest chain is
    # controller -> b -> a -> b -> controller
    assert (result.messages, result.critical_messages) == (5, [4])


def test_the_attention_cost_grows_with_the_context() -> None:
    result = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=3))
    # each further key adds 4 * head_dim = 16 FLOPs per head: a's one head of layer 0 sets the
    # layer-0 stage (+0.016 s), b's two heads of layer 1 add 32 / 2000 = 0.016 s
    assert result.token_s[1] - result.token_s[0] == pytest.approx(0.032, abs=1e-9)
    assert result.token_s[2] - result.token_s[1] == pytest.approx(0.032, abs=1e-9)


def test_the_kv_cache_grows_by_one_token_per_group_held_per_step() -> None:
    result = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=4))
    # one token of one KV head: k and v, head_dim 4, float32 = 32 bytes; a holds 1 group, b holds 3
    growth = [
        {d: after[d] - before[d] for d in after}
        for before, after in zip(result.memory, result.memory[1:], strict=False)
    ]
    assert growth == [{"a": 32, "b": 96}] * 3


def test_a_device_out_of_memory_stops_generation_where_a_run_would() -> None:
    first = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=1)).memory[0]["b"]
    small_b = Device("b", 2000.0, first + 96 * 2, 0.03, 1000.0)  # room for two more tokens, not three
    result = simulate(SimConfig(TINY, [A, small_b], SPLIT, tokens=10))
    assert len(result.token_s) == 4
    assert result.oom is not None and result.oom.startswith("b at token 3")


def test_re_placement_at_the_threshold_moves_units_and_generation_goes_on() -> None:
    first = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=1)).memory[0]["b"]
    small_b = Device("b", 2000.0, first + 96 * 2, 0.03, 1000.0)
    result = simulate(SimConfig(TINY, [A, small_b], SPLIT, tokens=10, replacement=True, threshold=0.99))
    assert result.oom is None and len(result.token_s) == 10
    assert result.migrations and result.migrations[0].bytes > 0 and result.migrations[0].seconds > 0
    assert result.placement != SPLIT


def test_headsplit_placements_are_the_ones_headsplit_makes() -> None:
    specs = worker_specs([A, B])
    for strategy in ("layerwise", "roundrobin", "greedy"):
        placement = place(TINY, specs, strategy, context_tokens=8)  # type: ignore[arg-type]
        result = simulate(SimConfig(TINY, [A, B], placement, tokens=2))
        assert len(result.token_s) == 2 and result.events > 0


def test_a_unit_on_an_unknown_device_is_refused_naming_it() -> None:
    with pytest.raises(SimError, match=r"L0.head0 is on 'c'"):
        simulate(SimConfig(TINY, [A, B], {**SPLIT, Unit(0, "head", 0): "c"}, tokens=1))


def test_accepted_speculation_overlaps_the_next_layers_heads_with_the_ffn() -> None:
    # As the hand-computed token, but layer 1's heads start on Z when a's projection ends (0.373):
    # Z to b 0.042 -> 0.415, heads 0.208 -> 0.623, while a's FFN ends at 0.885; accepted, b's projection
    # still needs the true X from a: 0.885 + 0.042 -> 0.927, projection 0.064 -> 0.991, FFN 0.256 ->
    # 1.247, output to the controller 0.047 -> 1.294 (against 1.502 without speculation).
    result = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=1, speculation=True, acceptance=(1.0,)))
    assert result.token_s == [pytest.approx(1.294, abs=1e-9)]
    assert (result.speculated, result.reexecuted) == (1, 0)


def test_rejected_speculation_re_executes_and_is_never_faster() -> None:
    plain = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=3)).token_s
    rejected = simulate(SimConfig(TINY, [A, B], SPLIT, tokens=3, speculation=True, acceptance=(0.0,)))
    assert rejected.reexecuted == rejected.speculated == 3
    assert all(r >= p - 1e-12 for r, p in zip(rejected.token_s, plain, strict=True))


def test_galaxy_one_token_takes_the_hand_computed_time() -> None:
    # shares 1/3 (a) and 2/3 (b); one head each. X to both: 0.062. Attention + projection rows:
    # a (80 + 128 + 128/3) / 1000 = 0.250667 -> 0.312667; all-reduce of 32 B over 2: 2 steps of
    # 0.02 + 16/1000 -> 0.384667; FFN 512/3/1000 = 1024/3/2000 = 0.170667 -> 0.555333; all-reduce -> 0.627333.
    # Layer 1: + 0.250667 + 0.072 + 0.170667 + 0.072 -> 1.192667; a's output to the controller +0.042.
    result = simulate_galaxy(SimConfig(TINY, [A, B], SPLIT, tokens=1, partitioning="galaxy"))
    assert result.token_s == [pytest.approx(1.234667, abs=1e-6)]
    assert head_shares(32, [1.0, 2.0, 5.0]) == [4, 8, 20]


def test_speculative_heads_never_hold_up_the_ffn_on_its_own_worker() -> None:
    # Layer 0's projection on b, its FFN on a; layer 1 has a head on a. a runs the FFN (the critical
    # path) and its layer-1 head after it on the true X; only b's head speculates on Z. A rejected
    # speculation then costs nothing the token would not pay without it (1.490 s), where a speculative
    # head on a would have held a's core when the true X came to re-run it (1.698 s).
    shared = {**SPLIT, Unit(0, "proj"): "b", Unit(1, "head", 0): "a"}
    plain = simulate(SimConfig(TINY, [A, B], shared, tokens=1)).token_s[0]
    rejected = simulate(SimConfig(TINY, [A, B], shared, tokens=1, speculation=True, acceptance=(0.0,)))
    assert plain == pytest.approx(1.490, abs=1e-9)
    assert (rejected.speculated, rejected.reexecuted) == (1, 1)
    assert rejected.token_s[0] == pytest.approx(plain, abs=1e-9)


def test_a_kept_speculations_heads_and_the_ffn_workers_own_are_one_heads_stage() -> None:
    # layer 1: b's head speculated on Z (208 / 2000 = 0.104 s), a's run after a's FFN (208 / 1000 =
    # 0.208 s): one stage, its slowest worker's 0.208 s; layer 0's stage is a's 0.208 s
    shared = {**SPLIT, Unit(1, "head", 0): "a"}
    kept = simulate(SimConfig(TINY, [A, B], shared, tokens=1, speculation=True, acceptance=(1.0,)))
    assert kept.stage_s[0][0] == pytest.approx(0.416, abs=1e-9)
