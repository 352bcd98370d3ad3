"""Exhaustive search: every feasible vector, evaluated block by block with numpy broadcasting."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Final

import numpy as np

from dit.analysis.delay import (
    ENERGY_OBJECTIVES,
    EnergyTables,
    FloatArray,
    IntArray,
    Objective,
    Tables,
    build_energy_tables,
    build_tables,
    combine_objective,
)
from dit.optimise import Problem, SearchResult, TooManyVectorsError

BLOCK: Final = 1 << 16
"""Target number of vectors per block (the trailing devices' sub-grid)."""


def vector_count(bounds: Sequence[int]) -> int:
    """Number of vectors with every p_i in 0..bounds[i]."""
    return math.prod(b + 1 for b in bounds)


def decode(indices: IntArray, bounds: Sequence[int]) -> IntArray:
    """Vectors at lexicographic positions ``indices`` (device 0 most significant), shape (M, n)."""
    rest = indices.astype(np.int64, copy=True)
    out = np.empty((rest.shape[0], len(bounds)), dtype=np.int64)
    for i in range(len(bounds) - 1, -1, -1):
        radix = bounds[i] + 1
        out[:, i] = rest % radix
        rest //= radix
    return out


def check_size(problem: Problem) -> int:
    """The number of vectors, or :class:`TooManyVectorsError` when it exceeds ``problem.max_vectors``."""
    bounds = problem.bounds
    total = vector_count(bounds)
    if total > problem.max_vectors:
        ranges = " x ".join(str(b + 1) for b in bounds)
        raise TooManyVectorsError(
            f"exhaustive search would evaluate {total:,} vectors ({ranges} partition points over "
            f"{len(bounds)} devices), more than the limit of {problem.max_vectors:,}; raise the limit "
            f"explicitly (max_vectors, CLI --max-vectors) or use greedy or trend"
        )
    return total


def split_point(bounds: Sequence[int], block: int = BLOCK) -> int:
    """k such that devices k..n-1 span a sub-grid of at most ``block`` vectors (at least one device)."""
    k, size = len(bounds), 1
    while k > 0 and (k == len(bounds) or size * (bounds[k - 1] + 1) <= block):
        size *= bounds[k - 1] + 1
        k -= 1
    return k


def block_delays(tables: Tables, bounds: Sequence[int], prefix: Sequence[int]) -> list[FloatArray]:
    """D_i over the sub-grid of devices k..n-1 (k = len(prefix)) with devices 0..k-1 fixed at ``prefix``.

    Each returned array has shape (bounds[k]+1, ..., bounds[n-1]+1), C order = lexicographic order. The
    terms are those of :func:`dit.analysis.delay.batch_delays`, added by broadcasting instead of gathered per vector.
    """
    n, k = len(bounds), len(prefix)
    shape = tuple(b + 1 for b in bounds[k:])
    ndim = len(shape)

    def along(axes: Sequence[int], values: FloatArray) -> FloatArray:
        """``values`` (whose dimensions are ``axes`` of the block, in that order) shaped to broadcast."""
        if len(axes) == 2 and axes[0] > axes[1]:
            axes, values = [axes[1], axes[0]], values.T
        dims = [1] * ndim
        for axis, size in zip(axes, values.shape, strict=True):
            dims[axis] = size
        return values.reshape(dims)

    def pair(i: int, j: int) -> FloatArray:
        return tables.f if j < i else tables.g

    delays: list[FloatArray] = []
    for i in range(n):
        if i < k:
            a = prefix[i]
            scalar = tables.lt[i, a] + tables.w[a]
            scalar += sum(float(pair(i, j)[a, prefix[j]]) for j in range(k) if j != i)
            acc = np.full(shape, scalar)
            for j in range(k, n):
                acc += along([j - k], pair(i, j)[a, : bounds[j] + 1])
        else:
            r = bounds[i] + 1
            own = tables.lt[i, :r] + tables.w[:r]
            for j in range(k):
                own = own + pair(i, j)[:r, prefix[j]]
            acc = np.broadcast_to(along([i - k], own), shape).copy()
            for j in range(k, n):
                if j != i:
                    acc += along([i - k, j - k], pair(i, j)[:r, : bounds[j] + 1])
        delays.append(acc)
    return delays


def block_energies(
    energy: EnergyTables, bounds: Sequence[int], prefix: Sequence[int], delays: list[FloatArray]
) -> list[FloatArray]:
    """E_i over the same sub-grid as :func:`block_delays`: ``idle_i * D_i + extra_i[p_i]`` (J)."""
    k, ndim = len(prefix), len(bounds) - len(prefix)
    out: list[FloatArray] = []
    for i, d in enumerate(delays):
        if i < k:
            out.append(energy.idle[i] * d + energy.extra[i, prefix[i]])
        else:
            dims = [1] * ndim
            dims[i - k] = bounds[i] + 1
            out.append(energy.idle[i] * d + energy.extra[i, : bounds[i] + 1].reshape(dims))
    return out


def block_objective(
    delays: list[FloatArray], objective: Objective, energies: list[FloatArray] | None = None
) -> FloatArray:
    """The objective over a block from its per-device delay (and, for energy/edp, energy) arrays."""
    return combine_objective(delays, energies, objective)


def blocks(problem: Problem, tables: Tables) -> Iterator[tuple[tuple[int, ...], FloatArray]]:
    """``(prefix, objective values over the sub-grid)`` for every prefix, in lexicographic order."""
    bounds = problem.bounds
    k = split_point(bounds)
    energy = build_energy_tables(problem.model) if problem.objective in ENERGY_OBJECTIVES else None
    for prefix in itertools.product(*(range(b + 1) for b in bounds[:k])):
        delays = block_delays(tables, bounds, prefix)
        energies = None if energy is None else block_energies(energy, bounds, prefix, delays)
        yield prefix, block_objective(delays, problem.objective, energies)


def exhaustive(problem: Problem) -> SearchResult:
    """Evaluate every vector with p_i in 0..max_partition_point_i and return the best.

    The ground truth for the heuristics' optimality gap. Refuses more than ``problem.max_vectors`` vectors
    (default 5,000,000) with :class:`TooManyVectorsError`. The leading devices are fixed block by block
    (lexicographic order, device 0 most significant) and the trailing devices' sub-grid of up to ~65,000
    vectors is evaluated at once with the tabulated model (:func:`dit.analysis.delay.build_tables`) by numpy
    broadcasting; the first vector in lexicographic order with the lowest objective wins. The reported
    value is recomputed with the reference :func:`dit.analysis.delay.evaluate`.
    """
    total = check_size(problem)
    tables = build_tables(problem.model, problem.policy)
    best_value = math.inf
    best_vector: tuple[int, ...] | None = None
    for prefix, values in blocks(problem, tables):
        flat = int(np.argmin(values))
        if values.flat[flat] < best_value:
            best_value = float(values.flat[flat])
            tail = np.unravel_index(flat, values.shape)
            best_vector = (*prefix, *(int(t) for t in tail))
    assert best_vector is not None
    return SearchResult(best_vector, problem.evaluate(best_vector), total)
