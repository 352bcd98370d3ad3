"""`dit run` of GPT-2 (real width, two layers) with ``runtime: {tokens: 8}`` in local mode: the device
generates 8 tokens after the prompt, the per-head profile lands in heads.csv, and the per-head rows plus
the output projection account for the fused attention time within the documented tolerance
(docs/raw-results.md, ``dit.analysis.tokens.HEADWISE_TOLERANCE``)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from dit.analysis.tokens import HEADWISE_TOLERANCE
from dit.device.common import build_model
from dit.models.catalogue import entry
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO

pytestmark = pytest.mark.slow

PARAMS = {"num_layers": 2, "prompt_len": 8}
TOKENS = 8


def test_a_gpt2_run_with_tokens_writes_heads_that_sum_to_the_attention(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("gpt2 needs torch and transformers (./dev slow installs the extras)")
    catalogue = entry("gpt2")
    # the weights once here (or verified from $DIT_WEIGHTS_DIR), not in the device process
    model = build_model(
        {"name": "gpt2", "builder": catalogue.builder, "params": PARAMS, "input": {}, "seed": 0}
    )
    heads_per_layer = int(model.heads)
    scenario = {
        "name": "gpt2-tokens",
        "model": {"name": "gpt2", "params": PARAMS},
        "devices": ["device1"],
        "repetitions": 2,
        "warmup": 1,
        "seed": 0,
        "runtime": {"name": "layers", "tokens": TOKENS},
        "hardware": {"device1": {"threads": 1}},  # one intra-op thread: no thread-pool wake-ups per op
        "inference": {"enabled": False},
        "optimisation": {"enabled": False},
        "monitors": {"enabled": False},
        "timing": {"start_lead_s": 5},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    runs = tmp_path / "runs"
    result = subprocess.run(
        [*DIT, "run", str(path), "--runs-dir", str(runs), "--no-stand-in"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (run_dir,) = (runs / "gpt2-tokens").iterdir()

    raw = run_dir / "raw" / "device1" / "device1_heads.csv"
    assert raw.is_file()
    with (run_dir / "aggregate" / "heads.csv").open(newline="", encoding="utf-8") as fh:
        heads = list(csv.DictReader(fh))
    assert {h["host"] for h in heads} == {"device1"}
    per_head = [h for h in heads if h["unit"] == "head"]
    assert len(per_head) == 2 * TOKENS * 2 * heads_per_layer  # repetitions x tokens x layers x heads
    assert {int(h["token"]) for h in heads} == set(range(TOKENS))

    # per (rep, token, layer) of the decode tokens: Σ heads + projection against the fused attention
    parts: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for h in heads:
        if int(h["token"]) > 0 and h["unit"] in ("head", "projection", "attention"):
            parts[(h["rep"], h["token"], h["layer"])][h["unit"]] += int(h["latency_ns"])
    assert len(parts) == 2 * (TOKENS - 1) * 2
    assert all(p["attention"] > 0 and p["head"] > 0 and p["projection"] > 0 for p in parts.values())
    total = {u: sum(p[u] for p in parts.values()) for u in ("head", "projection", "attention")}
    ratio = (total["head"] + total["projection"]) / total["attention"]
    assert 1 / HEADWISE_TOLERANCE <= ratio <= HEADWISE_TOLERANCE, (ratio, total)

    with (run_dir / "aggregate" / "tokens.csv").open(newline="", encoding="utf-8") as fh:
        tokens = list(csv.DictReader(fh))
    assert [int(t["token"]) for t in tokens] == list(range(TOKENS))
    assert [int(t["kv_len"]) for t in tokens] == [PARAMS["prompt_len"] + t for t in range(TOKENS)]
    assert all(int(t["latency_ns"]) > 0 for t in tokens)

    summary = {
        v["name"]: v for v in json.loads((run_dir / "aggregate" / "summary.json").read_text())["values"]
    }
    assert summary["tokens"]["value"] == TOKENS
    assert summary["token_latency_mean"]["unit"] == "ns" and summary["token_latency_mean"]["value"] > 0
    assert summary["headwise_attention_ratio"]["value"] == pytest.approx(ratio)
    done = json.loads((run_dir / "raw" / "device1" / "device1_done.json").read_text())
    assert done["generation"]["tokens"] == TOKENS and done["generation"]["headwise_max_abs_diff"] < 1e-4
    assert run_processes(RunDir(run_dir).run_id) == []
