"""Placement units: one query head (with its KV-cache share), one layer's output projection, one FFN.

Grouped-query attention: a query head is the unit, and the KV head of its group is *replicated* on
every worker that holds at least one query head of the group (each such worker keeps its own copy
of that KV head's weights and cache and computes it once per token for all its heads of the group).
This keeps the unit fine-grained, as the article places heads, at a memory cost the placement counts
(``kv_copies``). Embedding, final norm and LM head stay on the controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from headsplit.config import ModelConfig

UnitKind = Literal["head", "proj", "ffn"]
DTYPE_BYTES = 4  # float32 throughout


@dataclass(frozen=True, order=True)
class Unit:
    layer: int
    kind: UnitKind
    head: int = -1  # query head index for kind == "head", else -1

    def key(self) -> str:
        """Stable text id, e.g. ``L3.head7``, ``L3.proj``, ``L3.ffn`` (used in files and RPC calls)."""
        return f"L{self.layer}.{self.kind}{self.head if self.kind == 'head' else ''}"

    @classmethod
    def parse(cls, key: str) -> Unit:
        layer_part, _, rest = key.partition(".")
        layer = int(layer_part[1:])
        if rest.startswith("head"):
            return cls(layer, "head", int(rest[4:]))
        if rest in ("proj", "ffn"):
            return cls(layer, rest)  # type: ignore[arg-type]
        raise ValueError(f"not a unit key: {key!r}")


def all_units(cfg: ModelConfig) -> list[Unit]:
    units: list[Unit] = []
    for layer in range(cfg.n_layers):
        units.extend(Unit(layer, "head", h) for h in range(cfg.n_heads))
        units.append(Unit(layer, "proj"))
        units.append(Unit(layer, "ffn"))
    return units


def weight_bytes(cfg: ModelConfig, unit: Unit) -> int:
    """Weights the unit itself owns (a query head: its Wq slice and bias; KV copies are counted apart)."""
    d, hd = cfg.hidden, cfg.head_dim
    bias = cfg.family == "gpt2"
    if unit.kind == "head":
        return DTYPE_BYTES * (d * hd + (hd if bias else 0) + 2 * d)  # Wq slice (+ bias) + its norm copy
    if unit.kind == "proj":
        return DTYPE_BYTES * (d * d + (d if bias else 0))
    f = cfg.ffn_hidden
    if cfg.family == "llama":
        return DTYPE_BYTES * (3 * d * f + d)  # gate, up, down + RMSNorm
    return DTYPE_BYTES * (2 * d * f + f + d + 2 * d)  # fc, proj, biases + LayerNorm


def kv_weight_bytes(cfg: ModelConfig) -> int:
    """One copy of one KV head's weights (Wk, Wv slices and biases)."""
    d, hd = cfg.hidden, cfg.head_dim
    return DTYPE_BYTES * (2 * d * hd + (2 * hd if cfg.family == "gpt2" else 0))


def kv_cache_bytes_per_token(cfg: ModelConfig) -> int:
    """One copy of one KV head's cache, per generated or prompt token (K and V)."""
    return DTYPE_BYTES * 2 * cfg.head_dim
