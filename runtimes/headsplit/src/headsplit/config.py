"""Model shapes HeadSplit runs: the catalogue's decoders at full size and reduced sizes for laptops/CI.

Two families: ``gpt2`` (LayerNorm, learned positions, GELU MLP, multi-head attention, biases) and
``llama`` (RMSNorm, rotary positions, SiLU-gated MLP, grouped-query attention, no biases).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Family = Literal["gpt2", "llama"]
# How the controller drives a token (headsplit.dataflow; here, torch-free, for the plug-in's schema too)
CONTROLS = ("dataflow", "rpc")
#: Speculation's tolerance on ||FFN(Z)|| / ||Z|| unless a run sets ``tau`` (the article's TinyLlama figures
#: are at it); every default of it in HeadSplit and its plug-in is this one
DEFAULT_TAU = 0.05


@dataclass(frozen=True)
class ModelConfig:
    name: str
    family: Family
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # == n_heads without grouped-query attention
    hidden: int
    ffn_hidden: int
    vocab: int
    max_positions: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.n_heads:
            raise ValueError(f"{self.name}: hidden {self.hidden} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.name}: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )
        for field in ("n_layers", "n_heads", "n_kv_heads", "hidden", "ffn_hidden", "vocab", "max_positions"):
            if getattr(self, field) < 1:
                raise ValueError(f"{self.name}: {field} must be >= 1")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def kv_head_of(self, head: int) -> int:
        return head // self.group_size

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ModelConfig:
        return cls(**doc)


PRESETS: dict[str, ModelConfig] = {
    # the catalogue's decoders (src/dit/models/catalogue.json), full size
    "gpt2-small": ModelConfig("gpt2-small", "gpt2", 12, 12, 12, 768, 3072, 50257, 1024),
    "tinyllama": ModelConfig("tinyllama", "llama", 22, 32, 4, 2048, 5632, 32000, 2048),
    # trained (the catalogue's smollm2-135m): the shape of the directory `python -m dit.models.convert
    # smollm2-135m DIR` writes; its weights come from that directory as `checkpoint`
    "smollm2-135m": ModelConfig(
        "smollm2-135m", "llama", 30, 9, 3, 576, 1536, 49152, 8192, norm_eps=1e-5, rope_theta=100000.0
    ),
    # reduced depth/width, same structure: laptops and CI
    "gpt2-tiny": ModelConfig("gpt2-tiny", "gpt2", 4, 4, 4, 64, 256, 512, 256),
    "llama-tiny": ModelConfig("llama-tiny", "llama", 4, 8, 2, 64, 176, 512, 256),
    "tinyllama-half": ModelConfig("tinyllama-half", "llama", 6, 32, 4, 512, 1408, 4096, 512),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(sorted(PRESETS))}") from None
