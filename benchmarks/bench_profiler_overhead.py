"""Overhead of layer-by-layer profiling: sum of per-stage times vs one uninstrumented forward pass.

    .venv/bin/python benchmarks/bench_profiler_overhead.py [--models alexnet resnet50 gpt2] [--reps 30]

For each model: ``reps`` uninstrumented forward passes (the adapter's one-piece ``forward``: the
whole Keras model in one ``tf.function``, the whole Hugging Face model in one call) and ``reps``
passes of the stdlib profiler (:func:`dit.device.profiler.profile_model`: every stage timed on its
own, CPU time and peak memory read around it), both after warm-up, interleaved in rounds so that
drift hits both alike. Printed: the medians and the overhead ``sum(stages) / forward - 1``, which
counts everything the staging and the instrumentation add (per-stage dispatch, activation hand-
over, clock and /proc reads inside the measured window). Target: <= 2 %. Weights go to
``$DIT_WEIGHTS_DIR`` (default ``~/.cache/dit/weights``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from dit.device.common import build_model
from dit.device.profiler import profile_model
from dit.models.catalogue import entry

PARAMS: dict[str, dict[str, Any]] = {
    "alexnet": {},
    "vgg16": {},
    "resnet50": {},
    "mobilenetv2": {"input_shape": [224, 224, 3]},
    "gpt2": {"prompt_len": 32},
    "tinyllama": {"num_layers": 4, "prompt_len": 32},
}


def measure(name: str, reps: int, rounds: int) -> dict[str, float]:
    model: Any = build_model(
        {"name": name, "builder": entry(name).builder, "params": PARAMS.get(name, {}), "seed": 1}
    )
    x = model.make_input()
    for _ in range(3):
        model.forward(x)
    profile_model(model, repetitions=0, warmup=3)
    fwd: list[int] = []
    staged: list[int] = []
    per_round = max(1, reps // rounds)
    for _ in range(rounds):
        for _ in range(per_round):
            t0 = time.monotonic_ns()
            model.forward(x)
            fwd.append(time.monotonic_ns() - t0)
        result = profile_model(model, repetitions=per_round, warmup=0)
        sums: dict[int, int] = {}
        for r in result.records:
            sums[r.rep] = sums.get(r.rep, 0) + r.latency_ns
        staged.extend(sums.values())
    f, s = statistics.median(fwd), statistics.median(staged)
    return {
        "stages": model.num_stages,
        "forward_ms": f / 1e6,
        "staged_ms": s / 1e6,
        "overhead_pct": 100 * (s / f - 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["alexnet", "resnet50", "gpt2"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"{'model':<12} {'stages':>6} {'forward ms':>11} {'sum(stages) ms':>15} {'overhead':>9}")
    for name in args.models:
        r = measure(name, args.reps, args.rounds)
        print(
            f"{name:<12} {r['stages']:>6.0f} {r['forward_ms']:>11.3f} {r['staged_ms']:>15.3f} "
            f"{r['overhead_pct']:>8.2f}%",
            flush=True,
        )


if __name__ == "__main__":
    main()
