"""The teacher-forced perplexity pass (issue 32, item 6): through the engine as a run configures it,
exact at tau = 0 (a direct full-sequence torch computation, and transformers' own loss), moved by
speculation that is accepted; the controller's section of the results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from headsplit import controller, engine, model  # noqa: E402
from headsplit.config import ModelConfig, preset  # noqa: E402
from headsplit.plugin.common import HELD_OUT  # noqa: E402
from headsplit.speculation import DEFAULT_CORPUS  # noqa: E402
from headsplit.units import Unit, all_units  # noqa: E402

WORKERS = ["worker1", "worker2", "worker3"]
TEXT = HELD_OUT.read_text(encoding="utf-8").strip()


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def spread(cfg: ModelConfig) -> engine.Placement:
    """Heads dealt round-robin, projection and FFN of a layer on two other workers."""
    n = len(WORKERS)
    return {
        u: WORKERS[u.head % n if u.kind == "head" else (u.layer + (u.kind == "ffn")) % n]
        for u in all_units(cfg)
    }


def make(cfg: ModelConfig, w: model.Weights, **opts: object) -> engine.Engine:
    p = spread(cfg)
    tr = engine.InProcessTransport.from_weights(cfg, w, p, WORKERS)
    return engine.Engine(cfg, tr, p, w, engine.EngineOptions(**opts))  # type: ignore[arg-type]


def direct_nll(cfg: ModelConfig, w: model.Weights, ids: list[int]) -> torch.Tensor:
    """Every position's -log p(token t + 1 | tokens <= t) from one full-sequence pass (no engine, no
    KV cache between steps, no speculation)."""
    with torch.no_grad():
        x = model.embed(cfg, w, ids[:-1], 0)
        for i in range(cfg.n_layers):
            heads = {h: model.unit_weights(cfg, w, Unit(i, "head", h)) for h in range(cfg.n_heads)}
            slots = {k: model.KVSlot(model.kv_weights(cfg, w, i, k)) for k in range(cfg.n_kv_heads)}
            outs = model.heads_forward(cfg, heads, slots, x, 0)
            cat = torch.cat([outs[h] for h in range(cfg.n_heads)], dim=-1)
            z = x + model.proj(cfg, model.unit_weights(cfg, w, Unit(i, "proj")), cat)
            x = z + model.ffn(cfg, model.unit_weights(cfg, w, Unit(i, "ffn")), z)
        logp = torch.log_softmax(model.lm_logits(cfg, w, x), dim=-1)
        return -logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_the_held_out_paragraph_is_not_in_the_speculation_corpus() -> None:
    corpus = DEFAULT_CORPUS.read_text(encoding="utf-8")
    assert len(TEXT) > 400
    assert all(sentence.strip() not in corpus for sentence in TEXT.split(". "))


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_tau_zero_perplexity_equals_a_direct_computation(name: str) -> None:
    cfg = preset(name)
    w = model.seeded_weights(cfg)
    ids = model.tokenize(TEXT, cfg)[:65]
    want = direct_nll(cfg, w, ids)
    got = make(cfg, w, speculation=True, tau=0.0).perplexity(ids)
    assert got.tokens == 64
    assert got.nll_mean == pytest.approx(float(want.mean()), rel=1e-5)
    assert got.perplexity == pytest.approx(math.exp(float(want.mean())), rel=1e-5)
    # every transition speculated and re-executed: tau = 0 keeps nothing
    assert (got.speculated, got.accepted) == (64 * (cfg.n_layers - 1), 0)
    # and without speculation the same value
    assert make(cfg, w).perplexity(ids).nll_sum == pytest.approx(got.nll_sum, rel=1e-9)


def test_accepted_speculation_shows_in_the_perplexity() -> None:
    cfg = preset("llama-tiny")
    w = model.seeded_weights(cfg)
    ids = model.tokenize(TEXT, cfg)[:33]
    exact = make(cfg, w, speculation=True, tau=0.0).perplexity(ids)
    every = make(cfg, w, speculation=True, tau=math.inf).perplexity(ids)
    assert every.accepted == every.speculated == 32 * (cfg.n_layers - 1)
    assert abs(every.perplexity - exact.perplexity) > 1e-3 * exact.perplexity


def test_the_pass_starts_again_after_a_generation_and_refuses_one_token() -> None:
    cfg = preset("gpt2-tiny")
    w = model.seeded_weights(cfg)
    ids = model.tokenize(TEXT, cfg)[:20]
    eng = make(cfg, w, speculation=True, tau=0.0)
    eng.generate(ids[:7], 5)  # KV caches hold 11 positions
    assert eng.perplexity(ids).nll_mean == pytest.approx(float(direct_nll(cfg, w, ids).mean()), rel=1e-5)
    with pytest.raises(ValueError, match="perplexity: at least 2 tokens"):
        eng.perplexity(ids[:1])


def test_the_controller_s_section_cuts_the_paragraph_to_the_model_s_positions(tmp_path: Path) -> None:
    cfg = preset("gpt2-tiny")  # max_positions 256 < the paragraph's bytes
    w = model.seeded_weights(cfg)
    doc = {
        "model": {"preset": "gpt2-tiny"},
        "controller": {"address": "127.0.0.1", "port": 1},
        "workers": [{"rank": 1, "address": "127.0.0.1"}],
        "tokens": 1,
        "speculation": True,
        "tau": 0.0,
        "perplexity": {"text": TEXT, "ids": None},
    }
    rc = controller.parse_config(doc)
    p = {u: "worker1" for u in all_units(cfg)}
    eng = engine.Engine(cfg, engine.InProcessTransport.from_weights(cfg, w, p, ["worker1"]), p, w)
    section = controller.perplexity_pass(rc, eng)
    ids = model.tokenize(TEXT, cfg)
    assert section["paragraph_tokens"] == len(ids) == len(TEXT.encode())
    assert section["tokens"] == cfg.max_positions
    assert section["perplexity"] == pytest.approx(
        math.exp(float(direct_nll(cfg, w, ids[: cfg.max_positions + 1]).mean())), rel=1e-5
    )
    assert section["tokenizer"] == "byte-level" and section["tau"] == 0.0
    import hashlib

    assert section["paragraph_sha256"] == hashlib.sha256(TEXT.encode()).hexdigest()


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("text", r"perplexity: expected null or \{text"),
        ({"text": "x"}, r"perplexity: expected null or \{text"),
        (
            {"text": "ab", "ids": [1, 512]},
            r"perplexity\.ids: expected null or a list of >= 2 token ids in 0\.\.511",
        ),
        ({"text": "ab", "ids": [True, 2]}, r"perplexity\.ids"),
    ],
)
def test_a_bad_perplexity_config_names_the_field(value: object, match: str) -> None:
    doc = {
        "model": {"preset": "gpt2-tiny"},
        "controller": {"address": "127.0.0.1", "port": 1},
        "workers": [{"rank": 1, "address": "127.0.0.1"}],
        "tokens": 1,
        "perplexity": value,
    }
    with pytest.raises(controller.ConfigError, match=match):
        controller.parse_config(doc)


@pytest.mark.slow
def test_tau_zero_perplexity_equals_transformers_loss(tmp_path: Path) -> None:
    """A tiny seeded LlamaForCausalLM saved with save_pretrained: HeadSplit's pass at tau = 0 with
    speculation gives exp of transformers' own float32 loss on the same ids."""
    transformers = pytest.importorskip("transformers")
    from headsplit import checkpoint

    torch.manual_seed(4321)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.3,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    d = tmp_path / "llama"
    hf.save_pretrained(d)
    ids = list(TEXT.encode())[:100]
    with torch.no_grad():
        loss = float(hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss)
    cfg = checkpoint.directory_config(d)
    assert cfg is not None
    w = model.load_checkpoint(cfg, d, checkpoint.checkpoint_sha256(d))
    got = make(cfg, w, speculation=True, tau=0.0).perplexity(ids)
    assert got.tokens == 99
    assert got.perplexity == pytest.approx(math.exp(loss), rel=1e-5)
