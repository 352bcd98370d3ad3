"""The Hugging Face directory made from trained weights for HeadSplit (issue 32): byte-reproducible,
pinned by its manifest, and a config HeadSplit reads with the model's real rotary base."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from dit.mirror.checkpoints import pin_of
from dit.models.convert import llama_config_json, write_hf_directory
from dit.models.weights import uniform

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runtimes" / "headsplit" / "src"))
from headsplit import checkpoint as hs_checkpoint  # noqa: E402  (torch-free)

# SmolLM2-135M's shape at 2 layers and a small vocabulary; transformers 5 keeps rope_theta in
# rope_parameters
CONFIG = SimpleNamespace(
    hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
    num_hidden_layers=2, vocab_size=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
    bos_token_id=1, eos_token_id=2, hidden_act="silu",
    rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
)  # fmt: skip


def _tensors() -> dict[str, np.ndarray]:
    shapes = {
        "model.embed_tokens.weight": (64, 576),
        "model.norm.weight": (576,),
        "lm_head.weight": (64, 576),
    }
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (576, 576), p + "self_attn.k_proj.weight": (192, 576),
            p + "self_attn.v_proj.weight": (192, 576), p + "self_attn.o_proj.weight": (576, 576),
            p + "mlp.gate_proj.weight": (1536, 576), p + "mlp.up_proj.weight": (1536, 576),
            p + "mlp.down_proj.weight": (576, 1536), p + "input_layernorm.weight": (576,),
            p + "post_attention_layernorm.weight": (576,),
        }  # fmt: skip
    return {name: uniform(0, name, shape, 0.05) for name, shape in shapes.items()}


def test_conversion_is_byte_reproducible_and_pinned_by_its_manifest(tmp_path: Path) -> None:
    pins = [write_hf_directory(tmp_path / d, llama_config_json(CONFIG), _tensors()) for d in ("a", "b")]
    assert pins[0] == pins[1]
    for name in ("config.json", "model.safetensors", "SHA256SUMS"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # the pin is the testbed's and HeadSplit's definition, and HeadSplit verifies the directory by it
    assert pin_of(tmp_path / "a") == pins[0] == hs_checkpoint.checkpoint_sha256(tmp_path / "a")
    hs_checkpoint.verify(tmp_path / "a", pins[0])


def test_headsplit_reads_the_config_with_the_real_rotary_base(tmp_path: Path) -> None:
    write_hf_directory(tmp_path / "a", llama_config_json(CONFIG), _tensors())
    cfg = hs_checkpoint.directory_config(tmp_path / "a")
    assert cfg is not None
    assert (cfg.family, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.hidden) == ("llama", 2, 9, 3, 576)
    assert cfg.rope_theta == 100000.0  # not HeadSplit's 10000 default
    assert cfg.norm_eps == 1e-5
