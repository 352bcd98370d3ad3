"""Galaxy-style placement (Ye et al., INFOCOM 2024: hybrid tensor and sequence parallelism per layer),
simulated on the same engine for comparison with HeadSplit's placements.

Every device takes part in every layer, with a share of the work proportional to its ``flops_per_s``
(Galaxy's capacity-aware partitioning; integer heads by largest remainder, whole KV groups replicated
where a device holds one of their heads):

1. the controller sends X to every device (layer 0);
2. **attention, tensor-parallel**: each device computes its heads and the rows of the output
   projection that take their outputs;
3. **all-reduce** of the projection's partial sums (ring: ``2 (n - 1)`` steps, each device sending
   ``4 * hidden / n`` bytes to its ring neighbour per step); for one decoded token the sequence-parallel
   connective block (residual, norm) has one position, so it adds no communication beyond this;
4. **FFN, tensor-parallel**: each device its share of the columns of the first matrices and rows of the
   last, then a second all-reduce;
5. the last layer's output from the first device to the controller.

Memory per device: its share of every layer's weights and a KV copy per group it holds, the cache
growing per token; over its limit, generation stops (Galaxy does not re-place).
Not modelled: Galaxy's overlap of communication with computation (its tile-based pipelining).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from dit.sim.engine import CONTROLLER, SimConfig, SimResult, _Run, generate, token_work
from dit.sim.placement_model import (
    DTYPE_BYTES,
    kv_cache_bytes_per_token,
    kv_weight_bytes,
    unit,
    weight_bytes,
)


def head_shares(n_heads: int, speeds: list[float]) -> list[int]:
    """Heads per device, proportional to speed, by largest remainder (ties: device order)."""
    total = sum(speeds)
    exact = [n_heads * s / total for s in speeds]
    counts = [int(e) for e in exact]
    order = sorted(range(len(speeds)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n_heads - sum(counts)]:
        counts[i] += 1
    return counts


class _GalaxyRun(_Run):
    def _layout(self) -> None:
        m, names = self.cfg.model, list(self.devices)
        speeds = [self.devices[n].flops_per_s for n in names]
        total = sum(speeds)
        self.share = {n: s / total for n, s in zip(names, speeds, strict=True)}
        counts = head_shares(m.n_heads, speeds)
        self.heads: dict[str, tuple[int, int]] = {}
        start = 0
        for n, c in zip(names, counts, strict=True):
            groups = {m.kv_head_of(h) for h in range(start, start + c)}
            self.heads[n] = (c, len(groups))
            start += c
        self.layers = []

    def _all_reduce(self, n_bytes: float) -> Generator[Any, Any, None]:
        ring = list(self.devices)
        if len(ring) < 2:
            return
        chunk = n_bytes / len(ring)
        for _ in range(2 * (len(ring) - 1)):
            steps = [
                self.env.process(self.send(a, ring[(i + 1) % len(ring)], chunk)) for i, a in enumerate(ring)
            ]
            yield simpy.AllOf(self.env, steps)

    def token(self, context: int, positions: int) -> Generator[Any, Any, None]:
        m, env = self.cfg.model, self.env
        hidden_b, head_f, kv_f, proj_f, ffn_f = token_work(m, context, positions)
        yield simpy.AllOf(env, [env.process(self.send(CONTROLLER, d, hidden_b)) for d in self.devices])
        for _ in range(m.n_layers):
            attention = [
                env.process(
                    self.compute(
                        d, (n * head_f + g * kv_f + self.share[d] * proj_f) / self.devices[d].flops_per_s
                    )
                )
                for d, (n, g) in self.heads.items()
            ]
            yield simpy.AllOf(env, attention)
            yield env.process(self._all_reduce(hidden_b))
            ffn = [
                env.process(self.compute(d, self.share[d] * ffn_f / self.devices[d].flops_per_s))
                for d in self.devices
            ]
            yield simpy.AllOf(env, ffn)
            yield env.process(self._all_reduce(hidden_b))
        yield env.process(self.send(next(iter(self.devices)), CONTROLLER, DTYPE_BYTES * m.hidden))

    def memory(self, token: int, context: int, result: SimResult) -> bool:
        m = self.cfg.model
        layer_weights = (
            m.n_heads * weight_bytes(m, unit(0, "head", 0))
            + weight_bytes(m, unit(0, "proj"))
            + weight_bytes(m, unit(0, "ffn"))
        )
        copy = kv_weight_bytes(m) + kv_cache_bytes_per_token(m) * context
        used = {
            d: round(self.share[d] * layer_weights * m.n_layers) + g * copy * m.n_layers
            for d, (_, g) in self.heads.items()
        }
        result.memory.append(used)
        for d, b in used.items():
            if b > self.devices[d].memory_bytes:
                limit_mb = self.devices[d].memory_bytes / 1e6
                result.oom = f"{d} at token {token}: {b / 1e6:.1f} MB over its {limit_mb:.1f} MB"
                return False
        return True


def simulate_galaxy(cfg: SimConfig) -> SimResult:
    """Simulate ``cfg`` with Galaxy's partitioning (its ``placement`` is ignored; speculation and
    re-placement do not apply)."""
    return generate(_GalaxyRun(cfg), cfg)
