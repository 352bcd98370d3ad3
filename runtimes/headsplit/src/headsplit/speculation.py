"""The offline speculation profile: how often each layer transition passes the test, and whether to
speculate on it.

``python -m headsplit.speculation --model gpt2-tiny --tau 0.05 --out profile.json``

Over a corpus (default ``data/corpus.txt``, written by this project; byte-level tokens, id = byte %
vocab) cut into windows, the exact forward pass gives for every position and layer l the ratio
||FFN(Z_l)|| / ||Z_l||. Transition l -> l+1 (Z_l forwarded to layer l+1's heads) has acceptance
p_l = share of positions with ratio < tau. The expected saving per token of speculating on it,
from decode-step timings measured here (attention of layer l+1 spread over ``workers`` workers,
t_a = its all-heads time / workers; FFN of layer l, t_f):

    saving_l = p_l * min(t_a, t_f) - (1 - p_l) * max(0, t_a - t_f)

(accepted: the attention hides under the FFN; rejected: the exact attention waits for the
speculative one when that outlasts the FFN). A transition speculates iff p_l >= 0.7 and
saving_l > 0. The JSON document carries ``sha256``: the SHA-256 of its own canonical JSON without
that field, which ``load_profile`` checks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headsplit import model
from headsplit.config import DEFAULT_TAU, ModelConfig, preset
from headsplit.units import Unit

DEFAULT_CORPUS = Path(__file__).parent / "data" / "corpus.txt"
MIN_ACCEPTANCE = 0.7
PROFILE_VERSION = 1


class ProfileError(ValueError):
    pass


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: v for k, v in doc.items() if k != "sha256"}, sort_keys=True, separators=(",", ":")
    ).encode()


TAUS = (0.02, DEFAULT_TAU, 0.1, 0.2, 0.3)  # the tolerances the acceptance table reports (issue 32)


@dataclass
class Measurement:
    """What one pass over the corpus gives: per layer, every position's ||FFN(Z)|| / ||Z|| and the
    timed decode steps' attention and FFN times (ns). Any tau's profile is derived from it."""

    ratios: list[list[float]]
    attn_ns: list[list[int]]
    ffn_ns: list[list[int]]
    window: int
    windows: int


def measure(
    cfg: ModelConfig,
    w: model.Weights,
    ids: list[int],
    *,
    window: int = 64,
    max_windows: int | None = None,
) -> Measurement:
    """The exact forward pass over ``ids`` cut into windows (each: a prefill, then a timed decode step)."""
    window = min(window, cfg.max_positions)
    if window < 2:
        raise ProfileError(f"window: must be >= 2, got {window}")
    chunks = [ids[i : i + window] for i in range(0, len(ids) - 1, window)]
    chunks = [c for c in chunks if len(c) >= 2][: max_windows or None]
    if not chunks:
        raise ProfileError(f"corpus: too short ({len(ids)} tokens) for one window of >= 2 tokens")
    bad = [i for i in ids if not 0 <= i < cfg.vocab]
    if bad:
        raise ProfileError(f"corpus ids: {bad[0]} is outside the vocabulary 0..{cfg.vocab - 1}")
    L = cfg.n_layers
    heads = [
        {h: model.unit_weights(cfg, w, Unit(i, "head", h)) for h in range(cfg.n_heads)} for i in range(L)
    ]
    projs = [model.unit_weights(cfg, w, Unit(i, "proj")) for i in range(L)]
    ffns = [model.unit_weights(cfg, w, Unit(i, "ffn")) for i in range(L)]
    ratios: list[list[float]] = [[] for _ in range(L)]
    attn_ns: list[list[int]] = [[] for _ in range(L)]
    ffn_ns: list[list[int]] = [[] for _ in range(L)]
    with torch.no_grad():
        for chunk in chunks:
            slots = [
                {k: model.KVSlot(model.kv_weights(cfg, w, i, k)) for k in range(cfg.n_kv_heads)}
                for i in range(L)
            ]
            # the prefill of all but the last token, then the last as a timed decode step
            for part, start, timed in ((chunk[:-1], 0, False), (chunk[-1:], len(chunk) - 1, True)):
                x = model.embed(cfg, w, part, start)
                for i in range(L):
                    t0 = time.perf_counter_ns()
                    outs = model.heads_forward(cfg, heads[i], slots[i], x, start)
                    t1 = time.perf_counter_ns()
                    z = x + model.proj(cfg, projs[i], torch.cat([outs[h] for h in range(cfg.n_heads)], -1))
                    t2 = time.perf_counter_ns()
                    delta = model.ffn(cfg, ffns[i], z)
                    t3 = time.perf_counter_ns()
                    r = torch.linalg.vector_norm(delta, dim=-1) / torch.linalg.vector_norm(z, dim=-1)
                    ratios[i].extend(float(v) for v in r)
                    if timed:
                        attn_ns[i].append(t1 - t0)
                        ffn_ns[i].append(t3 - t2)
                    x = z + delta
    return Measurement(ratios, attn_ns, ffn_ns, window, len(chunks))


def acceptance(m: Measurement, taus: Sequence[float]) -> list[dict[str, float]]:
    """Per layer transition l -> l+1, the share of positions with ratio < tau, for each tau."""
    return [
        {f"{tau:g}": sum(1 for r in m.ratios[i] if r < tau) / len(m.ratios[i]) for tau in taus}
        for i in range(len(m.ratios) - 1)
    ]


def summarise(cfg: ModelConfig, m: Measurement, tau: float, *, workers: int = 4) -> dict[str, Any]:
    """The profile document at ``tau`` (without corpus identity or sha256; see ``build``)."""
    if tau < 0:
        raise ProfileError(f"tau: must be >= 0, got {tau}")
    if workers < 1:
        raise ProfileError(f"workers: must be >= 1, got {workers}")
    L = len(m.ratios)
    transitions = []
    for i in range(L - 1):
        p = sum(1 for r in m.ratios[i] if r < tau) / len(m.ratios[i])
        t_a = statistics.median(m.attn_ns[i + 1]) / workers
        t_f = statistics.median(m.ffn_ns[i])
        saving = p * min(t_a, t_f) - (1 - p) * max(0.0, t_a - t_f)
        transitions.append(
            {
                "layer": i,
                "to": i + 1,
                "acceptance": p,
                "ratio_median": statistics.median(m.ratios[i]),
                "attention_ns": int(t_a),
                "ffn_ns": int(t_f),
                "expected_saving_ns": int(saving),
                "speculate": p >= MIN_ACCEPTANCE and saving > 0,
            }
        )
    positions = len(m.ratios[0])
    return {
        "version": PROFILE_VERSION,
        "model": cfg.to_json(),
        "tau": tau,
        "window": m.window,
        "workers": workers,
        "positions": positions,
        "rule": {"min_acceptance": MIN_ACCEPTANCE, "min_expected_saving_ns": 0},
        "transitions": transitions,
        "speculate_layers": [t["layer"] for t in transitions if t["speculate"]],
        "overall_acceptance": statistics.fmean(t["acceptance"] for t in transitions) if transitions else 0.0,
        "acceptance_by_tau": acceptance(m, TAUS),
    }


def profile(
    cfg: ModelConfig,
    w: model.Weights,
    text: str,
    tau: float,
    *,
    window: int = 64,
    workers: int = 4,
    max_windows: int | None = None,
    ids: list[int] | None = None,
) -> dict[str, Any]:
    """The profile document over ``text`` in byte-level tokens, or over ``ids`` (a trained model's own
    tokens) when given."""
    if tau < 0:
        raise ProfileError(f"tau: must be >= 0, got {tau}")
    if workers < 1:
        raise ProfileError(f"workers: must be >= 1, got {workers}")
    tokens = model.tokenize(text, cfg) if ids is None else ids
    m = measure(cfg, w, tokens, window=window, max_windows=max_windows)
    return summarise(cfg, m, tau, workers=workers)


def build(
    cfg: ModelConfig,
    w: model.Weights,
    tau: float,
    *,
    corpus: Path = DEFAULT_CORPUS,
    checkpoint_sha256: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """Profile over a corpus file; the document records the corpus's SHA-256 and its own."""
    try:
        raw = corpus.read_bytes()
    except OSError as exc:
        raise ProfileError(f"corpus: {exc}") from None
    doc = profile(cfg, w, raw.decode("utf-8", errors="replace"), tau, **kw)
    doc["corpus"] = {"path": str(corpus), "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    if kw.get("ids") is not None:
        # the corpus in the model's own tokens (tokenized where a tokenizer is: the machine running dit)
        doc["corpus"]["tokens"] = len(kw["ids"])
    doc["checkpoint_sha256"] = checkpoint_sha256
    doc["sha256"] = hashlib.sha256(_canonical(doc)).hexdigest()
    return doc


def load_profile(path: str | Path) -> dict[str, Any]:
    """Read a profile, check its own sha256 and its shape; errors name the field."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"speculation_profile {p}: {exc}") from None
    if not isinstance(doc, dict) or "sha256" not in doc:
        raise ProfileError(f"speculation_profile {p}: sha256: missing")
    actual = hashlib.sha256(_canonical(doc)).hexdigest()
    if actual != doc["sha256"]:
        raise ProfileError(
            f"speculation_profile {p}: sha256 mismatch: recorded {doc['sha256']}, content has {actual}"
        )
    layers = doc.get("speculate_layers")
    if not isinstance(layers, list) or not all(isinstance(i, int) for i in layers):
        raise ProfileError(f"speculation_profile {p}: speculate_layers: expected a list of layer numbers")
    return doc


def _read_ids(path: Path) -> list[int]:
    try:
        ids = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"--ids {path}: {exc}") from None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ProfileError(f"--ids {path}: expected a JSON list of token ids")
    return ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m headsplit.speculation", description="Build a speculation profile."
    )
    ap.add_argument("--model", required=True, help="a preset name")
    ap.add_argument("--tau", type=float, default=DEFAULT_TAU)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument(
        "--ids",
        help="a JSON list: the corpus in the model's own tokens (a trained model; else byte-level tokens)",
    )
    ap.add_argument("--checkpoint", help="safetensors file or HF directory (else seeded weights)")
    ap.add_argument("--sha256", help="the checkpoint's pinned SHA-256 (required with --checkpoint)")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    try:
        cfg = preset(a.model)
        if a.checkpoint:
            if not a.sha256:
                raise ProfileError("--sha256: required with --checkpoint")
            from headsplit.checkpoint import directory_config

            cfg = directory_config(Path(a.checkpoint)) or cfg  # a HF directory: its config.json
            w = model.load_checkpoint(cfg, a.checkpoint, a.sha256)
        else:
            w = model.seeded_weights(cfg)
        ids = _read_ids(Path(a.ids)) if a.ids else None
        doc = build(
            cfg,
            w,
            a.tau,
            corpus=Path(a.corpus),
            checkpoint_sha256=a.sha256,
            window=a.window,
            workers=a.workers,
            max_windows=a.max_windows,
            ids=ids,
        )
    except ValueError as exc:
        print(f"headsplit speculation: {exc}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    n_spec, n_all = len(doc["speculate_layers"]), len(doc["transitions"])
    acc = doc["overall_acceptance"]
    print(f"{out}: {n_spec}/{n_all} transitions speculate, mean acceptance {acc:.2f}, sha256 {doc['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
