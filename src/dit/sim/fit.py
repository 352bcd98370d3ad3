"""The article's rack fitted to its own Chapter 6 figures (``dit simulate --fit-article``).

The article gives, for 256 tokens of TinyLlama on four Raspberry Pi 4 boards over Wi-Fi (8-12 ms RTT
between boards), layer-wise 62.4 s, round-robin 44.8 s and greedy 40.0 s, and per-layer shares of
attention and FFN time of 55 / 35 % layer-wise and 24 / 48 % after distributing the heads. This module
finds the board parameters for which the simulator itself (:func:`dit.sim.engine.simulate` through
:func:`dit.sim.spec.config_from`, HeadSplit's own placements, ``control: dataflow``) gives those
figures: the board's FLOP rate, the one-way latency of a message, the cost of a call and, optionally,
the rate of the attention heads (a head is small, and its time on a board is mostly dispatch).

The fit is Levenberg-Marquardt on the log of simulated over article figure (relative errors, each
figure weighted alike), with forward-difference derivatives, parameters kept within bounds, and several
starts (numpy only: scipy is not a dependency). Each evaluation simulates the three placements in full.
Everything else is fixed and stated (:class:`Rack`): the model's real geometry, the prompt, the
bandwidth, memory, the speculation's acceptance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dit.sim.engine import SimResult, simulate
from dit.sim.spec import config_from

# Chapter 6's figures (/work/shared/spec/headsplit-article.txt): 256 tokens of TinyLlama on 4 boards
ARTICLE_TOKENS = 256
ARTICLE_SECONDS: Mapping[str, float] = {"layerwise": 62.4, "roundrobin": 44.8, "greedy": 40.0}
# per-layer (attention, FFN) shares of time: "layer-wise ... 55 percent ... 35 percent", after
# distributing heads "24 percent ... 48 percent" (the greedy system)
ARTICLE_SHARES: Mapping[str, tuple[float, float]] = {"layerwise": (0.55, 0.35), "greedy": (0.24, 0.48)}
ARTICLE_RTT_MS = (8.0, 12.0)  # "Measured round-trip time between boards was 8 to 12 ms"
ARTICLE_ACCEPTANCE = 0.84  # "Overall acceptance was 84 percent" (tau = 0.05)
# "at least 1.35 times speedup up to 15 ms of added RTT"; layer-wise better "beyond ... about 25 ms"
ARTICLE_SWEEP_CLAIM = ">= 1.35x up to +15 ms; layer-wise better past ~25 ms"
SWEEP_ADDED_RTT_MS = (0.0, 5.0, 15.0, 25.0, 50.0)
PLACEMENTS = ("layerwise", "roundrobin", "greedy")


@dataclass(frozen=True)
class Board:
    """What the fit finds: one board's rates, a message's one-way latency, a call's cost."""

    flops_per_s: float  # projection and FFN (and every unit when head_flops_per_s is None)
    one_way_s: float  # a message's latency, one way (half the round trip the YAML file states)
    call_s: float  # per call: each stage a device runs for a token
    head_flops_per_s: float | None = None  # attention heads and their KV copies in decode steps


@dataclass(frozen=True)
class Rack:
    """What the fit holds fixed: the article's rack as far as the article says, the rest assumed."""

    model: str = "tinyllama"  # the real geometry: 22 layers, 32 heads of 64, 4 KV heads, 2048, 5632
    boards: int = 4
    tokens: int = ARTICLE_TOKENS
    prompt_tokens: int = 8  # not in the article: a short prompt (its prefill is one token's time)
    memory_mb: int = 4000  # 4 GB boards
    bandwidth_mbps: float = 100.0  # assumed: 802.11ac through one access point
    speculation: bool = True  # the full system: 40.0 s is greedy with speculation (1.56x)
    acceptance: float = ARTICLE_ACCEPTANCE  # every layer alike (the article's per-layer ones are not given)


def rack_doc(board: Board, rack: Rack, *, added_rtt_ms: float = 0.0) -> dict[str, Any]:
    """The simulation file (as :func:`dit.sim.spec.config_from` reads it) of ``board`` x ``rack``, each
    link's round trip ``added_rtt_ms`` longer (as the link emulator adds it)."""
    device: dict[str, Any] = {
        "name": "pi",
        "count": rack.boards,
        "flops_per_s": board.flops_per_s,
        "memory_mb": rack.memory_mb,
        "rtt_ms": 2e3 * board.one_way_s + added_rtt_ms,
        "bandwidth_mbps": rack.bandwidth_mbps,
        "call_overhead_ms": 1e3 * board.call_s,
    }
    if board.head_flops_per_s is not None:
        device["head_flops_per_s"] = board.head_flops_per_s
    return {
        "model": rack.model,
        "tokens": rack.tokens,
        "prompt_tokens": rack.prompt_tokens,
        "speculation": rack.speculation,
        "acceptance": rack.acceptance,
        "control": "dataflow",
        "devices": [device],
    }


