"""Partition-vector search against the delay model (:mod:`dit.analysis.delay`).

An optimiser is any callable ``optimiser(problem: Problem) -> SearchResult`` registered under the
entry-point group ``dit.optimisers`` (see :mod:`dit.optimise.registry` and docs/optimisers.md). It receives
the model, the policy, the objective and the limits in a :class:`Problem` and returns the best vector it
found with the number of distinct vectors it evaluated. The caller (:func:`dit.optimise.api.optimise_run`)
times the search, recomputes the per-device terms of the returned vector and writes the result file.

This module must not import its submodules (they import it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from dit.analysis.delay import (
    ENERGY_OBJECTIVES,
    DelayBreakdown,
    DelayModel,
    DelayModelError,
    Objective,
    Policy,
    evaluate,
    local_ns,
    objective_of,
    require_power,
    transmission_ns,
)

DEFAULT_MAX_VECTORS: Final = 5_000_000


class OptimiseError(Exception):
    """The search cannot be run as asked (unknown algorithm, bad vector, misbehaving plug-in...)."""


class TooManyVectorsError(OptimiseError):
    """An exhaustive search would exceed the vector limit."""


@dataclass(frozen=True)
class Problem:
    """One search: the model, the policy, the objective and the limits.

    ``start`` overrides the start vector of the local searches (greedy, trend); ``max_vectors`` bounds
    the exhaustive search.
    """

    model: DelayModel
    policy: Policy
    objective: Objective
    max_vectors: int = DEFAULT_MAX_VECTORS
    start: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.objective in ENERGY_OBJECTIVES:
            try:
                require_power(self.model)
            except DelayModelError as exc:
                raise OptimiseError(f"objective {self.objective}: {exc}") from exc

    @property
    def bounds(self) -> tuple[int, ...]:
        """Each device's feasible maximum partition point (the range is 0..bound)."""
        return self.model.bounds

    def breakdown(self, vector: Sequence[int]) -> DelayBreakdown:
        return evaluate(self.model, vector, self.policy)

    def evaluate(self, vector: Sequence[int]) -> float:
        """The objective value of ``vector`` (ns for total_delay, ns^2 for variance, J, J*s for edp)."""
        return objective_of(self.model, self.breakdown(vector), self.objective)

    def neighbours(self, vector: Sequence[int]) -> list[tuple[tuple[int, int], tuple[int, ...]]]:
        """Every feasible one-step move ``((device, step), new_vector)``, step in (-1, +1).

        Ordered by device, then -1 before +1.
        """
        moves: list[tuple[tuple[int, int], tuple[int, ...]]] = []
        for i, (p, bound) in enumerate(zip(vector, self.bounds, strict=True)):
            for step in (-1, 1):
                q = p + step
                if 0 <= q <= bound:
                    moved = list(vector)
                    moved[i] = q
                    moves.append(((i, step), tuple(moved)))
        return moves

    def independent_start(self) -> tuple[int, ...]:
        """``start`` if given, else each device's best partition point if it were alone at the server.

        For device i that is the p in 0..bound_i minimising ``L_i(p) + T_i(p) + W(p)`` (under both
        policies a lone request's R is its workload W), smallest p on ties.
        """
        if self.start is not None:
            vec = self.model.check_vector(self.start)
            if not self.model.is_feasible(vec):
                raise OptimiseError(f"start vector {list(vec)} is outside the feasible ranges {self.bounds}")
            return vec
        model = self.model
        suffix = [float(sum(model.edge_stage_ns[p:])) for p in range(model.num_stages + 1)]
        start: list[int] = []
        for i, bound in enumerate(self.bounds):
            costs = [
                local_ns(model, i, p) + transmission_ns(model, i, p) + suffix[p] for p in range(bound + 1)
            ]
            start.append(min(range(bound + 1), key=lambda p: (costs[p], p)))
        return tuple(start)


@dataclass(frozen=True)
class SearchResult:
    """What an optimiser returns: its best vector, that vector's objective, distinct vectors evaluated."""

    vector: tuple[int, ...]
    objective_value: float
    vectors_evaluated: int


@dataclass
class CachedObjective:
    """Memoised objective of a problem; ``evaluated`` counts distinct vectors (what results report)."""

    problem: Problem
    cache: dict[tuple[int, ...], float] = field(default_factory=dict)

    def __call__(self, vector: Sequence[int]) -> float:
        key = tuple(vector)
        value = self.cache.get(key)
        if value is None:
            value = self.problem.evaluate(key)
            self.cache[key] = value
        return value

    @property
    def evaluated(self) -> int:
        return len(self.cache)


Optimiser = Callable[[Problem], SearchResult]

__all__ = [
    "DEFAULT_MAX_VECTORS",
    "CachedObjective",
    "OptimiseError",
    "Optimiser",
    "Problem",
    "SearchResult",
    "TooManyVectorsError",
]
