"""The partition-equivalence check for any :class:`~dit.device.adapter.StageModel`.

For every partition point ``p`` the model runs stages ``1..p``, encodes the activation, decodes
it (what crossing the network does) and runs ``p+1..N``; the output must equal the unpartitioned
output within ``tolerance`` (max abs difference). The reference is the adapter's one-piece
``forward`` when it has one (the framework's own model call), else the stages run back to back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dit.device.adapter import StageModel


class EquivalenceError(AssertionError):
    pass


@dataclass(frozen=True)
class PointResult:
    point: int
    max_abs_diff: float


def check_partition_equivalence(
    model: StageModel, x: Any = None, *, tolerance: float = 1e-4, points: list[int] | None = None
) -> list[PointResult]:
    """Check every partition point (or ``points``); raise :class:`EquivalenceError` on a mismatch."""
    n = model.num_stages
    x = model.make_input() if x is None else x
    outs = [x]
    for stage in range(1, n + 1):
        outs.append(model.run_stage(stage, outs[-1]))
    forward = getattr(model, "forward", None)
    reference = forward(x) if callable(forward) else outs[-1]
    results: list[PointResult] = []
    for p in points if points is not None else range(n + 1):
        y = model.decode(model.encode(outs[p]), p)
        for stage in range(p + 1, n + 1):
            y = model.run_stage(stage, y)
        if p == n:
            y = model.decode(model.encode(y), n)
        diff = model.max_abs_diff(reference, y)
        results.append(PointResult(p, diff))
        if not diff <= tolerance:
            raise EquivalenceError(
                f"{model.name}: partition point {p}: max abs difference {diff:g} exceeds {tolerance:g}"
            )
    return results
