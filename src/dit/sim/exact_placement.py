"""HeadSplit placement solved exactly (a MILP, HiGHS): the optimum of the cost model greedy minimises,
and how far layerwise, roundrobin and greedy are from it.

The objective is :func:`headsplit.placement.estimate_token_s` (seconds per token at the context length,
no speculation) written as a MILP; the constraints are every worker's memory at that context
(:func:`headsplit.placement.bytes_by_worker`). Variables per layer ``ly`` and worker ``w``:

- ``n[ly,j,w]`` integer, the query heads of KV group ``j`` on ``w`` (heads of one group are
  interchangeable, so counting them instead of placing each removes the symmetry that would make the
  branch and bound explore every permutation); ``g[ly,j,w]`` binary, ``w`` holds a KV copy of ``j``;
- ``p[ly,w]``, ``f[ly,w]`` binary, the projection and the FFN on ``w``; ``a[ly,w]``, ``w`` holds a head of ``ly``;
- the products the cost needs (X from the previous FFN's worker ``v`` to a head worker ``w``; head
  outputs from ``w`` to the projection's worker; Z from the projection to the FFN) as continuous
  variables bounded below by ``x + y - 1`` and 0 (the objective's coefficients are positive, so the
  minimum sits on the bound);
- ``S[ly]`` >= every head worker's attention stage (X in, heads and KV copies, outputs to the projection).

Solved with a zero gap: the answer is optimal for the model, not a bound. Sized for 3-5 workers and the
reduced models (``llama-tiny``, ``gpt2-tiny``); ``benchmarks/bench_headsplit_exact.py`` times it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dit.optimise.milp import Milp
from dit.sim.placement_model import (
    DTYPE_BYTES,
    RTT_MARGIN,
    STRATEGIES,
    ModelConfig,
    Placement,
    PlacementError,
    WorkerSpec,
    estimate_token_s,
    kv_cache_bytes_per_token,
    kv_flops,
    kv_weight_bytes,
    no_fit,
    place,
    unit,
    unit_flops,
    weight_bytes,
)


@dataclass(frozen=True)
class Gap:
    strategy: str
    token_s: float | None  # None: the strategy found no placement that fits
    gap_percent: float | None  # (heuristic - optimum) / optimum


def exact_place(
    cfg: ModelConfig,
    workers: Sequence[WorkerSpec],
    *,
    context_tokens: int,
    bandwidth_bytes_per_s: float,
    time_limit_s: float = 60.0,
) -> tuple[Placement, float]:
    """The placement minimising :func:`estimate_token_s` under the memory limits, and its seconds per token."""
    ws = list(workers)
    names = [w.name for w in ws]
    bw = bandwidth_bytes_per_s
    hidden_s, head_out_s = DTYPE_BYTES * cfg.hidden / bw, DTYPE_BYTES * cfg.head_dim / bw
    gs, n_groups, L = cfg.group_size, cfg.n_kv_heads, cfg.n_layers
    c_head = unit_flops(cfg, unit(0, "head", 0), context_tokens)
    c_kv, c_proj, c_ffn = (
        kv_flops(cfg),
        unit_flops(cfg, unit(0, "proj"), 1),
        unit_flops(cfg, unit(0, "ffn"), 1),
    )
    b_head, b_proj, b_ffn = (
        weight_bytes(cfg, u) for u in (unit(0, "head", 0), unit(0, "proj"), unit(0, "ffn"))
    )
    b_kv = kv_weight_bytes(cfg) + kv_cache_bytes_per_token(cfg) * context_tokens

    def rpc(a: int | None, b: int) -> float:
        if a is None:
            return RTT_MARGIN * ws[b].rtt_ns * 1e-9
        return RTT_MARGIN * (ws[a].rtt_ns + ws[b].rtt_ns) * 1e-9 / 2

    m = Milp()
    W = range(len(ws))
    n = {(ly, j, w): m.var(upper=gs, integer=True) for ly in range(L) for j in range(n_groups) for w in W}
    g = {(ly, j, w): m.binary() for ly in range(L) for j in range(n_groups) for w in W}
    p = {(ly, w): m.binary(c_proj / ws[w].flops_per_s) for ly in range(L) for w in W}
    f = {
        (ly, w): m.binary(c_ffn / ws[w].flops_per_s + (rpc(None, w) if ly == L - 1 else 0.0))
        for ly in range(L)
        for w in W
    }
    a = {(ly, w): m.var(upper=1.0) for ly in range(L) for w in W}
    stage = [m.var(cost=1.0) for _ in range(L)]

    def product(x: int, y: int, cost: float) -> int:
        """A variable >= x + y - 1, >= 0: with a positive cost, the product of two binaries at the optimum."""
        v = m.var(cost=cost)
        m.row({v: 1.0, x: -1.0, y: -1.0}, lower=-1.0)
        return v

    for ly in range(L):
        for j in range(n_groups):
            m.row({n[ly, j, w]: 1.0 for w in W}, lower=gs, upper=gs)
            for w in W:
                m.row({g[ly, j, w]: gs, n[ly, j, w]: -1.0}, lower=0.0)  # any head of j on w -> its KV copy
                m.row({a[ly, w]: 1.0, g[ly, j, w]: -1.0}, lower=0.0)
        m.row({p[ly, w]: 1.0 for w in W}, lower=1, upper=1)
        m.row({f[ly, w]: 1.0 for w in W}, lower=1, upper=1)
        for w in W:
            terms: dict[int, float] = {stage[ly]: 1.0}
            for j in range(n_groups):
                terms[n[ly, j, w]] = -c_head / ws[w].flops_per_s
                terms[g[ly, j, w]] = -c_kv / ws[w].flops_per_s
            if ly == 0:
                terms[a[ly, w]] = -(rpc(None, w) + hidden_s)
            else:
                for v in W:
                    if v != w:
                        terms[product(a[ly, w], f[ly - 1, v], 0.0)] = -(rpc(v, w) + hidden_s)
            for v in W:
                if v != w:
                    terms[product(a[ly, w], p[ly, v], 0.0)] = -rpc(w, v)
            # the outputs of w's heads when the projection is elsewhere: >= (heads on w) - gs * n_groups * p
            out = m.var()
            m.row(
                {out: 1.0, **{n[ly, j, w]: -1.0 for j in range(n_groups)}, p[ly, w]: gs * n_groups}, lower=0.0
            )
            terms[out] = -head_out_s
            m.row(terms, lower=0.0)
            for v in W:
                if v != w:
                    product(p[ly, v], f[ly, w], rpc(v, w) + hidden_s)  # Z from the projection to the FFN
    for w in W:
        mem = {n[ly, j, w]: float(b_head) for ly in range(L) for j in range(n_groups)}
        mem |= {g[ly, j, w]: float(b_kv) for ly in range(L) for j in range(n_groups)}
        mem |= {p[ly, w]: float(b_proj) for ly in range(L)} | {f[ly, w]: float(b_ffn) for ly in range(L)}
        m.row(mem, upper=float(ws[w].memory_bytes))
    try:
        value, x = m.solve(time_limit_s)
    except RuntimeError as exc:
        raise no_fit(
            f"no exact placement: {exc}", worker=names[0], needed_bytes=0, limit_bytes=ws[0].memory_bytes
        ) from None
    placement: Placement = {}
    for ly in range(L):
        for j in range(n_groups):
            heads = iter(range(j * gs, (j + 1) * gs))
            for w in W:
                for _ in range(round(x[n[ly, j, w]])):
                    placement[unit(ly, "head", next(heads))] = names[w]
        placement[unit(ly, "proj")] = names[max(W, key=lambda w: x[p[ly, w]])]
        placement[unit(ly, "ffn")] = names[max(W, key=lambda w: x[f[ly, w]])]
    return placement, value + hidden_s  # the last FFN's output to the controller: a constant's transfer


def gaps(
    cfg: ModelConfig, workers: Sequence[WorkerSpec], *, context_tokens: int, bandwidth_bytes_per_s: float
) -> tuple[float, list[Gap]]:
    """The optimum (s per token) and each HeadSplit strategy's gap to it, under the same cost model."""
    _, best = exact_place(
        cfg, workers, context_tokens=context_tokens, bandwidth_bytes_per_s=bandwidth_bytes_per_s
    )
    out: list[Gap] = []
    for strategy in STRATEGIES:
        try:
            placed = place(
                cfg,
                workers,
                strategy,
                context_tokens=context_tokens,
                bandwidth_bytes_per_s=bandwidth_bytes_per_s,
            )
        except PlacementError:
            out.append(Gap(strategy, None, None))
            continue
        s = estimate_token_s(
            cfg, workers, placed, context_tokens=context_tokens, bandwidth_bytes_per_s=bandwidth_bytes_per_s
        )
        out.append(Gap(strategy, s, 100 * (s - best) / best))
    return best, out
