"""Overhead of stage-by-stage profiling: sum of per-stage times vs one uninstrumented forward pass.

    .venv/bin/python benchmarks/bench_profiler_overhead.py [--models alexnet gpt2] [--reps 200] [--block 10]
        [--min-seconds 3]

Default: every Keras (TensorFlow) model of the catalogue (``keras_app`` only through its named
applications) and GPT-2. Each method is measured as it runs in use, passes back to back with a warm
framework thread pool: in blocks of ``--block`` passes after one discarded pass (a pass right after
another method's stage-by-stage calls meets a colder pool). The blocks of all methods alternate, in a
seeded random order per round, ``--reps / --block`` rounds, so that load drift on a shared machine
hits every method alike (a block of a 2 ms model lasts 20 ms). A fast model gets more passes, so that
each method's last at least ``--min-seconds`` (200 passes of the 1 ms GRU left its figure moving by 5
points between runs; the ``reps`` column says how many ran):

* ``forward``: the adapter's uninstrumented one-piece ``forward`` (the whole Keras model in one
  ``tf.function``, the whole Hugging Face model in one call), wall time around the call;
* ``per-stage``: the stdlib profiler (:func:`dit.device.profiler.profile_model`) with
  ``one_call=False``: one framework call per stage, each timed on its own (the method before the
  one-call timing; for models without ``timed_pass``, such as GPT-2, it is the only method);
* ``one-call``: the profiler's default: a model that implements ``timed_pass`` (Keras) runs all
  stages in ONE ``tf.function`` call with ``tf.timestamp()`` between the stages; any other model (GPT-2)
  its stages back to back with a clock read between them (``latency_method: back_to_back``);
* ``call wall``: the wall time around that one ``timed_pass`` call, i.e. what the timestamps and
  the control dependencies that order them cost the forward pass, dispatch included.

Printed per model (medians over the passes): the times, the overheads ``sum(stages) / forward - 1``
of both methods and ``call wall / forward - 1``, the median over rounds of the one-call block's median
against the forward block's of the same round (``paired``, the estimate least moved by drift), the
per-stage / one-call ratio, and the 1-minute load average at the start and end of the row.
Target: <= 2 %. Weights go to ``$DIT_WEIGHTS_DIR`` (default ``~/.cache/dit/weights``; the first run
generates them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from dit.device.adapter import TimedPass
from dit.device.common import build_model
from dit.device.profiler import profile_model
from dit.extras import require_extras
from dit.models.catalogue import entry

PARAMS: dict[str, dict[str, Any]] = {
    "gpt2": {"prompt_len": 32},
    "tinyllama": {"num_layers": 4, "prompt_len": 32},
}


def keras_models() -> list[str]:
    """The catalogue's TensorFlow models (``keras_app`` itself needs ``params.application``)."""
    raw = json.loads(resources.files("dit.models").joinpath("catalogue.json").read_text(encoding="utf-8"))
    return [
        name
        for name, e in raw["models"].items()
        if e["framework"] == "tensorflow"
        and (e["builder"] != "dit.models.keras_apps:build" or "application" in e["params"])
    ]


def stage_sums(result: Any) -> list[int]:
    sums: dict[int, int] = {}
    for r in result.records:
        sums[r.rep] = sums.get(r.rep, 0) + r.latency_ns
    return list(sums.values())


