"""dit.sim.engine's control "rpc": the calls and pulls HeadSplit's controller makes per token
(headsplit.engine.Engine.step), counted by hand for each strategy on a small model, and the time they
take when only the round trips cost anything."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")

from dit.sim.engine import Device, SimConfig, SimError, simulate
from dit.sim.placement_model import Placement, place
from headsplit.placement import WorkerSpec
from tests.sim_fixtures import HAND4

# two layers of four heads (two KV heads), two equal workers
MODEL = HAND4
# compute and bytes next to free: a token costs its round trips alone
A = Device("a", flops_per_s=1e18, memory_bytes=10**9, rtt_s=0.01, bandwidth_bytes_per_s=1e18)
B = Device("b", flops_per_s=1e18, memory_bytes=10**9, rtt_s=0.03, bandwidth_bytes_per_s=1e18)
SPECS = [WorkerSpec("a", 10**9, 1e9, 10**6), WorkerSpec("b", 10**9, 1e9, 10**6)]


def placed(strategy: str) -> Placement:
    return dict(place(MODEL, SPECS, strategy, context_tokens=8))  # type: ignore[arg-type]


def where(placement: Placement) -> list[tuple[list[str], str, str]]:
    """Per layer: the worker of each head, the projection's, the FFN's."""
    return [
        (
            [placement[u] for u in sorted(u for u in placement if u.layer == layer and u.kind == "head")],
            next(w for u, w in placement.items() if u.layer == layer and u.kind == "proj"),
            next(w for u, w in placement.items() if u.layer == layer and u.kind == "ffn"),
        )
        for layer in range(MODEL.n_layers)
    ]


def rpc(placement: Placement, tokens: int = 1, **kw: object) -> SimConfig:
    return SimConfig(MODEL, [A, B], placement, tokens, control="rpc", worker_rtt="sum", **kw)  # type: ignore[arg-type]


# The counts, from Engine.step: per layer one heads call per worker holding a head (each pulls X from
# its holder unless it holds it: the controller for layer 0, else the previous FFN's worker), one
# projection call (pulls each other worker's head outputs, and X unless it holds it), one FFN call
# (pulls Z unless it is the projection's worker); then the controller's fetch of the last X (a call).
@pytest.mark.parametrize(
    ("strategy", "layout", "calls", "pulls"),
    [
        # L0 on a: heads call + X from the controller, proj call + X from the controller, FFN call
        # L1 on b: heads call + X from a, proj call + X from a, FFN call; fetch: 7 calls, 4 pulls
        ("layerwise", [(["a"] * 4, "a", "a"), (["b"] * 4, "b", "b")], 7, 4),
        # L0: heads calls on a and b, both pull X from the controller; proj on a pulls b's outputs and X
        # L1: heads on a (X is a's) and b (pulls it), proj on b pulls a's outputs and X: 9 calls, 7 pulls
        ("roundrobin", [(["a", "b", "a", "b"], "a", "a"), (["a", "b", "a", "b"], "b", "b")], 9, 7),
        # L0 as layerwise (3 calls, 2 pulls); L1: heads on a and b (b pulls X), proj on b pulls a's
        # outputs and X: 4 calls, 3 pulls; fetch: 8 calls, 5 pulls
        ("greedy", [(["a"] * 4, "a", "a"), (["a", "a", "a", "b"], "b", "b")], 8, 5),
    ],
)
def test_each_strategy_makes_the_calls_and_pulls_headsplit_makes(
    strategy: str, layout: list[tuple[list[str], str, str]], calls: int, pulls: int
) -> None:
    placement = placed(strategy)
    assert where(placement) == layout  # the placement the counts were derived for
    result = simulate(rpc(placement, tokens=3))
    assert (result.calls, result.pulls) == (3 * calls, 3 * pulls)


@pytest.mark.parametrize(
    ("acceptance", "calls", "pulls"),
    [
        # greedy's 8 calls and 5 pulls; L1's heads also start on Z while L0's FFN runs: calls on a and
        # b, b pulls Z from a (2 calls, 1 pull); rejected, L1's heads run again on X as without it
        (0.0, 10, 6),
        # kept: L1's heads stage is not run again (2 calls and 1 pull fewer)
        (1.0, 8, 5),
    ],
)
def test_speculation_adds_the_early_heads_calls_and_a_rejection_runs_them_again(
    acceptance: float, calls: int, pulls: int
) -> None:
    result = simulate(rpc(placed("greedy"), speculation=True, acceptance=(acceptance,)))
    assert (result.calls, result.pulls, result.speculated) == (calls, pulls, 1)
    assert result.reexecuted == (1 if acceptance == 0 else 0)


def test_a_layerwise_token_costs_its_round_trips_in_turn() -> None:
    # a call to a costs its RTT 0.01, to b 0.03; a pull from the controller the worker's RTT, between a
    # and b through the controller 0.01 + 0.03 = 0.04. L0 on a: heads 0.01 + 0.01, proj 0.01 + 0.01,
    # FFN 0.01 -> 0.05; L1 on b: heads 0.03 + 0.04, proj 0.03 + 0.04, FFN 0.03 -> 0.22; fetch 0.03.
    placement = placed("layerwise")
    assert simulate(rpc(placement)).token_s == [pytest.approx(0.25, abs=1e-9)]
    # each of the 6 stage calls, one after the other, pays a per-call cost once; the fetch is a get
    # the worker serves outside its calls (rpc.remote_get), as a pull is
    slow = rpc(placement)
    slow = replace(slow, devices=[replace(d, call_overhead_s=0.002) for d in slow.devices])
    assert simulate(slow).token_s == [pytest.approx(0.25 + 6 * 0.002, abs=1e-9)]
    # every endpoint behind one access point: a to b is the mean of their RTTs, 0.02 (2 pulls)
    assert simulate(replace(rpc(placement), worker_rtt="mean")).token_s == [pytest.approx(0.21, abs=1e-9)]


def test_a_workers_calls_run_one_at_a_time() -> None:
    # greedy's placement, speculating (kept); every call to a costs 0.1 s more (its per-call cost).
    # L0 on a: heads 0.005 + 0.1 + 0.01 (X from the controller) + 0.005, proj the same -> 0.24.
    # Then the FFN's call and L1's early heads calls are issued together: a's two (the early heads on
    # Z, which a holds) take a in turn, 0.005 + 0.1 + 0.1 + 0.005 -> 0.45; b's early heads pull Z from
    # a (0.04, not a call: a need not be free) -> 0.35. L1's projection on b pulls a's outputs and X
    # (0.03 + 0.04 + 0.04) -> 0.56, its FFN 0.03 -> 0.59, the fetch 0.03 -> 0.62. Were a's two calls
    # in parallel, 0.52.
    slow_a = replace(A, call_overhead_s=0.1)
    config = replace(rpc(placed("greedy"), speculation=True, acceptance=(1.0,)), devices=[slow_a, B])
    assert simulate(config).token_s == [pytest.approx(0.62, abs=1e-9)]


def test_an_unknown_control_is_refused_naming_the_field() -> None:
    with pytest.raises(SimError, match=r"^control: one of dataflow, rpc, got 'push'"):
        simulate(replace(rpc(placed("layerwise")), control="push"))


def test_per_kind_rates_cost_each_kind_of_unit_in_a_decode_step() -> None:
    # one worker; the FFN (6 * 16 * 32 = 3072 FLOPs per layer) at 1000 FLOP/s adds 2 * 3.072 s
    only = Device("a", 1e18, 10**9, 0.0, 1e18)
    placement = {u: "a" for u in placed("layerwise")}
    base = simulate(SimConfig(MODEL, [only], placement, 1, control="rpc")).token_s[0]
    slow_ffn = replace(only, unit_flops_per_s=(1e18, 1e18, 1000.0))
    token = simulate(SimConfig(MODEL, [slow_ffn], placement, 1, control="rpc")).token_s[0]
    assert token - base == pytest.approx(2 * 3072 / 1000, rel=1e-9)


def test_the_memory_sample_after_a_token_is_in_the_wall_time_not_the_token() -> None:
    # Engine._memory: after the token's clock stops, one nbytes call to each worker in turn (0.01 to a,
    # 0.03 to b); HeadSplit's tokens/s counts it (end_ns - start_ns), its total_ns does not
    result = simulate(rpc(placed("layerwise"), tokens=2))
    assert result.token_s == [pytest.approx(0.25, abs=1e-9)] * 2
    assert result.between_s == [pytest.approx(0.04, abs=1e-9)] * 2
    assert result.tokens_per_s == pytest.approx(2 / (2 * 0.29))
    assert result.calls == 2 * 7  # the samples are not the token's calls