@dataclass(frozen=True)
class Outcome:
    """One placement simulated: its total time and, over its decode tokens, the shares of attention
    (heads and projection) and FFN compute in the token time, and the critical path's messages."""

    placement: str
    seconds: float
    attention_share: float
    ffn_share: float
    critical_messages: float


def outcome(placement: str, result: SimResult, prompt_tokens: int) -> Outcome:
    skip = 1 if prompt_tokens > 0 else 0  # token 0 is the prefill
    total = sum(result.token_s[skip:])
    heads = sum(s[0] + s[1] for s in result.stage_s[skip:])
    ffn = sum(s[2] for s in result.stage_s[skip:])
    crit = result.critical_messages[skip:]
    return Outcome(
        placement,
        result.total_s,
        heads / total if total > 0 else 0.0,
        ffn / total if total > 0 else 0.0,
        sum(crit) / len(crit) if crit else 0.0,
    )


def simulate_rack(
    board: Board, rack: Rack, placements: Sequence[str] = PLACEMENTS, *, added_rtt_ms: float = 0.0
) -> dict[str, Outcome]:
    """Each of ``placements`` simulated on ``board`` x ``rack`` (HeadSplit places for these boards)."""
    doc = rack_doc(board, rack, added_rtt_ms=added_rtt_ms)
    return {p: outcome(p, simulate(config_from(doc, p)), rack.prompt_tokens) for p in placements}


@dataclass(frozen=True)
class Targets:
    """What the fit matches: seconds per placement and, optionally, (attention, FFN) shares."""

    seconds: Mapping[str, float] = field(default_factory=lambda: dict(ARTICLE_SECONDS))
    shares: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def names(self) -> list[str]:
        out = [f"{p} seconds" for p in self.seconds]
        for p in self.shares:
            out += [f"{p} attention share", f"{p} FFN share"]
        return out

    def placements(self) -> list[str]:
        return [p for p in PLACEMENTS if p in self.seconds or p in self.shares]

    def values(self, got: Mapping[str, Outcome]) -> tuple[list[float], list[float]]:
        """(simulated, target) in :meth:`names` order."""
        sim = [got[p].seconds for p in self.seconds]
        want = list(self.seconds.values())
        for p, (att, ffn) in self.shares.items():
            sim += [got[p].attention_share, got[p].ffn_share]
            want += [att, ffn]
        return sim, want


@dataclass(frozen=True)
class Fit:
    board: Board
    rack: Rack
    targets: Targets
    outcomes: dict[str, Outcome]
    residuals: dict[str, float]  # per target: simulated / target - 1
    evaluations: int
    starts: int

    @property
    def worst(self) -> float:
        return max(abs(r) for r in self.residuals.values())


# The parameters the optimiser moves, in units of about one (GFLOP/s, ms) so one step size suits all.
_SCALE = {"flops_per_s": 1e9, "head_flops_per_s": 1e9, "one_way_s": 1e-3, "call_s": 1e-3}
_LOWER = {"flops_per_s": 1e-3, "head_flops_per_s": 1e-3, "one_way_s": 0.0, "call_s": 0.0}
_FLOOR_STEP = {"flops_per_s": 1e-3, "head_flops_per_s": 1e-3, "one_way_s": 1e-3, "call_s": 1e-3}


def _names(attention_rate: bool) -> list[str]:
    return ["flops_per_s", *(["head_flops_per_s"] if attention_rate else []), "one_way_s", "call_s"]


def _board(x: np.ndarray, names: Sequence[str]) -> Board:
    v = {n: float(x[i]) * _SCALE[n] for i, n in enumerate(names)}
    return Board(v["flops_per_s"], v["one_way_s"], v["call_s"], v.get("head_flops_per_s"))


def _vector(board: Board, names: Sequence[str]) -> np.ndarray:
    return np.array([float(getattr(board, n)) / _SCALE[n] for n in names])


def levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    lower: np.ndarray,
    floor_step: np.ndarray,
    *,
    max_iterations: int = 15,
    tolerance: float = 1e-6,
    max_trials: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimise ``sum(residuals(x) ** 2)`` from ``x0`` with ``x >= lower``: damped Gauss-Newton steps
    (Marquardt's diagonal scaling), forward-difference Jacobians (step 2 % of a parameter, at least its
    ``floor_step``: a greedy placement that changes with the parameters makes the simulation a step
    function at the finest scale), each trial clipped to the bounds, ``max_trials`` dampings per
    iteration. Stops when a step gains less than ``tolerance`` of the cost. Returns the best x and its
    residuals."""
    x = np.maximum(np.asarray(x0, dtype=float), lower)
    r = residuals(x)
    cost, damping = float(r @ r), 1e-2
    for _ in range(max_iterations):
        steps = np.maximum(0.02 * np.abs(x), floor_step)
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            xj = x.copy()
            xj[j] += steps[j]
            jac[:, j] = (residuals(xj) - r) / steps[j]
        a, g = jac.T @ jac, jac.T @ r
        # a parameter at its bound that the cost would push further out stays there; the step is
        # solved for the others (clipping a joint step would bend theirs)
        free = ~((x <= lower) & (g > 0))
        improved = False
        for _ in range(max_trials):
            scaled = a + damping * np.diag(np.maximum(np.diag(a), 1e-12))
            dx = np.zeros_like(x)
            dx[free] = np.linalg.lstsq(scaled[np.ix_(free, free)], -g[free], rcond=None)[0]
            trial = np.maximum(x + dx, lower)
            rt = residuals(trial)
            ct = float(rt @ rt)
            if ct < cost:
                improved = cost - ct > tolerance * max(cost, 1e-12) or ct < tolerance
                x, r, cost, damping = trial, rt, ct, max(damping / 3, 1e-9)
                break
            damping *= 4
        if not improved or cost < tolerance:
            break
    return x, r


def start_points(rack: Rack, targets: Targets, attention_rate: bool) -> list[Board]:
    """Where the fit starts: rates that make layer-wise's compute its article time (its shares when
    given), at a few one-way latencies from the article's (4-6 ms) down to none, and calls of 0.1 ms."""
    from dit.sim.placement_model import PRESETS, kv_flops, unit, unit_flops

    m = PRESETS[rack.model]
    ctx = rack.prompt_tokens + rack.tokens // 2
    heads = m.n_heads * unit_flops(m, unit(0, "head", 0), ctx) + m.n_kv_heads * kv_flops(m)
    proj, ffn = unit_flops(m, unit(0, "proj"), ctx), unit_flops(m, unit(0, "ffn"), ctx)
    per_layer_s = targets.seconds.get("layerwise", ARTICLE_SECONDS["layerwise"]) / rack.tokens / m.n_layers
    att_share, ffn_share = targets.shares.get("layerwise", ARTICLE_SHARES["layerwise"])
    if attention_rate:
        rate = ffn / (ffn_share * per_layer_s)
        head_rate: float | None = heads / max(att_share * per_layer_s - proj / rate, 1e-6)
    else:
        rate, head_rate = (heads + proj + ffn) / (0.9 * per_layer_s), None
    return [Board(rate, one_way, 1e-4, head_rate) for one_way in (5e-3, 1e-3, 0.0)]


def fit(
    rack: Rack = Rack(),
    targets: Targets | None = None,
    *,
    attention_rate: bool = True,
    starts: Sequence[Board] | None = None,
    coarse_tokens: int | None = 32,
    max_iterations: int = 15,
    refine_iterations: int = 4,
) -> Fit:
    """The :class:`Board` whose simulation best matches ``targets`` (default: the article's seconds,
    and its layer-wise shares when ``attention_rate``, which frees the heads' rate to match them).

    Every start is first fitted on ``coarse_tokens`` tokens (the seconds scaled down alike: a
    simulation costs about its tokens), the best of them then refined on the rack's own tokens for at
    most ``refine_iterations``; ``coarse_tokens`` None (or not fewer than the rack's) fits on the rack's
    tokens from every start."""
    if targets is None:
        shares = {"layerwise": ARTICLE_SHARES["layerwise"]} if attention_rate else {}
        targets = Targets(dict(ARTICLE_SECONDS), shares)
    names = _names(attention_rate)
    lower = np.array([_LOWER[n] for n in names])
    floor = np.array([_FLOOR_STEP[n] for n in names])
    starts = list(starts) if starts is not None else start_points(rack, targets, attention_rate)
    simulations = 0

    def best_of(
        on: Rack, want: Targets, points: Sequence[np.ndarray], iterations: int
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Outcome]]:
        nonlocal simulations
        cache: dict[tuple[float, ...], tuple[np.ndarray, dict[str, Outcome]]] = {}

        def evaluate(x: np.ndarray) -> np.ndarray:
            key = tuple(float(v) for v in x)
            if key not in cache:
                got = simulate_rack(_board(x, names), on, want.placements())
                sim, target = want.values(got)
                cache[key] = (np.log(np.maximum(sim, 1e-12)) - np.log(target), got)
            return cache[key][0]

        best: tuple[float, np.ndarray] | None = None
        for x0 in points:
            x, r = levenberg_marquardt(evaluate, x0, lower, floor, max_iterations=iterations)
            if best is None or float(r @ r) < best[0]:
                best = (float(r @ r), x)
        assert best is not None
        simulations += len(cache)
        residual, got = cache[tuple(float(v) for v in best[1])]
        return best[1], residual, got

    points = [_vector(s, names) for s in starts]
    if coarse_tokens is not None and coarse_tokens < rack.tokens:
        scale = coarse_tokens / rack.tokens
        coarse = Targets({p: v * scale for p, v in targets.seconds.items()}, targets.shares)
        x, _, _ = best_of(replace(rack, tokens=coarse_tokens), coarse, points, max_iterations)
        x, residual, got = best_of(rack, targets, [x], refine_iterations)
    else:
        x, residual, got = best_of(rack, targets, points, max_iterations)
    return Fit(
        _board(x, names),
        rack,
        targets,
        got,
        {n: math.expm1(float(v)) for n, v in zip(targets.names(), residual, strict=True)},
        simulations,
        len(starts),
    )


