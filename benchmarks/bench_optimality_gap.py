"""Optimality gap of greedy and trend against exhaustive search over random instances, and against the
exact MILP (SJF, total_delay) at 5, 10 and 25 devices, where exhaustive cannot run.

    .venv/bin/python benchmarks/bench_optimality_gap.py [--instances 1000] [--seed 2024] [--max-grid 250000]

Each instance (:func:`dit.analysis.delay.synthetic_model`) draws 2-6 devices and 5-20 stages, and per device a
feasible maximum partition point uniformly in 1..N; while the grid holds more than ``--max-grid`` vectors the
largest range is shrunk by one (this keeps 1000 exhaustive searches brief and biases large instances
towards smaller ranges). Every instance is solved under both policies and both objectives. The gap of a
heuristic is (heuristic - optimum) / optimum in percent; instances with an optimum of exactly 0 are
counted apart. The delay objectives only (total_delay, variance): a synthetic instance carries no power
model, which the energy objectives need (bench_exhaustive.py draws one). Because a variance optimum can be
close to 0, its relative gaps are also shown as an absolute gap of the standard deviation of the delays,
sqrt(heuristic) - sqrt(optimum), in ms (for total_delay the absolute gap is in ms of total delay).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict

import numpy as np

from dit.analysis.delay import DELAY_OBJECTIVES, POLICIES, synthetic_model
from dit.optimise import Problem
from dit.optimise.exact import exact
from dit.optimise.exhaustive import exhaustive, vector_count
from dit.optimise.greedy import greedy
from dit.optimise.trend import trend


def draw_bounds(rng: np.random.Generator, devices: int, stages: int, max_grid: int) -> list[int]:
    bounds = [int(b) for b in rng.integers(1, stages + 1, size=devices)]
    while vector_count(bounds) > max_grid:
        bounds[bounds.index(max(bounds))] -= 1
    return bounds


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--max-grid", type=int, default=250_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.instances, args.max_grid = 3, 2_000
    rng = np.random.default_rng(args.seed)
    gaps: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    absolute: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    evaluations: dict[str, list[int]] = defaultdict(list)
    zero_optimum = checked = exact_worse = 0
    start = time.perf_counter()
    for _ in range(args.instances):
        devices, stages = int(rng.integers(2, 7)), int(rng.integers(5, 21))
        model = synthetic_model(rng, devices, stages, draw_bounds(rng, devices, stages, args.max_grid))
        for policy in POLICIES:
            for objective in DELAY_OBJECTIVES:
                problem = Problem(model, policy, objective)
                best = exhaustive(problem)
                evaluations["exhaustive"].append(best.vectors_evaluated)
                if policy == "SJF" and objective == "total_delay":
                    checked += 1
                    if exact(problem).objective_value > best.objective_value * (1 + 1e-9):
                        exact_worse += 1
                for name, search in (("greedy", greedy), ("trend", trend)):
                    result = search(problem)
                    evaluations[name].append(result.vectors_evaluated)
                    if best.objective_value == 0:
                        zero_optimum += 1
                        continue
                    gap = (result.objective_value - best.objective_value) / best.objective_value * 100
                    gaps[(name, policy, objective)].append(max(gap, 0.0))
                    if objective == "variance":
                        diff = math.sqrt(result.objective_value) - math.sqrt(best.objective_value)
                    else:
                        diff = result.objective_value - best.objective_value
                    absolute[(name, policy, objective)].append(max(diff, 0.0) / 1e6)
    wall = time.perf_counter() - start
    print(
        f"{args.instances} instances x {len(POLICIES)} policies x {len(DELAY_OBJECTIVES)} objectives "
        f"(seed {args.seed}, grids <= {args.max_grid:,} vectors) in {wall:.1f} s"
    )
    print(
        f"{'heuristic':<9} {'policy':<6} {'objective':<12} {'median %':>9} {'p90 %':>9} {'max %':>12} "
        f"{'optimal':>8}  {'abs. gap median / max (ms)':>26}"
    )
    for name in ("greedy", "trend"):
        for policy in POLICIES:
            for objective in DELAY_OBJECTIVES:
                values = gaps[(name, policy, objective)]
                optimal = sum(v < 1e-9 for v in values) / len(values) * 100
                diffs = absolute[(name, policy, objective)]
                unit = "sigma" if objective == "variance" else "total"
                print(
                    f"{name:<9} {policy:<6} {objective:<12} {statistics.median(values):9.3f} "
                    f"{percentile(values, 90):9.3f} {max(values):12.3f} {optimal:7.1f}%  "
                    f"{unit:>6} {statistics.median(diffs):8.3f} / {max(diffs):8.3f}"
                )
    for name in ("exhaustive", "greedy", "trend"):
        print(f"vectors evaluated by {name:<10}: median {statistics.median(evaluations[name]):,.0f}")
    if zero_optimum:
        print(f"{zero_optimum} heuristic runs on instances with an optimum of 0 were left out of the gaps")
    print(f"exact (SJF, total_delay) above exhaustive's optimum on {exact_worse} of {checked} instances")
    beyond_exhaustive(rng, (5,) if args.smoke else (5, 10, 25), 1 if args.smoke else 20)


def beyond_exhaustive(rng: np.random.Generator, sizes: tuple[int, ...], instances: int) -> None:
    """SJF total_delay where exhaustive cannot run: exact's solve time and greedy's and trend's gaps to it."""
    print(f"SJF total_delay against exact, 12 stages, {instances} instance(s) per size:")
    for devices in sizes:
        times: list[float] = []
        found: dict[str, list[float]] = defaultdict(list)
        for _ in range(instances):
            problem = Problem(synthetic_model(rng, devices, 12), "SJF", "total_delay")
            t0 = time.perf_counter()
            best = exact(problem).objective_value
            times.append(time.perf_counter() - t0)
            for name, search in (("greedy", greedy), ("trend", trend)):
                found[name].append(max((search(problem).objective_value - best) / best * 100, 0.0))
        cells = "  ".join(
            f"{n} median {statistics.median(v):.3f} % max {max(v):.3f} %" for n, v in found.items()
        )
        print(f"  {devices:>2} devices: exact {statistics.median(times):.2f} s median  {cells}")


if __name__ == "__main__":
    main()