def measure(name: str, reps: int, block: int, min_seconds: float = 0.0) -> dict[str, Any]:
    load0 = os.getloadavg()[0]
    model: Any = build_model(
        {"name": name, "builder": entry(name).builder, "params": PARAMS.get(name, {}), "seed": 1}
    )
    timed = isinstance(model, TimedPass)
    x = model.make_input()
    quiet = 0  # cpu_sample_interval_ns: the sampler is outside the timed window either way

    def walls(call: Callable[[], Any]) -> list[int]:
        out: list[int] = []
        for _ in range(block + 1):
            t0 = time.monotonic_ns()
            call()
            out.append(time.monotonic_ns() - t0)
        return out[1:]

    def profiled(one_call: bool) -> list[int]:
        return stage_sums(
            profile_model(model, repetitions=block, warmup=1, one_call=one_call, cpu_sample_interval_ns=quiet)
        )

    methods: dict[str, Callable[[], list[int]]] = {
        "forward": lambda: walls(lambda: model.forward(x)),
        "per_stage": lambda: profiled(False),
        "one_call": lambda: profiled(True),  # the profile's default: back to back without timed_pass
    }
    if timed:
        methods["call_wall"] = lambda: walls(lambda: model.timed_pass(x))
    for method in methods.values():  # traces, caches
        method()
    # a fast model gets more passes: each method's passes together last at least ``min_seconds``
    forward_s = statistics.median(methods["forward"]()) / 1e9
    reps = max(reps, block * math.ceil(min_seconds / max(forward_s * block, 1e-9)))
    times: dict[str, list[int]] = {k: [] for k in methods}
    rounds: list[list[float]] = []  # per round, the median of each method's block, in ``methods`` order
    order = list(methods)
    rng = random.Random(0)
    for _ in range(max(1, reps // block)):
        rng.shuffle(order)
        medians: dict[str, float] = {}
        for k in order:
            got = methods[k]()
            times[k] += got
            medians[k] = statistics.median(got)
        rounds.append([medians[k] for k in methods])
    f = statistics.median(times["forward"])
    s = statistics.median(times["per_stage"])
    nan = float("nan")
    o = statistics.median(times["one_call"])
    w = statistics.median(times["call_wall"]) if timed else nan
    paired = 100 * statistics.median(r[2] / r[0] - 1 for r in rounds)
    return {
        "stages": model.num_stages,
        "reps": reps,
        "forward_ms": f / 1e6,
        "per_stage_ms": s / 1e6,
        "one_call_ms": o / 1e6,
        "call_wall_ms": w / 1e6,
        "per_stage_pct": 100 * (s / f - 1),
        "one_call_pct": 100 * (o / f - 1),
        "call_wall_pct": 100 * (w / f - 1),
        "paired_pct": paired,
        "ratio": s / o,
        "load": (load0, os.getloadavg()[0]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=[*keras_models(), "gpt2"])
    ap.add_argument("--reps", type=int, default=200, help="passes per method")
    ap.add_argument("--block", type=int, default=10, help="passes per block (after one discarded)")
    ap.add_argument(
        "--min-seconds",
        type=float,
        default=3.0,
        help="more passes for a fast model, until each method's last this long (the GRU's 1 ms passes: 3000)",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = ap.parse_args()
    require_extras("bench_profiler_overhead.py", "keras", "llm")
    if args.smoke:
        args.models, args.reps, args.block, args.min_seconds = ["gru_vqp"], 2, 2, 0.0
    print(f"load average at start: {os.getloadavg()}; cores: {os.cpu_count()}")
    print(
        f"{'model':<15} {'stages':>6} {'reps':>5} {'forward ms':>10} {'per-stage ms':>12} {'one-call ms':>11} "
        f"{'call wall ms':>12} {'per-stage':>9} {'one-call':>9} {'call wall':>9} {'paired':>8} {'ratio':>6} "
        f"{'load 1m':>11}"
    )
    for name in args.models:
        r = measure(name, args.reps, args.block, args.min_seconds)
        print(
            f"{name:<15} {r['stages']:>6} {r['reps']:>5} {r['forward_ms']:>10.3f} {r['per_stage_ms']:>12.3f} "
            f"{r['one_call_ms']:>11.3f} {r['call_wall_ms']:>12.3f} {r['per_stage_pct']:>8.2f}% "
            f"{r['one_call_pct']:>8.2f}% {r['call_wall_pct']:>8.2f}% {r['paired_pct']:>7.2f}% {r['ratio']:>6.3f} "
            f"{r['load'][0]:>5.2f}-{r['load'][1]:<5.2f}",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