@dataclass(frozen=True)
class SweepRow:
    added_rtt_ms: float
    seconds: dict[str, float]

    def speedup(self, placement: str) -> float:
        return self.seconds["layerwise"] / self.seconds[placement]


def sweep(board: Board, rack: Rack, added_rtt_ms: Sequence[float] = SWEEP_ADDED_RTT_MS) -> list[SweepRow]:
    """The three placements at each added round trip (greedy re-placed for the longer links)."""
    return [
        SweepRow(a, {p: o.seconds for p, o in simulate_rack(board, rack, added_rtt_ms=a).items()})
        for a in added_rtt_ms
    ]


def crossover_ms(rows: Sequence[SweepRow], placement: str) -> float | None:
    """The added RTT at which layer-wise catches ``placement`` (speedup 1), interpolated linearly
    between the sweep's points; None when it does not within them."""
    for a, b in itertools.pairwise(rows):
        sa, sb = a.speedup(placement) - 1, b.speedup(placement) - 1
        if sa >= 0 > sb:
            return a.added_rtt_ms + (b.added_rtt_ms - a.added_rtt_ms) * sa / (sa - sb)
    return None


def format_fit(f: Fit) -> str:
    b = f.board
    head = f"{b.head_flops_per_s / 1e9:.3f} GFLOP/s" if b.head_flops_per_s is not None else "= board rate"
    rtt = 2e3 * b.one_way_s
    lo, hi = ARTICLE_RTT_MS
    verdict = "within" if lo <= rtt <= hi else ("below" if rtt < lo else "above")
    lines = [
        f"fit ({f.evaluations} simulations of {len(f.targets.placements())} placements, {f.starts} starts):",
        f"  board rate        {b.flops_per_s / 1e9:.3f} GFLOP/s",
        f"  attention rate    {head}",
        f"  one-way latency   {1e3 * b.one_way_s:.3f} ms (a round trip of {rtt:.2f} ms: {verdict} the "
        f"article's measured {lo:g}-{hi:g} ms)",
        f"  per call          {1e3 * b.call_s:.3f} ms",
        "",
        f"{'figure':<28} {'simulated':>10} {'article':>9} {'residual':>9}",
    ]
    sim, want = f.targets.values(f.outcomes)
    for name, s, w in zip(f.targets.names(), sim, want, strict=True):
        unit = " s" if name.endswith("seconds") else " %"
        k = 1.0 if unit == " s" else 100.0
        lines.append(f"{name:<28} {k * s:>8.1f}{unit} {k * w:>7.1f}{unit} {100 * f.residuals[name]:>+8.1f} %")
    within = f.worst <= 0.10
    lines.append(
        f"one parameter set {'reproduces' if within else 'does not reproduce'} every figure within 10 % "
        f"(worst {100 * f.worst:.1f} %)"
    )
    lines.append("")
    lines.append(
        f"{'placement':<11} {'seconds':>8} {'speedup':>8} {'attention':>10} {'FFN':>6} {'critical msgs':>14}"
    )
    lw = f.outcomes.get("layerwise")
    for p, o in f.outcomes.items():
        speed = f"{lw.seconds / o.seconds:.2f}x" if lw else "-"
        lines.append(
            f"{p:<11} {o.seconds:>6.1f} s {speed:>8} {100 * o.attention_share:>8.1f} % "
            f"{100 * o.ffn_share:>4.1f} % {o.critical_messages:>14.1f}"
        )
    return "\n".join(lines)


