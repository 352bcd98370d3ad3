"""The decoder: seeded weights, the per-unit decomposition against the reference, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from headsplit import model  # noqa: E402
from headsplit.config import preset  # noqa: E402
from headsplit.units import Unit  # noqa: E402

PROMPT = [3, 14, 15, 92, 65, 35]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_seeded_weights_are_deterministic_per_tensor() -> None:
    cfg = preset("llama-tiny")
    full = model.seeded_weights(cfg)
    part = model.seeded_weights(cfg, ["L2.q.weight", "embed.weight"])
    assert torch.equal(full["L2.q.weight"], part["L2.q.weight"])
    assert torch.equal(full["embed.weight"], model.seeded_weights(cfg)["embed.weight"])
    assert not torch.equal(full["L1.q.weight"], full["L2.q.weight"])
    assert 0.015 < float(full["L0.q.weight"].std()) < 0.025


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_per_unit_decomposition_equals_reference_bit_for_bit(name: str) -> None:
    """Heads computed one worker-share at a time (two shares, different KV copies), gathered,
    projected, FFN'd: identical bits to the reference."""
    cfg = preset(name)
    w = model.seeded_weights(cfg)
    ref_ids, ref_logits = model.generate(cfg, w, PROMPT, 6)
    share_a = [h for h in range(cfg.n_heads) if h % 2 == 0]
    share_b = [h for h in range(cfg.n_heads) if h % 2 == 1]
    slots = [
        [
            {kvh: model.KVSlot(model.kv_weights(cfg, w, i, kvh)) for kvh in range(cfg.n_kv_heads)}
            for _ in range(2)
        ]
        for i in range(cfg.n_layers)
    ]
    ids: list[int] = []
    logits = []
    step, start = list(PROMPT), 0
    with torch.no_grad():
        for _ in range(6):
            x = model.embed(cfg, w, step, start)
            for i in range(cfg.n_layers):
                outs: dict[int, Any] = {}
                for share, sl in ((share_b, slots[i][1]), (share_a, slots[i][0])):
                    outs.update(
                        model.heads_forward(
                            cfg,
                            {h: model.unit_weights(cfg, w, Unit(i, "head", h)) for h in share},
                            sl,
                            x,
                            start,
                        )
                    )
                z = x + model.proj(
                    cfg,
                    model.unit_weights(cfg, w, Unit(i, "proj")),
                    torch.cat([outs[h] for h in range(cfg.n_heads)], -1),
                )
                x = z + model.ffn(cfg, model.unit_weights(cfg, w, Unit(i, "ffn")), z)
            lg = model.lm_logits(cfg, w, x[-1])
            ids.append(int(lg.argmax()))
            logits.append(lg)
            start += len(step)
            step = [ids[-1]]
    assert ids == ref_ids
    assert torch.equal(torch.stack(logits), ref_logits)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_batched_formulation_agrees(name: str) -> None:
    cfg = preset(name)
    w = model.seeded_weights(cfg)
    ref_ids, ref_logits = model.generate(cfg, w, PROMPT, 8)
    ids, logits = model.batched_generate(cfg, w, PROMPT, 8)
    assert ids == ref_ids
    assert torch.allclose(logits, ref_logits, atol=1e-5)


def test_single_head_function_matches_share() -> None:
    cfg = preset("gpt2-tiny")
    w = model.seeded_weights(cfg)
    x = model.embed(cfg, w, PROMPT, 0)
    u = Unit(0, "head", 2)
    one = model.head(cfg, model.unit_weights(cfg, w, u), model.KVSlot(model.kv_weights(cfg, w, 0, 2)), x, 0)
    outs = model.heads_forward(
        cfg, {2: model.unit_weights(cfg, w, u)}, {2: model.KVSlot(model.kv_weights(cfg, w, 0, 2))}, x, 0
    )
    assert one.shape == (len(PROMPT), cfg.head_dim)
    assert torch.equal(one, outs[2])


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_checkpoint_round_trip_hf_layout(tmp_path: Path, name: str) -> None:
    cfg = preset(name)
    w = model.seeded_weights(cfg)
    path = tmp_path / "model.safetensors"
    model.write_safetensors(path, model.to_hf(cfg, w))
    sha = model.sha256_file(path)
    loaded = model.load_checkpoint(cfg, path, sha)
    assert set(loaded) == set(model.tensor_shapes(cfg))
    for n, t in loaded.items():
        assert torch.equal(t, w[n]), n
    # a directory pins the manifest hash
    assert model.load_checkpoint(cfg, tmp_path, model.checkpoint_sha256(tmp_path))["embed.weight"].shape == (
        cfg.vocab,
        cfg.hidden,
    )
    # a worker reads only its share
    part = model.load_checkpoint(cfg, path, sha, names=["L1.o.weight"])
    assert list(part) == ["L1.o.weight"]


def test_checkpoint_hash_mismatch_is_named(tmp_path: Path) -> None:
    cfg = preset("gpt2-tiny")
    path = tmp_path / "m.safetensors"
    model.write_safetensors(path, model.seeded_weights(cfg))
    with pytest.raises(model.CheckpointError, match=r"checkpoint\.sha256 mismatch"):
        model.load_checkpoint(cfg, path, "0" * 64)


def test_checkpoint_wrong_shape_is_named(tmp_path: Path) -> None:
    cfg = preset("gpt2-tiny")
    w = model.seeded_weights(cfg)
    w["L1.fc.weight"] = torch.zeros(3, 3)
    path = tmp_path / "m.safetensors"
    model.write_safetensors(path, w)
    with pytest.raises(model.CheckpointError, match=r"L1\.fc\.weight has shape \(3, 3\)"):
        model.load_checkpoint(cfg, path, model.sha256_file(path))


def test_checkpoint_missing_path(tmp_path: Path) -> None:
    with pytest.raises(model.CheckpointError, match="no such file"):
        model.load_checkpoint(preset("gpt2-tiny"), tmp_path / "nope", "0" * 64)


def test_prompt_too_long_is_named() -> None:
    cfg = preset("gpt2-tiny")
    with pytest.raises(ValueError, match="max_positions"):
        model.generate(cfg, model.seeded_weights(cfg), [1] * 250, 10)
