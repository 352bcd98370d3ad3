"""TinyLlama-1.1B at decoder-layer granularity, with its real architecture.

22 layers, hidden 2048, 32 query heads sharing 4 KV heads (grouped-query attention, head dim 64),
SwiGLU feed-forward 5632, vocabulary 32000, RMSNorm, rotary positions. Stages: embedding, one per
decoder layer, final norm + head: ``num_layers + 2`` (24 at full depth; ``num_layers`` shrinks it
for fast tests, which then have no catalogue checksum). Built from a ``LlamaConfig`` with seeded
weights (stored as float16, 2.2 GB, computed in float32), never downloaded. Builder:
``dit.models.tinyllama:build``; see :mod:`dit.models.hf_decoder`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dit.models.hf_decoder import build_decoder


def build(spec: Mapping[str, Any]) -> Any:
    return build_decoder(spec, "tinyllama", "llama")
