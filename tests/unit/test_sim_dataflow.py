"""dit.sim.engine's control "dataflow" (HeadSplit's design, DESIGN.md section 9): every stage pushes its
output to its consumers, one way, and a token's critical path holds W + 1 messages layer-wise over W
workers, at most 3L + 1 head-level over L layers (the design's bound is 3L + 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")

from dit.sim.engine import Device, SimConfig, simulate
from dit.sim.placement_model import PRESETS, Placement, place
from headsplit.placement import WorkerSpec
from headsplit.units import Unit

TINYLLAMA = PRESETS["tinyllama"]  # the real geometry: 22 layers, 32 heads of 64, 4 KV heads
L = TINYLLAMA.n_layers
ONE_WAY_S = 0.005
# compute and bytes next to free: a token costs its messages' one-way latencies alone
FREE = [Device(f"w{i}", 1e18, 10**10, 2 * ONE_WAY_S, 1e18) for i in range(1, 5)]
SPECS = [WorkerSpec(d.name, d.memory_bytes, 2e9, round(d.rtt_s * 1e9)) for d in FREE]


def placed(strategy: str) -> Placement:
    return dict(place(TINYLLAMA, SPECS, strategy, context_tokens=264))  # type: ignore[arg-type]


def every_stage_apart() -> Placement:
    """Each layer's heads on w1 and w2, its projection on w3, its FFN on w4: every stage crosses."""
    p: Placement = {}
    for layer in range(L):
        p |= {Unit(layer, "head", h): ("w1" if h % 2 else "w2") for h in range(TINYLLAMA.n_heads)}
        p |= {Unit(layer, "proj"): "w3", Unit(layer, "ffn"): "w4"}
    return p


def chain(placement: Placement) -> int:
    """The design's count, stage by stage: X to a head worker that does not hold it, a head worker's
    outputs to another projection worker, Z to another FFN worker; the longest chain, the last X home."""
    at, hops = "controller", 0
    for layer in range(L):
        heads = {placement[Unit(layer, "head", h)] for h in range(TINYLLAMA.n_heads)}
        proj, ffn = placement[Unit(layer, "proj")], placement[Unit(layer, "ffn")]
        at_proj = max(hops + (w != at) + (w != proj) for w in heads | {proj})
        hops, at = at_proj + (proj != ffn), ffn
    return hops + 1


def token(placement: Placement, **kw: object) -> tuple[float, int, int]:
    r = simulate(SimConfig(TINYLLAMA, FREE, placement, tokens=1, **kw))  # type: ignore[arg-type]
    return r.token_s[0], r.critical_messages[0], r.messages


@pytest.mark.parametrize(
    ("placement", "critical"),
    [
        # controller -> w1, w1 -> w2, w2 -> w3, w3 -> w4, w4 -> controller: W + 1
        (lambda: placed("layerwise"), 4 + 1),
        # per layer X to the head workers and their outputs to the projection's worker, which holds
        # the FFN too (HeadSplit's round-robin puts both on one worker), then the last X home: 2L + 1
        (lambda: placed("roundrobin"), 2 * L + 1),
        # greedy places each projection with its FFN, and its layers' heads on one or two workers,
        # one of them the previous FFN's: fewer crossings than round-robin
        (lambda: placed("greedy"), chain(placed("greedy"))),
        # X to the heads, outputs to the projection, Z to the FFN per layer, the last X home: 3L + 1
        (every_stage_apart, 3 * L + 1),
    ],
    ids=["layerwise", "roundrobin", "greedy", "every-stage-apart"],
)
def test_a_tokens_critical_path_holds_the_designs_messages_each_one_way(placement, critical) -> None:  # type: ignore[no-untyped-def]
    seconds, on_path, sent = token(placement())
    assert on_path == critical <= 3 * L + 2
    # nothing else costs: the token is its critical path's messages, one way each (not a round trip)
    assert seconds == pytest.approx(critical * ONE_WAY_S, rel=1e-6)
    assert sent >= on_path


def test_the_counts_oracle_agrees_with_the_literal_counts() -> None:
    assert [chain(placed("layerwise")), chain(placed("roundrobin")), chain(every_stage_apart())] == [
        5,
        2 * L + 1,
        3 * L + 1,
    ]


