"""Greedy local search (steepest descent over one-step moves)."""

from __future__ import annotations

from dit.optimise import CachedObjective, Problem, SearchResult


def greedy(problem: Problem) -> SearchResult:
    """Steepest descent over one-step moves, from the independent start vector.

    Start: :meth:`Problem.independent_start` (``problem.start`` if given, else each device's best partition
    point as if it were alone at the edge server). At every step, try every move of one device by one
    partition point (p - 1 or p + 1, kept within 0..max_partition_point), evaluate the whole vector for each,
    and take the move with the lowest objective if it is strictly lower than the current one (ties between
    moves: device order, then -1 before +1). Stop at the first vector no move improves, a local optimum.
    ``vectors_evaluated`` counts distinct vectors (the start included).
    """
    objective = CachedObjective(problem)
    current = problem.independent_start()
    value = objective(current)
    while True:
        best: tuple[float, tuple[int, ...]] | None = None
        for _move, candidate in problem.neighbours(current):
            candidate_value = objective(candidate)
            if candidate_value < value and (best is None or candidate_value < best[0]):
                best = (candidate_value, candidate)
        if best is None:
            return SearchResult(current, value, objective.evaluated)
        value, current = best
