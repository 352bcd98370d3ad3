"""Real PyTorch decoders: head-wise attention, stages, generation, per-head profiles, TinyLlama."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from dit.device.adapter import StageModel
from dit.device.common import build_model
from dit.device.profiler import profile_model
from dit.models.catalogue import entry, stage_count
from dit.models.decoder_profile import HEAD_COLUMNS, profile_decoder, write_heads_csv
from dit.models.equivalence import check_partition_equivalence
from dit.models.hf_decoder import FAMILIES, build_torch_model, head_outputs, headwise_sum, make_config

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def build(name: str, params: dict[str, Any]) -> Any:
    return build_model({"name": name, "builder": entry(name).builder, "params": params, "seed": 5})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_headwise_sum_equals_fused_attention(family: str) -> None:
    """Sum of per-head outputs (+ output bias once) == the fused module, framework-initialised
    random weights with random biases and norms, prefill and a cached decode step."""
    fam = FAMILIES[family]
    torch.manual_seed(0)
    cfg = make_config(fam, {**fam.tiny, **({"attention_bias": True} if family != "gpt2" else {})}, 1)
    model = build_torch_model(fam, cfg, "eager")
    for p in model.parameters():
        p.data.uniform_(-0.2, 0.2)
    base = getattr(model, fam.base)
    attn = getattr(getattr(base, fam.layers)[0], fam.attn)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    hidden = torch.randn(1, 7, int(cfg.hidden_size))
    mask = torch.full((7, 7), torch.finfo(torch.float32).min).triu(1)[None, None]
    kwargs: dict[str, Any] = {"attention_mask": mask}
    pos = None
    if fam.rotary:
        pos = base.rotary_emb(hidden, torch.arange(7).unsqueeze(0))
        kwargs["position_embeddings"] = pos
    with torch.inference_mode():
        fused = attn(hidden, **kwargs)[0]
    res = head_outputs(fam, attn, hidden, heads=heads, kv_heads=kv, position_embeddings=pos)
    assert len(res.outputs) == heads and all(t > 0 for t in res.head_ns)
    assert (headwise_sum(res) - fused).abs().max().item() < 1e-5
    if family in ("gpt2", "qwen2", "llama"):
        assert res.bias is not None or family == "qwen2"
    # a decode step against the per-head caches equals the fused module on the full sequence
    past = list(zip([k[:6] for k in res.keys], [v[:6] for v in res.values], strict=True))
    pos6 = None
    if fam.rotary:
        pos6 = (pos[0][:, 6:], pos[1][:, 6:])
    res6 = head_outputs(
        fam, attn, hidden[:, 6:], heads=heads, kv_heads=kv, position_embeddings=pos6, offset=6, past=past
    )
    assert (headwise_sum(res6) - fused[:, 6:]).abs().max().item() < 1e-5


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_stages_generation_and_equivalence(family: str) -> None:
    m = build("hf_decoder", {"family": family, "num_layers": 2, "prompt_len": 8})
    assert isinstance(m, StageModel)
    assert m.num_stages == 4 == stage_count("hf_decoder", {"num_layers": 2})
    check_partition_equivalence(m, tolerance=1e-4)
    x = m.make_input()
    assert m.generate(x, 4) == m.reference_generate(x, 4)


@pytest.mark.parametrize("name", ["gpt2", "tinyllama"])
def test_real_width_shallow(name: str, tmp_path: Path) -> None:
    """GPT-2 and TinyLlama at their real width, two layers: stages, profiles, equivalence."""
    m = build(name, {"num_layers": 2, "prompt_len": 8})
    assert m.num_stages == 4 and m.hidden == (768 if name == "gpt2" else 2048)
    if name == "tinyllama":
        assert (m.heads, m.kv_heads, m.head_dim, m.intermediate) == (32, 4, 64, 5632)
    check_partition_equivalence(m, tolerance=1e-3)
    stages = profile_model(m, repetitions=1, warmup=1)
    assert len(stages.records) == m.num_stages + 1
    prof = profile_decoder(m, tokens=3, repetitions=1, warmup=1)
    assert prof.warmup == 1 and prof.headwise_max_abs_diff < 1e-4
    heads = [r for r in prof.records if r.unit == "head"]
    assert len(heads) == 3 * 2 * m.heads
    assert {r.unit for r in prof.records} == {
        "head",
        "head_proj",
        "attention",
        "projection",
        "ffn",
        "layer",
        "stage",
    }
    assert [r.kv_len for r in heads if r.layer == 0 and r.head == 0] == [8, 9, 10]
    assert prof.generated == [m.reference_generate(m.make_input(), 3)]
    write_heads_csv(tmp_path / "heads.csv", prof)
    with open(tmp_path / "heads.csv", encoding="utf-8") as fh:
        assert tuple(next(csv.reader(fh))) == HEAD_COLUMNS


def test_gpt2_catalogue_weights() -> None:
    m = build("gpt2", {"prompt_len": 4})
    assert m.num_stages == 14
    assert m.weights.source == "catalogue" and m.weights.sha256 == entry("gpt2").sha256
    assert m.head.weight.data_ptr() == m.embed.weight.data_ptr()  # tied, as in GPT-2
    check_partition_equivalence(m, tolerance=1e-3, points=[0, 1, 7, 13, 14])


def test_tinyllama_full_depth() -> None:
    """The full 22-layer TinyLlama once: catalogue checksum, 24 stages, equivalence, tokens."""
    m = build("tinyllama", {"prompt_len": 8})
    assert m.num_stages == 24 and len(m.layers) == 22
    assert sum(p.numel() for p in m.model.parameters()) == 1_100_048_384
    assert m.weights.source == "catalogue" and m.weights.sha256 == entry("tinyllama").sha256
    check_partition_equivalence(m, tolerance=1e-3, points=[0, 1, 12, 23, 24])
    x = m.make_input()
    assert m.generate(x, 2) == m.reference_generate(x, 2)