def test_accepted_speculation_takes_a_message_per_layer_off_the_critical_path() -> None:
    # Z goes from the projection's worker to the next layer's head workers while Z goes to the FFN's:
    # the next projection waits for two messages after this one's (Z out, head outputs back; Z to the
    # FFN, X to the projection), not three: 2 for layer 0, 2 a layer after, Z to the last FFN, X home
    seconds, on_path, _ = token(every_stage_apart(), speculation=True, acceptance=(1.0,))
    assert on_path == 2 * L + 2
    assert seconds == pytest.approx((2 * L + 2) * ONE_WAY_S, rel=1e-6)
    # rejected, the heads run again on X: the path is the plain one
    assert token(every_stage_apart(), speculation=True, acceptance=(0.0,))[1] == 3 * L + 1


def test_a_layer_whose_heads_all_sit_with_the_previous_ffn_does_not_speculate() -> None:
    # Layer-wise, within a worker's block of layers the FFN's worker would run the next layer's heads
    # itself, before or after the FFN: speculating there fills no idle time and a rejection only adds
    # work, so those layers run exactly; at the 3 boundaries between 4 workers the next worker idles
    # during the FFN, and speculates.
    spec = simulate(
        SimConfig(TINYLLAMA, FREE, placed("layerwise"), tokens=2, speculation=True, acceptance=(1.0,))
    )
    assert (spec.speculated, spec.reexecuted) == (2 * 3, 0)
    everywhere = simulate(SimConfig(TINYLLAMA, FREE, every_stage_apart(), tokens=2, speculation=True))
    assert everywhere.speculated == 2 * (L - 1)


def test_a_push_costs_its_senders_own_delay_not_half_a_round_trip() -> None:
    """A link emulator or netem delays what a device sends (a local run's or the rack's device-to-device
    ping reads the sum of the two devices' delays): layer-wise, the controller's start is not delayed,
    each worker's hand-over and the last X home cost the sender's ``send_s``."""
    sends = [0.001, 0.002, 0.003, 0.004]
    devices = [replace(d, send_s=s) for d, s in zip(FREE, sends, strict=True)]
    r = simulate(SimConfig(TINYLLAMA, devices, placed("layerwise"), tokens=1, controller_send_s=0.0))
    assert r.critical_messages == [5]
    # controller -> w1 free, then w1 -> w2, w2 -> w3, w3 -> w4 and w4 -> controller at their senders'
    assert r.token_s[0] == pytest.approx(sum(sends), rel=1e-6)
    # without send_s: half the round trip each way, as before (the article's fit relies on it)
    assert token(placed("layerwise"))[0] == pytest.approx(5 * ONE_WAY_S, rel=1e-6)


def test_stage_times_are_wall_time_through_a_cpu_quota_and_the_controller_is_on_the_path() -> None:
    """HeadSplit times a stage on the worker's clock, so through a CPU quota a stage's recorded time is
    its wall time, not its CPU time (a replay fits its rates to them); the controller's own compute
    (embedding, LM head) lengthens the token; ``critical_s`` is the compute on the longest chain."""
    quota = [
        Device(f"w{i}", 1e7, 10**10, 0.0, 1e18, cpu_quota_s=0.001, cpu_period_s=0.004) for i in range(1, 5)
    ]
    free_cpu = [replace(d, cpu_quota_s=None) for d in quota]
    small = PRESETS["gpt2-tiny"]
    specs = [WorkerSpec(d.name, d.memory_bytes, 1e9, 0) for d in quota]
    layerwise = dict(place(small, specs, "layerwise", context_tokens=16))
    cpu = simulate(SimConfig(small, free_cpu, layerwise, tokens=2))
    wall = simulate(SimConfig(small, quota, layerwise, tokens=2, controller_s=(0.0, 0.010)))
    # at 25 % of a CPU, work longer than the 1 ms budget takes about 4 times its CPU time
    assert sum(wall.stage_s[1]) > 3 * sum(cpu.stage_s[1])
    # layer-wise: every stage is on the one chain, and the token is that compute plus the controller's
    assert wall.critical_s[1] == pytest.approx(sum(wall.stage_s[1]), rel=1e-9)
    assert wall.token_s[1] == pytest.approx(wall.critical_s[1] + 0.010, rel=1e-6)
