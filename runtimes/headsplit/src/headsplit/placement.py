"""Where each unit runs: three placement strategies, the memory they need, and re-placement.

A placement maps every unit of :func:`headsplit.units.all_units` (one query head, one layer's output
projection, one layer's FFN) to a worker name. Pure standard-library Python (no torch, no numpy): it
runs in the controller before the first token and again, in under 5 ms, whenever a worker's memory
nears its limit (``benchmarks/bench_headsplit_placement.py`` measures both). numpy would not help:
greedy's decisions are sequential (each depends on the previous ones' memory and stage times) and
span only a handful of workers, so per-call numpy overhead would exceed the loop it replaces; the
hot loop works on precomputed per-worker lists instead (TinyLlama, 4 workers: about 1.7 ms of CPU).

Memory model (:func:`worker_bytes`)
-----------------------------------
For worker ``w`` holding the unit set ``U_w`` at ``T`` tokens of context::

    M_w(T) = sum_{u in U_w} weight_bytes(u) + |G_w| * (kv_weight_bytes + T * kv_cache_bytes_per_token)

where ``G_w`` is the set of (layer, KV head) groups with at least one query head on ``w``: with
grouped-query attention the KV head is *replicated* on every worker holding a query head of its group
(``units.py``), so each such worker pays one KV-weight copy and one KV-cache copy. Embedding, final
norm and LM head live on the controller and are not counted. Activations and framework overhead are
not modelled; :func:`replace` takes the measured excess as ``overhead_bytes``.

Strategies (:func:`place`; every one is deterministic, workers ordered by natural name order, so
``worker2`` < ``worker10``, and ties go to the first name)
--------------------------------------------------------------------------------------------------
``layerwise``
    EdgeShard-style baseline: every unit of a layer on one worker, contiguous blocks of layers in
    worker-name order. Layer counts minimise the largest per-worker compute time ``k_w * t_w``, ``t_w``
    one layer's heads, KV copies, projection and FFN each at ``F_w`` of its kind (cost model below)
    (layers are all the same shape, so dealing one layer at a time to the worker whose time grows least
    is optimal for the bottleneck), subject to ``k_w * M_layer <= memory_bytes``.
``roundrobin``
    The query heads of the whole model, in (layer, head) order, are dealt over the workers in turn;
    layer ``l``'s projection and FFN go together to worker ``l mod n`` (together, so the projection
    output Z does not cross a link that the baseline would not have). A worker without room for its
    turn is skipped to the next one in the rotation.
``greedy``
    Units in the order FFNs (layer order), projections (layer order), heads (layer, head order); each
    goes to the worker with the smallest estimated finish time (cost model below) among the workers
    under their *balanced cap*, else among those under their limit. The balanced cap keeps memory
    balanced: with ``D`` the model's memory demand with one KV copy per group at the context length
    and ``f = D / sum_w L_w`` the average fill, no worker is filled beyond
    ``L_w * min(1, f + (1 - f) / 2)`` while another has room, so every worker keeps headroom for KV growth.

Cost model of ``greedy`` (seconds per generated token, at context length ``T``)
-------------------------------------------------------------------------------
With ``d`` = hidden, ``h`` = head_dim, ``f`` = ffn_hidden, ``F_w(k)`` = :meth:`WorkerSpec.rate` of
the unit's kind ``k`` (``unit_flops_per_s``: by default :func:`step_rates` of the decode steps the
worker timed at start on the run's own model, ``headsplit.engine.time_unit_steps``; from a profile
run, the rates measured on the worker's device, :mod:`headsplit.profile_costs`; without either the
matmul's ``flops_per_s`` for every kind)::

    FLOPs(head)  = 2*d*h + 4*T*h            (q projection; scores and weighted sum over T keys)
    FLOPs(kv)    = 4*d*h                    (k and v of the new token, once per KV copy on a worker)
    FLOPs(proj)  = 2*d*d
    FLOPs(ffn)   = 6*d*f (llama: gate, up, down)   or   4*d*f (gpt2: fc, proj)
    c(u, w)      = FLOPs(u) / F_w(kind of u)  (+ FLOPs(kv) / F_w(head) for the first head of its group on w)

A message of ``b`` bytes crossing from worker ``a`` to worker ``w`` costs one RPC round trip with the
15 % margin plus its transfer time::

    rpc(a, w)    = 1.15 * (rtt_a + rtt_w) / 2        (worker to worker, through the same access point)
    rpc(ctl, w)  = 1.15 * rtt_w                      (controller to worker)
    m(b, a, w)   = 0 if a == w else rpc(a, w) + b / B

Messages per token: the layer input X (``4*d`` bytes) from ffn(l-1)'s worker (the controller for
layer 0) to each worker holding a head of layer ``l``; each head's output (``4*h`` bytes) to proj(l)'s
worker; Z (``4*d`` bytes) from proj(l) to ffn(l); the last FFN's output to the controller.
The finish time that greedy minimises is, in placement order::

    FFN of layer l:          E(u, w) = busy_w + c(u, w) + m(4d, ffn(l-1), w) [+ m(4d, w, ctl) if last]
    projection of layer l:   E(u, w) = c(u, w) + m(4d, w, ffn(l))
    head of layer l:         E(u, w) = A_{l,w} + c(u, w) + m_new(u, w)

``busy_w`` is the FFN time already given to ``w`` (list scheduling: a worker twice as fast takes about
twice the FFNs, and memory spreads with them); the X edge from ffn(l-1) stands for the layer's
crossing, since heads cluster near their inputs when links are slow. The projection sits on the
token's serial path just before its FFN, so no busy term: it joins its FFN unless memory says
otherwise. ``A_{l,w}`` is the time of layer ``l``'s attention stage on ``w`` so far (its heads run in
parallel with the other workers'), and ``m_new`` the communication a head adds: the broadcast of X
and the round trip to the projection only for the first head of the layer on ``w``, ``4*h / B`` for
each further one (the gathered message grows). :func:`estimate_token_s` evaluates the same model
for a whole placement (per-token seconds, no speculation), to compare strategies by.

Assumed constants: the RTT margin 1.15 (the article's "add 15 percent"); the bandwidth ``B`` =
:data:`DEFAULT_BANDWIDTH_BYTES_PER_S` (12.5 MB/s, about 100 Mbit/s, what 802.11ac gives two boards
through one access point; the ``bandwidth_bytes_per_s`` argument overrides it); worker-to-worker RTT =
the mean of the two measured controller RTTs; decode-step message sizes (the prefill is not costed);
norms, residual adds, softmax and rotary are free in FLOPs, and their time is in the rates: the model
is only as good as those. A large matmul's ``flops_per_s`` has none of the per-call dispatch that is
most of a 64-wide head's decode step (it priced TinyLlama's heads 20-60x too cheap, issue 47); the
timed steps and a profile run's rates are each kind's own, on the worker under the run's conditions.

Re-placement (:func:`replace`) keeps every unit in place except on the workers whose predicted bytes
at ``tokens_so_far + tokens_ahead`` exceed ``threshold * limit``. From those it moves whole KV groups
(the query heads of one (layer, KV head) on the worker, with their KV slice) in order of moved bytes
per freed byte, each to the worker where it moves fewest bytes (one that already holds the group needs
no KV slice), then the one with most headroom; single heads next; projections and FFNs last.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

from headsplit.config import ModelConfig
from headsplit.units import (
    DTYPE_BYTES,
    Unit,
    UnitKind,
    all_units,
    kv_cache_bytes_per_token,
    kv_weight_bytes,
    weight_bytes,
)

Strategy = Literal["layerwise", "roundrobin", "greedy"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
Placement = dict[Unit, str]

RTT_MARGIN = 1.15  # the article: "We measure round-trip times at startup, add 15 percent"
DEFAULT_BANDWIDTH_BYTES_PER_S = 12.5e6  # assumed, ~100 Mbit/s: 802.11ac between two Pi 4 boards via one AP
DEFAULT_THRESHOLD = 0.85  # the article: re-place "whenever a device crosses 85 percent of memory"


UNIT_KINDS: tuple[UnitKind, ...] = ("head", "proj", "ffn")


@dataclass(frozen=True)
class WorkerSpec:
    name: str  # "worker1".. (rpc name)
    memory_bytes: int  # the limit: cgroup memory_limit_mb if set, else node RAM
    flops_per_s: float  # measured at start by the engine (matmul micro-benchmark)
    rtt_ns: int  # measured at start by the engine (controller <-> worker)
    # (head, proj, ffn) FLOP/s measured on the worker's device by a profile run (headsplit.profile_costs);
    # None: flops_per_s for every kind. A head's KV copy is costed at the head rate.
    unit_flops_per_s: tuple[float, float, float] | None = None

    def rate(self, kind: UnitKind) -> float:
        """The FLOP/s a unit of ``kind`` runs at on this worker."""
        if self.unit_flops_per_s is None:
            return self.flops_per_s
        return self.unit_flops_per_s[UNIT_KINDS.index(kind)]


class PlacementError(ValueError):
    """No placement fits: names the worker, the bytes it would need and its limit (and the unit if one)."""

    def __init__(
        self, message: str, *, worker: str, needed_bytes: int, limit_bytes: int, unit: Unit | None = None
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.needed_bytes = needed_bytes
        self.limit_bytes = limit_bytes
        self.unit = unit


def _mb(n_bytes: float) -> str:
    return f"{n_bytes / 1e6:.1f} MB"


@lru_cache(maxsize=4096)
def _name_key(name: str) -> tuple[str | int, ...]:
    # re.split with a capture group alternates text (even index) and digits (odd index), so two keys
    # compare position by position between values of the same type.
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", name)))


@lru_cache(maxsize=32)
def _units(cfg: ModelConfig) -> tuple[Unit, ...]:
    return tuple(all_units(cfg))


@lru_cache(maxsize=32)
def _kind_bytes(cfg: ModelConfig) -> dict[str, int]:
    kinds: tuple[UnitKind, ...] = ("head", "proj", "ffn")
    return {kind: weight_bytes(cfg, Unit(0, kind, 0 if kind == "head" else -1)) for kind in kinds}


def kv_copy_bytes(cfg: ModelConfig, tokens: int) -> int:
    """One KV copy of one (layer, KV head) group: its weights and its cache at ``tokens`` tokens."""
    return kv_weight_bytes(cfg) + kv_cache_bytes_per_token(cfg) * tokens


def unit_flops(cfg: ModelConfig, unit: Unit, context_tokens: int) -> float:
    """FLOPs of one decode step of ``unit`` at ``context_tokens`` (a head's KV copy not included)."""
    d, hd = cfg.hidden, cfg.head_dim
    if unit.kind == "head":
        return 2.0 * d * hd + 4.0 * context_tokens * hd
    if unit.kind == "proj":
        return 2.0 * d * d
    return (6.0 if cfg.family == "llama" else 4.0) * d * cfg.ffn_hidden


def kv_flops(cfg: ModelConfig) -> float:
    """FLOPs of one KV copy per decode step (k and v of the new token)."""
    return 4.0 * cfg.hidden * cfg.head_dim


def step_rates(cfg: ModelConfig, context_tokens: int, step_s: Sequence[float]) -> tuple[float, float, float]:
    """(head, proj, ffn) FLOP/s (:attr:`WorkerSpec.unit_flops_per_s`) from the seconds one decode step
    of a layer's heads (every query head and KV copy), of its projection and of its FFN took at
    ``context_tokens`` (``headsplit.engine.time_unit_steps``): the cost model's FLOPs over the time, so
    that ``c(u, w)`` gives back the time measured."""
    if len(step_s) != len(UNIT_KINDS) or not all(s > 0 and math.isfinite(s) for s in step_s):
        raise ValueError(f"step_s must give the (heads, proj, ffn) seconds, each > 0, got {tuple(step_s)}")
    heads = cfg.n_heads * unit_flops(cfg, Unit(0, "head", 0), context_tokens) + cfg.n_kv_heads * kv_flops(cfg)
    proj, ffn = (
        unit_flops(cfg, Unit(0, "proj"), context_tokens),
        unit_flops(cfg, Unit(0, "ffn"), context_tokens),
    )
    return (heads / step_s[0], proj / step_s[1], ffn / step_s[2])


def bytes_by_worker(cfg: ModelConfig, placement: Mapping[Unit, str], tokens: int) -> dict[str, int]:
    """:func:`worker_bytes` of every worker that holds a unit, in one pass."""
    sizes = _kind_bytes(cfg)
    weights: dict[str, int] = {}
    groups: dict[str, set[tuple[int, int]]] = {}
    for unit, worker in placement.items():
        weights[worker] = weights.get(worker, 0) + sizes[unit.kind]
        if unit.kind == "head":
            groups.setdefault(worker, set()).add((unit.layer, cfg.kv_head_of(unit.head)))
    copy = kv_copy_bytes(cfg, tokens)
    return {w: weights[w] + len(groups.get(w, ())) * copy for w in sorted(weights, key=_name_key)}


def worker_bytes(cfg: ModelConfig, placement: Mapping[Unit, str], worker: str, tokens: int) -> int:
    """Bytes ``worker`` needs at ``tokens`` tokens of context: unit weights + one KV-weight and one
    KV-cache copy per (layer, KV head) group it holds a query head of (0 if it holds nothing)."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return bytes_by_worker(cfg, placement, tokens).get(worker, 0)


def _check_workers(workers: Sequence[WorkerSpec]) -> list[WorkerSpec]:
    if not workers:
        raise ValueError("workers: at least one worker is needed")
    seen: set[str] = set()
    for i, w in enumerate(workers):
        if not w.name:
            raise ValueError(f"workers[{i}].name must not be empty")
        if w.name in seen:
            raise ValueError(f"workers[{i}].name {w.name!r} appears twice")
        seen.add(w.name)
        if w.memory_bytes <= 0:
            raise ValueError(f"workers[{i}].memory_bytes ({w.name}) must be > 0, got {w.memory_bytes}")
        if not (w.flops_per_s > 0 and math.isfinite(w.flops_per_s)):
            raise ValueError(
                f"workers[{i}].flops_per_s ({w.name}) must be a finite number > 0, got {w.flops_per_s}"
            )
        if w.rtt_ns < 0:
            raise ValueError(f"workers[{i}].rtt_ns ({w.name}) must be >= 0, got {w.rtt_ns}")
        if w.unit_flops_per_s is not None:
            if len(w.unit_flops_per_s) != len(UNIT_KINDS):
                raise ValueError(
                    f"workers[{i}].unit_flops_per_s ({w.name}) must give (head, proj, ffn), "
                    f"got {w.unit_flops_per_s}"
                )
            for kind, rate in zip(UNIT_KINDS, w.unit_flops_per_s, strict=True):
                if not (rate > 0 and math.isfinite(rate)):
                    raise ValueError(
                        f"workers[{i}].unit_flops_per_s.{kind} ({w.name}) must be a finite number > 0, "
                        f"got {rate}"
                    )
    return sorted(workers, key=lambda w: _name_key(w.name))


def _check_tokens(field: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{field} must be >= 0, got {value}")


def place(
    cfg: ModelConfig,
    workers: Sequence[WorkerSpec],
    strategy: Strategy,
    *,
    context_tokens: int,
    bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S,
    trace: list[Unit] | None = None,
) -> Placement:
    """Place every unit of ``cfg`` on ``workers`` so that each fits at ``context_tokens`` tokens.

    ``trace``, if given, receives the units in the order the strategy placed them. Raises
    :class:`PlacementError` when the strategy finds no fitting placement, ``ValueError`` on bad input.
    The result's keys are in :func:`all_units` order.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    _check_tokens("context_tokens", context_tokens)
    if not bandwidth_bytes_per_s > 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s}")
    ordered = _check_workers(workers)
    order: list[Unit] = trace if trace is not None else []
    # Each strategy returns the index (into ``ordered``) of every unit's worker, in all_units order:
    # the dict is built once at the end (hashing Unit dataclasses is a good part of the time budget).
    if strategy == "layerwise":
        at = _layerwise(cfg, ordered, context_tokens, order)
    elif strategy == "roundrobin":
        at = _roundrobin(cfg, ordered, context_tokens, order)
    else:
        at = _greedy(cfg, ordered, context_tokens, bandwidth_bytes_per_s, order)
    names = [w.name for w in ordered]
    return dict(zip(_units(cfg), [names[i] for i in at], strict=True))


