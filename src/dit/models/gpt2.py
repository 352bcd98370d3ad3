"""GPT-2 (small: 12 layers, hidden 768, 12 heads, vocabulary 50257) at decoder-layer granularity.

Stages: embedding (tokens + learned positions), one per decoder block, final norm + head:
``num_layers + 2`` (14 by default; ``num_layers`` shrinks it for fast tests). Built from a
``GPT2Config`` with seeded weights, never downloaded. Builder: ``dit.models.gpt2:build``; see
:mod:`dit.models.hf_decoder` for the stages, generation and head-wise attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dit.models.hf_decoder import build_decoder


def build(spec: Mapping[str, Any]) -> Any:
    return build_decoder(spec, "gpt2", "gpt2")
