"""A trained catalogue model as a Hugging Face-format directory, byte-reproducible, for HeadSplit.

``python -m dit.models.convert smollm2-135m OUT_DIR`` loads the model from its verified packaged file
(:mod:`dit.models.packaged`; transformers dequantises the GGUF to float32) and writes

* ``config.json``: the Llama fields HeadSplit's ``headsplit.checkpoint.model_config`` reads, spelled
  out (``rope_theta`` at the top level, which transformers 5 moves into ``rope_parameters`` and
  HeadSplit would otherwise take as its 10000 default), sorted keys, no library version;
* ``model.safetensors``: every tensor in float32 with the Hugging Face names, written by
  :func:`dit.models.weights.save_safetensors` (sorted, no timestamps). The model ties its output
  head to the embedding; HeadSplit reads ``lm_head.weight``, so the head is written out and the
  config says ``tie_word_embeddings: false`` (the same numbers either way);
* ``SHA256SUMS``: the manifest whose SHA-256 is the directory's pin (HeadSplit's definition,
  :mod:`dit.models.checkpoint_pin`, which the mirror uses too).

The same GGUF and the same library versions give the same bytes, so the pin is stable; it prints
the pin, which ``checkpoint.sha256`` in a HeadSplit block takes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dit.models.checkpoint_pin import SUMS, manifest, manifest_text
from dit.models.weights import WeightsError, save_safetensors

CONFIG_KEYS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "num_hidden_layers", "vocab_size", "max_position_embeddings", "rms_norm_eps",
    "bos_token_id", "eos_token_id",
)  # fmt: skip


def _rope_theta(config: Any) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:  # transformers 5: rope_parameters = {"rope_theta": ..., "rope_type": "default"}
        params = getattr(config, "rope_parameters", None) or {}
        if params.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {params.get('rope_type')!r}: HeadSplit runs the default rotary")
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


def llama_config_json(config: Any) -> dict[str, Any]:
    """The ``config.json`` of a Llama model, as HeadSplit reads it."""
    doc: dict[str, Any] = {k: getattr(config, k) for k in CONFIG_KEYS if getattr(config, k, None) is not None}
    doc.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_act=str(getattr(config, "hidden_act", "silu")),
        rope_theta=_rope_theta(config),
        rope_scaling=None,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return doc


def write_hf_directory(out: Path, config_doc: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> str:
    """Write ``config.json``, ``model.safetensors`` and ``SHA256SUMS``; return the directory's pin."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(dict(config_doc), sort_keys=True, indent=2) + "\n"
    (out / "config.json").write_text(text, encoding="utf-8")
    save_safetensors(out / "model.safetensors", tensors, {"format": "pt"})
    sums = manifest(out)
    (out / SUMS).write_text(manifest_text(sums), encoding="utf-8")
    return hashlib.sha256(manifest_text(sums).encode()).hexdigest()


def model_tensors(model: Any) -> dict[str, np.ndarray]:
    """A transformers Llama model's tensors in float32 under their Hugging Face names, head included."""
    out: dict[str, np.ndarray] = {}
    for name, t in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        out[name] = np.ascontiguousarray(t.detach().to("cpu").float().numpy())
    if "lm_head.weight" not in out:  # tied: the head is the embedding
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def convert(name: str, out: Path) -> str:
    """Convert catalogue model ``name`` (a trained Llama with a packaged file) into ``out``; the pin."""
    from dit.models.catalogue import entry
    from dit.models.packaged import ensure_packaged
    from dit.models.smollm2 import load_pretrained

    cat = entry(name)
    if cat.packaged is None or cat.params.get("family") != "llama":
        raise ValueError(f"model {name}: only trained Llama models with a packaged file are converted")
    path, _ = ensure_packaged(cat)
    model, _tok = load_pretrained(path)
    return write_hf_directory(out, llama_config_json(model.config), model_tensors(model))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dit.models.convert", description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a catalogue model with trained weights (smollm2-135m)")
    ap.add_argument("out", type=Path, help="the directory to write")
    a = ap.parse_args(argv)
    try:
        pin = convert(a.model, a.out)
    except (KeyError, ValueError, OSError, WeightsError) as exc:
        print(f"convert: {exc}", file=sys.stderr)
        return 1
    print(f"{pin}  {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
