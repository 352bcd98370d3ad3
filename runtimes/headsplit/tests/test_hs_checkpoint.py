"""Real checkpoints: Hugging Face directories (pin, config.json, shards), per-worker shards, tampering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from headsplit import checkpoint, engine, model, shard  # noqa: E402
from headsplit.config import preset  # noqa: E402
from headsplit.units import Unit  # noqa: E402

PROMPT = [3, 14, 15, 9, 26, 5]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _hf_dir(tmp_path: Path, name: str, config: dict[str, Any], *, shards: int = 1) -> Path:
    """A Hugging Face-format directory written by this package (no transformers): seeded weights."""
    cfg = checkpoint.model_config(config, name)
    d = tmp_path / name
    d.mkdir()
    hf = model.to_hf(cfg, model.seeded_weights(cfg))
    if config["model_type"] == "gpt2":
        hf = {"transformer." + k: v for k, v in hf.items()}
    (d / "config.json").write_text(json.dumps(config))
    names = sorted(hf)
    if shards == 1:
        model.write_safetensors(d / "model.safetensors", hf)
        return d
    weight_map: dict[str, str] = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        model.write_safetensors(d / file, {n: hf[n] for n in part})
        weight_map.update(dict.fromkeys(part, file))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


LLAMA = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-5, "hidden_act": "silu"}  # fmt: skip
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 64, "n_positions": 64,
        "activation_function": "gelu_new"}  # fmt: skip


def test_directory_pin_is_the_manifest_hash_over_config_index_and_shards(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, "llama", LLAMA, shards=3)
    (d / "README.md").write_text("not pinned")
    sums = checkpoint.manifest(d)
    assert sorted(sums) == ["config.json", *(f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)),
                            "model.safetensors.index.json"]  # fmt: skip
    text = "".join(f"{sums[n]}  {n}\n" for n in sorted(sums))
    import hashlib

    assert checkpoint.checkpoint_sha256(d) == hashlib.sha256(text.encode()).hexdigest()
    # a shard listed by the index but absent is named
    pin = checkpoint.checkpoint_sha256(d)
    (d / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(checkpoint.CheckpointError, match=r"model-00002-of-00003\.safetensors"):
        model.load_checkpoint(checkpoint.directory_config(d), d, pin)  # type: ignore[arg-type]


@pytest.mark.parametrize(("config", "shards"), [(LLAMA, 3), (GPT2, 1)], ids=["llama", "gpt2"])
def test_a_directory_loads_with_its_config_and_generates_like_the_seeded_model(
    tmp_path: Path, config: dict[str, Any], shards: int
) -> None:
    d = _hf_dir(tmp_path, "m", config, shards=shards)
    cfg = checkpoint.directory_config(d)
    assert cfg is not None and cfg.family == config["model_type"] and cfg.n_layers == 2
    w = model.load_checkpoint(cfg, d, checkpoint.checkpoint_sha256(d))
    assert (
        model.generate(cfg, w, PROMPT, 4)[0] == model.generate(cfg, model.seeded_weights(cfg), PROMPT, 4)[0]
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "mistral"}, "model_type"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"head_dim": 16}, "head_dim"),
        ({"num_key_value_heads": 3}, "n_kv_heads"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_a_config_headsplit_cannot_run_is_refused_naming_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    d = tmp_path / "x"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**LLAMA, **change}))
    with pytest.raises(checkpoint.CheckpointError, match=field):
        checkpoint.directory_config(d)


def test_gpt2_exact_gelu_is_refused_naming_activation_function() -> None:
    with pytest.raises(checkpoint.CheckpointError, match=r"activation_function: 'gelu'"):
        checkpoint.model_config({**GPT2, "activation_function": "gelu"}, "g")


def test_a_tampered_file_is_refused_naming_the_file_and_both_hashes(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, "llama", LLAMA, shards=2)
    pin = checkpoint.write_sums(d)  # a copy made by this project carries SHA256SUMS
    assert pin == checkpoint.checkpoint_sha256(d)
    checkpoint.verify(d, pin)
    victim = d / "model-00002-of-00002.safetensors"
    good = checkpoint.sha256_file(victim)
    raw = bytearray(victim.read_bytes())
    raw[-1] ^= 0xFF
    victim.write_bytes(bytes(raw))
    bad = checkpoint.sha256_file(victim)
    with pytest.raises(checkpoint.CheckpointError) as err:
        model.load_checkpoint(checkpoint.directory_config(d), d, pin)  # type: ignore[arg-type]
    assert str(victim) in str(err.value) and good in str(err.value) and bad in str(err.value)
    # without SHA256SUMS (the user's own directory) the manifest hash is refused, both hashes named
    (d / "SHA256SUMS").unlink()
    with pytest.raises(checkpoint.CheckpointError, match=f"pinned {pin}.*{bad}"):
        checkpoint.verify(d, pin)


def test_per_worker_shards_hold_exactly_their_units_and_generate_exactly(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, "llama", LLAMA, shards=2)
    pin = checkpoint.checkpoint_sha256(d)
    cfg = checkpoint.directory_config(d)
    assert cfg is not None
    plan = shard.plan_for(cfg, 3, "roundrobin", 1 << 30, 64)
    out = tmp_path / "shards"
    doc = shard.write_shards(cfg, d, pin, plan, out)
    states: dict[str, engine.WorkerState] = {}
    for worker in ("worker1", "worker2", "worker3"):
        entry = doc["files"][worker]
        units = [Unit.parse(k) for k in entry["units"]]
        assert units == engine.units_of(plan, worker)
        with (out / entry["file"]).open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        held = sorted(k for k in header if k != "__metadata__")
        assert held == sorted(engine.share_tensor_names(cfg, units))  # exactly its units' tensors
        layers = {u.layer for u in units}
        assert all(int(n.split(".")[0][1:]) in layers for n in held)
        w = model.load_checkpoint(cfg, out / entry["file"], entry["sha256"], names=held)
        st = engine.WorkerState(worker, cfg)
        st.load(*engine.build_share(cfg, w, units))
        states[worker] = st
    cw = model.load_checkpoint(
        cfg, out / "controller.safetensors", doc["files"]["controller"]["sha256"],
        names=model.controller_tensor_names(cfg),
    )  # fmt: skip
    opts = engine.EngineOptions(speculation=True, tau=0.0)
    res = engine.Engine(cfg, engine.InProcessTransport(states), plan, cw, opts).generate(PROMPT, 5)
    ref_ids, ref_logits = model.generate(cfg, model.load_checkpoint(cfg, d, pin), PROMPT, 5)
    assert res.generated == ref_ids
    assert torch.equal(torch.stack(res.logits), ref_logits)
    # a tampered worker shard is refused on the worker: file and both hashes
    f = out / doc["files"]["worker2"]["file"]
    f.write_bytes(f.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(checkpoint.CheckpointError, match=f"{f}: pinned {doc['files']['worker2']['sha256']}"):
        model.load_checkpoint(cfg, f, doc["files"]["worker2"]["sha256"])


def test_shard_cli_refuses_a_wrong_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _hf_dir(tmp_path, "gpt2", GPT2)
    rc = shard.main(
        ["--checkpoint", str(d), "--sha256", "0" * 64, "--workers", "2", "--out", str(tmp_path / "o")]
    )
    assert rc == 2 and "checkpoint.sha256 mismatch" in capsys.readouterr().err
    assert shard.main(["--checkpoint", str(d), "--sha256", checkpoint.checkpoint_sha256(d), "--workers", "2",
                       "--out", str(tmp_path / "o")]) == 0  # fmt: skip
    assert json.loads((tmp_path / "o" / "shards.json").read_text())["model"]["family"] == "gpt2"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_tau0_generation_from_a_transformers_checkpoint_equals_transformers_greedy(
    tmp_path: Path, family: str
) -> None:
    """A tiny seeded LlamaForCausalLM / GPT2LMHeadModel saved with save_pretrained (sharded for Llama);
    HeadSplit's engine at tau = 0 with speculation, from per-worker shards, gives transformers' ids."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1234)
    if family == "llama":
        hf_cfg = transformers.LlamaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.3,
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )  # fmt: skip
        hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    else:
        hf_cfg = transformers.GPT2Config(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.3,
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )  # fmt: skip
        hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    d = tmp_path / family
    hf.save_pretrained(d, max_shard_size="20KB" if family == "llama" else "1GB")
    n = 10
    with torch.no_grad():
        want = hf.generate(torch.tensor([PROMPT]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    want_ids = want[0, len(PROMPT) :].tolist()
    pin = checkpoint.checkpoint_sha256(d)
    cfg = checkpoint.directory_config(d)
    assert cfg is not None
    plan = shard.plan_for(cfg, 2, "greedy", 1 << 30, 64)
    doc = shard.write_shards(cfg, d, pin, plan, tmp_path / "shards")
    states = {}
    for worker in ("worker1", "worker2"):
        entry = doc["files"][worker]
        units = [Unit.parse(k) for k in entry["units"]]
        st = engine.WorkerState(worker, cfg)
        w = model.load_checkpoint(
            cfg, tmp_path / "shards" / entry["file"], entry["sha256"], names=entry["tensors"]
        )
        st.load(*engine.build_share(cfg, w, units))
        states[worker] = st
    cw = model.load_checkpoint(cfg, d, pin, names=model.controller_tensor_names(cfg))
    res = engine.Engine(
        cfg, engine.InProcessTransport(states), plan, cw, engine.EngineOptions(speculation=True, tau=0.0)
    ).generate(PROMPT, n)
    assert res.generated == want_ids
    assert len(set(want_ids)) > 1  # not a degenerate repetition


def test_reduced_presets_still_load_from_a_single_file(tmp_path: Path) -> None:
    cfg = preset("gpt2-tiny")
    path = tmp_path / "m.safetensors"
    model.write_safetensors(path, model.seeded_weights(cfg))
    assert checkpoint.directory_config(path) is None
    assert set(model.load_checkpoint(cfg, path, checkpoint.sha256_file(path))) == set(
        model.tensor_shapes(cfg)
    )