def _layerwise(cfg: ModelConfig, ws: list[WorkerSpec], tokens: int, order: list[Unit]) -> list[int]:
    sizes = _kind_bytes(cfg)
    layer_bytes = (
        cfg.n_heads * sizes["head"]
        + sizes["proj"]
        + sizes["ffn"]
        + cfg.n_kv_heads * kv_copy_bytes(cfg, tokens)
    )
    attention_flops = cfg.n_heads * unit_flops(cfg, Unit(0, "head", 0), tokens) + cfg.n_kv_heads * kv_flops(
        cfg
    )
    proj_flops, ffn_flops = unit_flops(cfg, Unit(0, "proj"), tokens), unit_flops(cfg, Unit(0, "ffn"), tokens)
    # one layer's compute time on each worker, each kind at its own rate
    layer_s = [
        attention_flops / w.rate("head") + proj_flops / w.rate("proj") + ffn_flops / w.rate("ffn") for w in ws
    ]
    room = [w.memory_bytes // layer_bytes for w in ws]
    if sum(room) < cfg.n_layers:
        # Fill in name order: the last worker is left with what does not fit.
        left = cfg.n_layers - sum(room[:-1])
        last = ws[-1]
        raise PlacementError(
            f"layerwise: {cfg.n_layers} layers of {_mb(layer_bytes)} each do not fit: {last.name} would need "
            f"{_mb(left * layer_bytes)} for {left} layers, limit {_mb(last.memory_bytes)}",
            worker=last.name,
            needed_bytes=left * layer_bytes,
            limit_bytes=last.memory_bytes,
        )
    counts = [0] * len(ws)
    for _ in range(cfg.n_layers):
        # Identical layers: giving each to the worker whose compute time grows least minimises the largest.
        best = min(
            (i for i in range(len(ws)) if counts[i] < room[i]),
            key=lambda i: ((counts[i] + 1) * layer_s[i], i),
        )
        counts[best] += 1
    at: list[int] = []
    for i, count in enumerate(counts):  # contiguous blocks in name order
        at.extend([i] * (count * (cfg.n_heads + 2)))
    order.extend(_units(cfg))
    return at


class _Fill:
    """Bytes per worker while a strategy places units one by one (weights + KV copies at ``tokens``).

    Indexes instead of Unit objects and sets: the greedy loop runs 748 units x workers in < 5 ms."""

    def __init__(self, cfg: ModelConfig, ws: list[WorkerSpec], tokens: int) -> None:
        self.cfg = cfg
        self.ws = ws
        self.sizes = _kind_bytes(cfg)
        self.copy = kv_copy_bytes(cfg, tokens)
        self.used = [0] * len(ws)
        # has_group[i][layer * n_kv_heads + kv_head]: worker i already holds that KV copy
        self.has_group = [bytearray(cfg.n_layers * cfg.n_kv_heads) for _ in ws]

    def group(self, unit: Unit) -> int:
        return unit.layer * self.cfg.n_kv_heads + self.cfg.kv_head_of(unit.head)

    def cost(self, unit: Unit, i: int) -> int:
        """Bytes ``unit`` adds on worker ``i``."""
        if unit.kind == "head" and not self.has_group[i][self.group(unit)]:
            return self.sizes["head"] + self.copy
        return self.sizes[unit.kind]

    def add(self, unit: Unit, i: int, extra: int) -> None:
        self.used[i] += extra
        if unit.kind == "head":
            self.has_group[i][self.group(unit)] = 1

    def fail(self, strategy: str, unit: Unit) -> PlacementError:
        # Name the worker with the most free memory: if it cannot take the unit, none can.
        i = max(range(len(self.ws)), key=lambda j: (self.ws[j].memory_bytes - self.used[j], -j))
        w, need = self.ws[i], self.used[i] + self.cost(unit, i)
        return PlacementError(
            f"{strategy}: no worker has room for {unit.key()}: {w.name} (the most free) would need "
            f"{_mb(need)}, limit {_mb(w.memory_bytes)}",
            worker=w.name,
            needed_bytes=need,
            limit_bytes=w.memory_bytes,
            unit=unit,
        )


def _layer_slices(cfg: ModelConfig) -> list[tuple[Sequence[Unit], Unit, Unit]]:
    """Per layer: its heads, its projection and its FFN, taken from the cached :func:`all_units`."""
    units, per = _units(cfg), cfg.n_heads + 2
    return [
        (units[b : b + cfg.n_heads], units[b + cfg.n_heads], units[b + cfg.n_heads + 1])
        for b in range(0, len(units), per)
    ]


def _roundrobin(cfg: ModelConfig, ws: list[WorkerSpec], tokens: int, order: list[Unit]) -> list[int]:
    n, nkv, group_size = len(ws), cfg.n_kv_heads, cfg.group_size
    fill = _Fill(cfg, ws, tokens)
    used, has_group, limit = fill.used, fill.has_group, [w.memory_bytes for w in ws]
    head_bytes, head_copy_bytes = fill.sizes["head"], fill.sizes["head"] + fill.copy
    at: list[int] = []
    turn = 0
    for layer, (heads, proj, ffn) in enumerate(_layer_slices(cfg)):
        for h, unit in enumerate(heads):
            g = layer * nkv + h // group_size
            for step in range(n):  # this head's turn, or the next worker in the rotation with room
                i = (turn + step) % n
                extra = head_bytes if has_group[i][g] else head_copy_bytes
                if used[i] + extra <= limit[i]:
                    break
            else:
                raise fill.fail("roundrobin", unit)
            used[i] += extra
            has_group[i][g] = 1
            at.append(i)
            turn += 1
        for unit in (proj, ffn):  # together on worker layer mod n, or the next with room
            extra = fill.sizes[unit.kind]
            for step in range(n):
                i = (layer + step) % n
                if used[i] + extra <= limit[i]:
                    break
            else:
                raise fill.fail("roundrobin", unit)
            used[i] += extra
            at.append(i)
    order.extend(_units(cfg))
    return at


def _greedy(cfg: ModelConfig, ws: list[WorkerSpec], tokens: int, bw: float, order: list[Unit]) -> list[int]:
    n, nl, nkv, group_size = len(ws), cfg.n_layers, cfg.n_kv_heads, cfg.group_size
    inv_head = [1.0 / w.rate("head") for w in ws]
    inv_proj = [1.0 / w.rate("proj") for w in ws]
    inv_ffn = [1.0 / w.rate("ffn") for w in ws]
    limit = [w.memory_bytes for w in ws]
    rtt_s = [w.rtt_ns * 1e-9 for w in ws]
    # rpc[a][b]: one round trip between workers (0 on the same worker); ctl[b]: controller <-> worker.
    rpc = [[0.0 if a == b else RTT_MARGIN * (rtt_s[a] + rtt_s[b]) / 2 for b in range(n)] for a in range(n)]
    ctl = [RTT_MARGIN * r for r in rtt_s]
    hidden_s = DTYPE_BYTES * cfg.hidden / bw
    head_out_s = DTYPE_BYTES * cfg.head_dim / bw

    fill = _Fill(cfg, ws, tokens)
    used, has_group, sizes, copy = fill.used, fill.has_group, fill.sizes, fill.copy
    demand = nl * (cfg.n_heads * sizes["head"] + sizes["proj"] + sizes["ffn"] + nkv * copy)
    avg_fill = demand / sum(limit)
    cap_fraction = min(1.0, avg_fill + (1.0 - avg_fill) / 2)
    cap = [cap_fraction * lim for lim in limit]
    busy = [0.0] * n  # per-token time given to each worker by the FFNs (list scheduling)
    per_layer = cfg.n_heads + 2  # units of one layer in all_units order: heads, proj, ffn
    at = [0] * (nl * per_layer)
    layers = _layer_slices(cfg)
    ffn_at = [-1] * nl
    proj_at = [-1] * nl

    def pick(unit: Unit, finish: list[float], extra: int, position: int) -> int:
        # Tier 0: workers that stay under their balanced cap; tier 1: under their limit. Ties: name order.
        best, best_tier, best_finish = -1, 2, 0.0
        for i in range(n):
            after = used[i] + extra
            if after > limit[i]:
                continue
            tier = 0 if after <= cap[i] else 1
            if tier < best_tier or (tier == best_tier and finish[i] < best_finish):
                best, best_tier, best_finish = i, tier, finish[i]
        if best < 0:
            raise fill.fail("greedy", unit)
        used[best] += extra
        at[position] = best
        order.append(unit)
        return best

    ffn_flops = unit_flops(cfg, layers[0][2], tokens)
    for layer in range(nl):
        out = [ctl[i] + hidden_s for i in range(n)] if layer == nl - 1 else [0.0] * n
        # X leaves ffn(l-1) for layer l, whose projection will sit with ffn(l) (below): one crossing
        # unless both FFNs share a worker.
        prev = ffn_at[layer - 1] if layer else -1
        step = [
            ffn_flops * inv_ffn[i]
            + out[i]
            + (0.0 if i == prev else (ctl[i] if prev < 0 else rpc[prev][i]) + hidden_s)
            for i in range(n)
        ]
        i = pick(
            layers[layer][2], [busy[j] + step[j] for j in range(n)], sizes["ffn"], (layer + 1) * per_layer - 1
        )
        busy[i] += step[i]
        ffn_at[layer] = i

    proj_flops = unit_flops(cfg, layers[0][1], tokens)
    for layer in range(nl):
        f = ffn_at[layer]
        step = [proj_flops * inv_proj[i] + (rpc[i][f] + hidden_s if i != f else 0.0) for i in range(n)]
        # On the token's serial path right before its FFN: latency, not busy time, decides, so the
        # projection joins its FFN unless memory says otherwise.
        i = pick(layers[layer][1], step, sizes["proj"], (layer + 1) * per_layer - 2)
        proj_at[layer] = i

    head_flops = unit_flops(cfg, layers[0][0][0], tokens)
    kvf = kv_flops(cfg)
    head_bytes, head_copy_bytes = sizes["head"], sizes["head"] + copy
    workers = range(n)
    for layer in range(nl):
        src, p = (ffn_at[layer - 1] if layer else -1), proj_at[layer]
        # First head of the layer on worker i: X arrives (unless i holds ffn(l-1)), one call to proj(l).
        first = [
            (0.0 if i == src else (ctl[i] if src < 0 else rpc[src][i]) + hidden_s)
            + (rpc[i][p] if i != p else 0.0)
            for i in workers
        ]
        # Step time of a head on worker i when its KV group is already there / is new there.
        step_has = [head_flops * inv_head[i] + (head_out_s if i != p else 0.0) for i in workers]
        step_new = [step_has[i] + kvf * inv_head[i] for i in workers]
        # Layer l's attention-stage time on worker i so far, starting from the communication its first
        # head will add, so that a head's finish time is attention[i] + its step time.
        attention = first
        lim_room = [limit[i] - used[i] for i in workers]
        cap_room = [cap[i] - used[i] for i in workers]
        group_row = layer * nkv
        for h, unit in enumerate(layers[layer][0]):  # the hot path: pick() inlined
            g = group_row + h // group_size
            best, best_tier, best_finish, best_extra = -1, 2, 0.0, 0
            for i in workers:
                if has_group[i][g]:
                    extra, finish = head_bytes, attention[i] + step_has[i]
                else:
                    extra, finish = head_copy_bytes, attention[i] + step_new[i]
                if extra > lim_room[i]:
                    continue
                tier = 0 if extra <= cap_room[i] else 1
                if tier < best_tier or (tier == best_tier and finish < best_finish):
                    best, best_tier, best_finish, best_extra = i, tier, finish, extra
            if best < 0:
                raise fill.fail("greedy", unit)
            used[best] += best_extra
            lim_room[best] -= best_extra
            cap_room[best] -= best_extra
            has_group[best][g] = 1
            attention[best] = best_finish
            at[layer * per_layer + h] = best
            order.append(unit)
    return at


def estimate_token_s(
    cfg: ModelConfig,
    workers: Sequence[WorkerSpec],
    placement: Mapping[Unit, str],
    *,
    context_tokens: int,
    bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S,
) -> float:
    """Seconds per generated token that greedy's cost model predicts for ``placement``, without
    speculation: per layer, the slowest worker's attention stage (X in, its heads and KV copies, its
    gathered outputs to the projection), then the projection, Z to the FFN and the FFN; the last FFN's
    output back to the controller. A model to compare placements by, not a measurement."""
    _check_tokens("context_tokens", context_tokens)
    ws = _check_workers(workers)
    spec = {w.name: w for w in ws}
    bw = bandwidth_bytes_per_s

    def rpc(a: str | None, b: str) -> float:
        if a == b:
            return 0.0
        if a is None:
            return RTT_MARGIN * spec[b].rtt_ns * 1e-9
        return RTT_MARGIN * (spec[a].rtt_ns + spec[b].rtt_ns) * 1e-9 / 2

    head_flops = unit_flops(cfg, Unit(0, "head", 0), context_tokens)
    hidden_s, head_out_s = DTYPE_BYTES * cfg.hidden / bw, DTYPE_BYTES * cfg.head_dim / bw
    total, src = 0.0, None
    for heads, proj, ffn in _layer_slices(cfg):
        p, f = placement[proj], placement[ffn]
        count: dict[str, int] = {}
        groups: dict[str, set[int]] = {}
        for u in heads:
            w = placement[u]
            count[w] = count.get(w, 0) + 1
            groups.setdefault(w, set()).add(cfg.kv_head_of(u.head))
        stage = 0.0
        for w, n_heads in count.items():
            flops = n_heads * head_flops + len(groups[w]) * kv_flops(cfg)
            x_in = 0.0 if w == src else rpc(src, w) + hidden_s
            out = 0.0 if w == p else rpc(w, p) + n_heads * head_out_s
            stage = max(stage, x_in + flops / spec[w].rate("head") + out)
        total += stage + unit_flops(cfg, proj, context_tokens) / spec[p].rate("proj")
        total += (0.0 if p == f else rpc(p, f) + hidden_s) + unit_flops(cfg, ffn, context_tokens) / spec[
            f
        ].rate("ffn")
        src = f
    assert src is not None
    return total + rpc(None, src) + hidden_s


def placement_to_json(placement: Mapping[Unit, str]) -> dict[str, str]:
    """The results file's ``placement.units``: ``{"L0.head0": "worker1", ...}`` in unit order."""
    return {u.key(): placement[u] for u in sorted(placement)}


def placement_from_json(cfg: ModelConfig, doc: Mapping[str, str], workers: Sequence[str]) -> Placement:
    """Read ``placement_to_json``'s form back, checking it places every unit of ``cfg`` on a known worker."""
    known = set(workers)
    placement: Placement = {}
    for key, worker in doc.items():
        try:
            unit = Unit.parse(key)
        except ValueError:
            raise ValueError(
                f"placement.units[{key!r}]: not a unit key like L0.head3, L0.proj, L0.ffn"
            ) from None
        if not (0 <= unit.layer < cfg.n_layers and (unit.kind != "head" or 0 <= unit.head < cfg.n_heads)):
            raise ValueError(f"placement.units[{key!r}]: {cfg.name} has no such unit")
        if worker not in known:
            raise ValueError(f"placement.units[{key!r}]: {worker!r} is not one of {', '.join(sorted(known))}")
        placement[unit] = worker
    absent = next((u for u in _units(cfg) if u not in placement), None)
    if absent is not None:
        raise ValueError(f"placement.units: {absent.key()} is not placed")
    return {u: placement[u] for u in _units(cfg)}


def moves(old: Mapping[Unit, str], new: Mapping[Unit, str]) -> list[tuple[Unit, str, str]]:
    """``(unit, from, to)`` for every unit whose worker differs, in unit order."""
    if old.keys() != new.keys():
        missing = sorted(set(old) ^ set(new))
        raise ValueError(f"placements differ in their units, e.g. {missing[0].key()}")
    return sorted((u, old[u], new[u]) for u in old if old[u] != new[u])


def migration_bytes(
    cfg: ModelConfig, old: Mapping[Unit, str], new: Mapping[Unit, str], tokens_so_far: int
) -> int:
    """Bytes a migration from ``old`` to ``new`` sends: each moved unit's weights, and a KV copy
    (weights + cache of ``tokens_so_far`` tokens) for each group that arrives on a worker lacking it."""
    _check_tokens("tokens_so_far", tokens_so_far)
    sizes = _kind_bytes(cfg)
    moved = moves(old, new)
    held = {(u.layer, cfg.kv_head_of(u.head), w) for u, w in old.items() if u.kind == "head"}
    arriving = {(u.layer, cfg.kv_head_of(u.head), to) for u, _, to in moved if u.kind == "head"} - held
    return sum(sizes[u.kind] for u, _, _ in moved) + len(arriving) * kv_copy_bytes(cfg, tokens_so_far)


def replace(
    cfg: ModelConfig,
    workers: Sequence[WorkerSpec],
    current: Mapping[Unit, str],
    *,
    tokens_so_far: int,
    tokens_ahead: int,
    threshold: float = DEFAULT_THRESHOLD,
    overhead_bytes: Mapping[str, int] | None = None,
) -> Placement:
    """Re-place for the ``tokens_ahead`` tokens still to come, moving as few bytes as possible.

    Every worker must end under ``threshold * memory_bytes`` at ``tokens_so_far + tokens_ahead``
    tokens (if that is impossible, under ``memory_bytes``); only units of workers predicted over it
    move. ``overhead_bytes`` adds, per worker, what the model does not count (measured minus
    :func:`worker_bytes`). Returns ``current`` unchanged (a copy) when nothing is over. Raises
    :class:`PlacementError` when even the limits cannot be met.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    _check_tokens("tokens_so_far", tokens_so_far)
    _check_tokens("tokens_ahead", tokens_ahead)
    ws = _check_workers(workers)
    names = {w.name for w in ws}
    units = _units(cfg)
    if len(current) != len(units) or any(u not in current for u in units):
        absent = next((u for u in units if u not in current), None)
        detail = f"{absent.key()} is not placed" if absent else "it holds units the model does not have"
        raise ValueError(f"current placement does not match {cfg.name}: {detail}")
    for u, w in current.items():
        if w not in names:
            raise ValueError(f"current placement puts {u.key()} on {w!r}, not one of the workers")
    extra = dict(overhead_bytes or {})
    for w in extra:
        if w not in names:
            raise ValueError(f"overhead_bytes names {w!r}, not one of the workers")
    error: PlacementError | None = None
    for fraction in dict.fromkeys((threshold, 1.0)):
        try:
            return _relieve(cfg, ws, current, tokens_so_far, tokens_so_far + tokens_ahead, fraction, extra)
        except PlacementError as exc:
            error = exc
    assert error is not None
    raise error


class _Holding:
    """One worker's units during re-placement: head groups, other units and bytes at the horizon."""

    def __init__(self, spec: WorkerSpec, target: float, overhead: int) -> None:
        self.spec = spec
        self.target = target
        self.groups: dict[tuple[int, int], list[Unit]] = {}
        self.others: list[Unit] = []
        self.bytes = overhead

    def headroom(self) -> float:
        return self.target - self.bytes


def _relieve(
    cfg: ModelConfig,
    ws: list[WorkerSpec],
    current: Mapping[Unit, str],
    so_far: int,
    horizon: int,
    fraction: float,
    overhead: Mapping[str, int],
) -> Placement:
    sizes = _kind_bytes(cfg)
    copy_h, copy_s = kv_copy_bytes(cfg, horizon), kv_copy_bytes(cfg, so_far)
    hold = {w.name: _Holding(w, fraction * w.memory_bytes, overhead.get(w.name, 0)) for w in ws}
    for u, w in current.items():
        h = hold[w]
        h.bytes += sizes[u.kind]
        if u.kind == "head":
            members = h.groups.setdefault((u.layer, cfg.kv_head_of(u.head)), [])
            if not members:
                h.bytes += copy_h
            members.append(u)
        else:
            h.others.append(u)
    over = [h for h in hold.values() if h.bytes > h.target]
    new = dict(current)
    if not over:
        return new
    receivers = [h for h in hold.values() if h.bytes <= h.target]

    def land(
        group: tuple[int, int] | None, add_weights: int, moved_weights: int
    ) -> tuple[int, float, _Holding] | None:
        """The receiver moving fewest bytes (then most headroom, then name) with room, as (moved, -room, it)."""
        best: tuple[int, float, _Holding] | None = None
        for r in receivers:
            has = group is None or group in r.groups
            if r.bytes + add_weights + (0 if has else copy_h) > r.target:
                continue
            key = (moved_weights + (0 if has else copy_s), -r.headroom(), r)
            if best is None or key[:2] < best[:2]:
                best = key
        return best

    def group_option(group: tuple[int, int], members: list[Unit]) -> tuple[float, int, float, str] | None:
        """(moved / freed, moved, -room, receiver) for moving the group's heads off ``src``, or None."""
        weights = len(members) * sizes["head"]
        found = land(group, weights, weights)
        if found is None:
            return None
        return (found[0] / (weights + copy_h), found[0], found[1], found[2].spec.name)

    for src in over:
        # Whole groups first, best option first. Receivers only fill up, so an option can only get
        # worse: re-rate the top of the heap and take it if it is still no worse than the next one.
        heap: list[tuple[tuple[float, int, float, tuple[str | int, ...]], tuple[int, int], str]] = []
        for group, members in sorted(src.groups.items()):
            option = group_option(group, members)
            if option is not None:
                heap.append(((*option[:3], _name_key(option[3])), group, option[3]))
        heapq.heapify(heap)
        while src.bytes > src.target and heap:
            rated, group, _ = heapq.heappop(heap)
            members = src.groups[group]
            option = group_option(group, members)
            if option is None:
                continue
            fresh = ((*option[:3], _name_key(option[3])), group, option[3])
            if fresh[0] != rated and heap and fresh > heap[0]:
                heapq.heappush(heap, fresh)
                continue
            for u in list(members):
                _move(cfg, sizes, copy_h, src, hold[option[3]], u)
                new[u] = option[3]
        while src.bytes > src.target:
            # What is left: (moved/freed, moved, -room, unit, units, receiver)
            options: list[tuple[float, int, float, Unit, list[Unit], _Holding]] = []
            # No whole group fits anywhere: single heads (the last of its group frees the KV copy too).
            for group, members in sorted(src.groups.items()):
                u = members[-1]
                found = land(group, sizes["head"], sizes["head"])
                if found:
                    freed = sizes["head"] + (copy_h if len(members) == 1 else 0)
                    options.append((found[0] / freed, found[0], found[1], u, [u], found[2]))
            if not options:
                # Heads exhausted: the smallest projection/FFN that covers the excess, else the largest.
                excess = src.bytes - src.target
                for u in src.others:
                    found = land(None, sizes[u.kind], sizes[u.kind])
                    if found:
                        covers = sizes[u.kind] >= excess
                        options.append(
                            (
                                0.0 if covers else 1.0,
                                found[0] * (1 if covers else -1),
                                found[1],
                                u,
                                [u],
                                found[2],
                            )
                        )
            if not options:
                need = math.ceil(src.bytes)
                raise PlacementError(
                    f"replace: {src.spec.name} needs {_mb(need)} at {horizon} tokens, limit "
                    f"{_mb(src.spec.memory_bytes)}, and no other worker has room for its units under "
                    f"{fraction:.0%} of their limits",
                    worker=src.spec.name,
                    needed_bytes=need,
                    limit_bytes=src.spec.memory_bytes,
                )
            options.sort(key=lambda o: (o[0], o[1], o[2], _name_key(o[5].spec.name), o[3]))
            _, _, _, _, chosen, dest = options[0]
            for u in list(chosen):
                _move(cfg, sizes, copy_h, src, dest, u)
                new[u] = dest.spec.name
    return new


def _move(
    cfg: ModelConfig, sizes: Mapping[str, int], copy_h: int, src: _Holding, dest: _Holding, u: Unit
) -> None:
    src.bytes -= sizes[u.kind]
    dest.bytes += sizes[u.kind]
    if u.kind != "head":
        src.others.remove(u)
        dest.others.append(u)
        return
    group = (u.layer, cfg.kv_head_of(u.head))
    members = src.groups[group]
    members.remove(u)
    if not members:
        del src.groups[group]
        src.bytes -= copy_h
    if group not in dest.groups:
        dest.groups[group] = []
        dest.bytes += copy_h
    dest.groups[group].append(u)
