"""Exhaustive search over 5,000,000 vectors: wall time, and the speed-up over per-vector Python.

Every objective: total_delay, variance, energy and edp (the instance carries synthetic power models).

    .venv/bin/python benchmarks/bench_exhaustive.py [--sample 20000] [--seed 1]

The instance (:func:`dit.analysis.delay.synthetic_model`) has 6 devices and 24 stages with feasible ranges
10 x 10 x 10 x 10 x 20 x 25 = 5,000,000 vectors (exactly the default limit). The baseline is the
straightforward per-vector Python evaluation, the reference :func:`dit.analysis.delay.evaluate` plus the objective,
timed on a random sample and extrapolated to all vectors. The exhaustive search's values at the sampled
vectors are checked against the reference, and its optimum against a second, independent vectorised pass
(:func:`dit.analysis.delay.batch_delays`, one gather per vector and device pair).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dit.analysis.delay import (
    ENERGY_OBJECTIVES,
    OBJECTIVES,
    POLICIES,
    DelayModel,
    DevicePower,
    batch_delays,
    batch_objective,
    build_energy_tables,
    build_tables,
    evaluate,
    objective_of,
    synthetic_model,
)
from dit.optimise import Problem
from dit.optimise.exhaustive import blocks, decode, exhaustive, vector_count

BOUNDS = (9, 9, 9, 9, 19, 24)
STAGES = 24
SMOKE_BOUNDS = (3, 3, 4)  # 80 vectors: every policy and objective in well under a second
SMOKE_STAGES = 4


def gather_pass(problem: Problem, chunk: int = 1 << 16) -> tuple[tuple[int, ...], float, float]:
    """Best vector, its value and the wall time of the batch_delays formulation."""
    start = time.perf_counter()
    tables = build_tables(problem.model, problem.policy)
    total = vector_count(problem.bounds)
    best_value, best_index = np.inf, -1
    for first in range(0, total, chunk):
        vectors = decode(np.arange(first, min(total, first + chunk), dtype=np.int64), problem.bounds)
        energy = build_energy_tables(problem.model) if problem.objective in ENERGY_OBJECTIVES else None
        values = batch_objective(batch_delays(tables, vectors), problem.objective, energy, vectors)
        k = int(np.argmin(values))
        if values[k] < best_value:
            best_value, best_index = float(values[k]), first + k
    vector = tuple(int(p) for p in decode(np.array([best_index]), problem.bounds)[0])
    return vector, best_value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sample", type=int, default=20_000, help="vectors in the per-vector Python sample")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    bounds, stages = (SMOKE_BOUNDS, SMOKE_STAGES) if args.smoke else (BOUNDS, STAGES)
    if args.smoke:
        args.sample = 50
    rng = np.random.default_rng(args.seed)
    base = synthetic_model(rng, len(bounds), stages, bounds)
    # Raspberry-Pi-like power models (W): idle 2.7-3.0, computing +2-4, transmitting +0.5-1.5
    idle = rng.uniform(2.7, 3.0, len(bounds))
    powers = tuple(
        DevicePower(float(i), float(i + c), float(i + x))
        for i, c, x in zip(
            idle, rng.uniform(2, 4, len(bounds)), rng.uniform(0.5, 1.5, len(bounds)), strict=True
        )
    )
    model = DelayModel(**{**base.__dict__, "power": powers})
    total = vector_count(bounds)
    ranges = [b + 1 for b in bounds]
    print(f"instance: {len(bounds)} devices, {stages} stages, ranges {ranges} = {total:,} vectors")
    sample_idx = rng.integers(0, total, size=args.sample)
    sample = decode(sample_idx, bounds).tolist()
    for policy in POLICIES:
        for objective in OBJECTIVES:
            problem = Problem(model, policy, objective)
            start = time.perf_counter()
            result = exhaustive(problem)
            wall = time.perf_counter() - start

            start = time.perf_counter()
            reference = np.array([objective_of(model, evaluate(model, v, policy), objective) for v in sample])
            per_vector = (time.perf_counter() - start) / args.sample
            python_total = per_vector * total

            every = np.concatenate([v.ravel() for _, v in blocks(problem, build_tables(model, policy))])
            worst = float(np.max(np.abs(every[sample_idx] - reference) / np.maximum(np.abs(reference), 1.0)))
            gather_vector, _, gather_wall = gather_pass(problem)
            agree = "same optimum" if gather_vector == result.vector else f"DIFFERENT optimum {gather_vector}"
            print(
                f"{policy:>3} {objective:<11}  exhaustive {wall:5.2f} s "
                f"({result.vectors_evaluated / wall / 1e6:5.1f} M vectors/s)  "
                f"per-vector Python {per_vector * 1e6:5.1f} us/vector -> {python_total:6.1f} s for all, "
                f"speed-up {python_total / wall:6.0f}x  |  "
                f"max rel. diff vs reference on sample {worst:.1e}  |  "
                f"gather formulation {gather_wall:4.2f} s, {agree}  |  best {list(result.vector)}"
            )


if __name__ == "__main__":
    main()