def format_sweep(rows: Sequence[SweepRow]) -> str:
    lines = [
        f"{'added RTT':>9} {'layerwise':>10} {'roundrobin':>11} {'greedy':>8} {'rr speedup':>11} {'greedy speedup':>15}"
    ]
    for r in rows:
        lines.append(
            f"{r.added_rtt_ms:>6.0f} ms {r.seconds['layerwise']:>8.1f} s {r.seconds['roundrobin']:>9.1f} s "
            f"{r.seconds['greedy']:>6.1f} s {r.speedup('roundrobin'):>10.2f}x {r.speedup('greedy'):>14.2f}x"
        )
    for p in ("greedy", "roundrobin"):
        at = crossover_ms(rows, p)
        where = f"+{at:.1f} ms" if at is not None else "not within the sweep"
        lines.append(f"layer-wise overtakes {p}: {where}")
    lines.append(f"the article: {ARTICLE_SWEEP_CLAIM}")
    return "\n".join(lines)


def fitted_yaml(f: Fit) -> str:
    """``scenarios/sim/rack4_pi4.yaml`` for the fit: its parameters, assumptions and residuals."""
    b, r = f.board, f.rack
    doc = rack_doc(b, r)
    device = doc["devices"][0]
    residuals = "\n".join(f"#   {n} {100 * v:+.1f} %" for n, v in f.residuals.items())
    head = f" head_flops_per_s: {b.head_flops_per_s:.4e}," if b.head_flops_per_s is not None else ""
    return f"""\
# dit simulate scenarios/sim/rack4_pi4.yaml [--placement layerwise|roundrobin|greedy]
# The article's rack (Chapter 6) fitted to its own figures by `dit simulate --fit-article --write
# scenarios/sim/rack4_pi4.yaml` (dit.sim.fit; docs/simulator.md, "Fitted to the article"): TinyLlama's real
# geometry (22 layers, 32 heads of 64, 4 KV heads, hidden 2048, FFN 5632), 256 tokens, four equal
# Raspberry Pi 4 boards, HeadSplit's dataflow control (every message pushed one way).
# Fitted (least squares on log-errors): the board rate (projection, FFN), the attention heads' rate, the
# one-way latency of a message (rtt_ms is twice it) and the cost of a call, to layer-wise 62.4 s,
# round-robin 44.8 s, greedy 40.0 s and layer-wise's attention / FFN shares 55 / 35 %.
# Residuals (simulated / article - 1):
{residuals}
# Assumed, not fitted (the article does not give them): a prompt of 8 tokens; 100 Mbit/s per link;
# 4000 MB per board; speculation on the next layer's head workers other than the FFN's, kept with the
# article's overall acceptance 0.84 (its per-layer figures are not given); the controller's LM head and
# embedding take no time; every board alike, one latency for every link.
# A residual over 10 % or a latency at its bound of 0 says the simulator cannot give the article's
# figures with any such board (docs/simulator.md says why); the parameters are then the closest it gets.
name: sim_rack4_pi4
model: {doc["model"]}
tokens: {doc["tokens"]}
prompt_tokens: {doc["prompt_tokens"]}
placement: greedy
speculation: {"true" if doc["speculation"] else "false"}
acceptance: {doc["acceptance"]}
control: dataflow
devices:
  - {{name: pi, count: {device["count"]}, flops_per_s: {b.flops_per_s:.4e},{head}
     memory_mb: {device["memory_mb"]}, rtt_ms: {device["rtt_ms"]:.4f}, bandwidth_mbps: {device["bandwidth_mbps"]:g},
     call_overhead_ms: {device["call_overhead_ms"]:.4f}}}
"""


def board_of(config_doc: Mapping[str, Any]) -> Board:
    """The :class:`Board` a fitted file states (its first device)."""
    d = config_doc["devices"][0]
    head = d.get("head_flops_per_s")
    return Board(
        float(d["flops_per_s"]),
        float(d["rtt_ms"]) / 2e3,
        float(d.get("call_overhead_ms", 0.0)) / 1e3,
        float(head) if head is not None else None,
    )


__all__ = [
    "ARTICLE_SECONDS",
    "ARTICLE_SHARES",
    "Board",
    "Fit",
    "Outcome",
    "Rack",
    "SweepRow",
    "Targets",
    "board_of",
    "crossover_ms",
    "fit",
    "fitted_yaml",
    "format_fit",
    "format_sweep",
    "levenberg_marquardt",
    "rack_doc",
    "simulate_rack",
    "sweep",
]
