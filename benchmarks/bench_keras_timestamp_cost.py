"""What timing the stages inside one call costs a Keras model, taken apart.

    .venv/bin/python benchmarks/bench_keras_timestamp_cost.py [--models gru_vqp alexnet] [--rounds 300]

Four concrete functions of the same model run on the same input tensor, in passes back to back
(``--block`` after one discarded), the blocks of all four in a seeded shuffled order per round:

* ``full``: the whole Keras model in one ``tf.function`` (the adapter's ``forward``);
* ``composed``: the model's stage sub-models called one after the other in one ``tf.function``,
  nothing between them (:meth:`~dit.models.keras_staged.KerasStagedModel.untimed_function`);
* ``timed``: the profiler's function, the same stages with a ``tf.timestamp()`` and an ordering
  ``identity`` at each of the ``N - 1`` boundaries
  (:meth:`~dit.models.keras_staged.KerasStagedModel.timed_function`);
* ``timed_pass``: the adapter's whole ``timed_pass`` on the model's numpy input (argument conversion
  and the wall clock reads included), as the profile calls it, against ``forward`` on the same input.

Printed per model: the median of each (µs), ``composed`` and ``timed`` against ``full``, the timing
ops' own cost (``timed`` against ``composed``, in µs and %), ``timed_pass`` against ``forward`` on
the numpy input, and the 1-minute load average before and after. Needs TensorFlow (``dit[keras]``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from dit.device.common import build_model
from dit.extras import require_extras
from dit.models.catalogue import entry
from dit.models.keras_staged import KerasStagedModel


def measure(name: str, rounds: int, block: int) -> dict[str, Any]:
    load0 = os.getloadavg()[0]
    model = build_model({"name": name, "builder": entry(name).builder, "params": {}, "seed": 1})
    if not isinstance(model, KerasStagedModel):
        raise SystemExit(f"{name} is not a Keras model")
    x = model.make_input()
    xt = model._tensor(x, 0)
    full, composed, timed = model._full, model.untimed_function(), model.timed_function()
    calls: dict[str, Callable[[], Any]] = {
        "full": lambda: full(xt),
        "composed": lambda: composed(xt),
        "timed": lambda: timed(xt),
        "forward_np": lambda: model.forward(x),
        "timed_pass_np": lambda: model.timed_pass(x),
    }
    times: dict[str, list[int]] = {k: [] for k in calls}
    order = list(calls)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            call = calls[k]
            call()
            for _ in range(block):
                t0 = time.monotonic_ns()
                call()
                times[k].append(time.monotonic_ns() - t0)
    med = {k: statistics.median(v) / 1e3 for k, v in times.items()}
    return {"stages": model.num_stages, **med, "load": (load0, os.getloadavg()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gru_vqp", "alexnet"])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = ap.parse_args()
    require_extras("bench_keras_timestamp_cost.py", "keras")
    if args.smoke:
        args.models, args.rounds, args.block = ["gru_vqp"], 2, 2
    print(f"load average at start: {os.getloadavg()}; cores: {os.cpu_count()}")
    head = (
        "model",
        "stages",
        "full us",
        "composed",
        "timed",
        "ops us",
        "ops %",
        "fwd np us",
        "pass np",
        "load",
    )
    print(f"{head[0]:14s}" + "".join(f"{h:>11s}" for h in head[1:]))
    for name in args.models:
        r = measure(name, args.rounds, args.block)
        f, c, t = r["full"], r["composed"], r["timed"]
        print(
            f"{name:14s}{r['stages']:>11d}{f:>11.1f}{100 * (c / f - 1):>+10.2f}%{100 * (t / f - 1):>+10.2f}%"
            f"{t - c:>+11.1f}{100 * (t / c - 1):>+10.2f}%{r['forward_np']:>11.1f}"
            f"{100 * (r['timed_pass_np'] / r['forward_np'] - 1):>+10.2f}%"
            f"   {r['load'][0]:.2f}-{r['load'][1]:.2f}",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
