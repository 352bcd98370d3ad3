"""Per-worker memory over the generated tokens: what was measured, what the placement predicts.

The engine feeds :class:`MemoryTracker` one sample per token and worker (``record``); when a worker's
latest sample passes ``threshold`` (default 0.85, the article's "85 percent of memory") of its limit,
``needs_replacement`` / ``over_threshold`` say so and the controller calls
:func:`headsplit.placement.replace`. The kept samples are the results file's ``memory`` list.
:func:`predict` is the placement's memory model (:func:`headsplit.placement.worker_bytes`), and
:func:`crossing_token` says at which context length a placement will cross the threshold.
Standard library only, like placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from headsplit.config import ModelConfig
from headsplit.placement import DEFAULT_THRESHOLD, worker_bytes
from headsplit.units import Unit


@dataclass(frozen=True)
class MemorySample:
    token: int  # token index (0 = the prompt's prefill)
    worker: str
    bytes: int

    def to_json(self) -> dict[str, int | str]:
        return {"token": self.token, "worker": self.worker, "bytes": self.bytes}


def _check_threshold(threshold: float) -> None:
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")


class MemoryTracker:
    """Memory samples per token and worker against each worker's limit (bytes)."""

    def __init__(self, limits: Mapping[str, int], threshold: float = DEFAULT_THRESHOLD) -> None:
        _check_threshold(threshold)
        if not limits:
            raise ValueError("limits: at least one worker is needed")
        for worker, limit in limits.items():
            if limit <= 0:
                # 0 means "no cgroup limit" in headsplit.json: the caller resolves it to the node's RAM.
                raise ValueError(f"limits[{worker!r}] must be > 0 bytes, got {limit}")
        self.limits = dict(limits)
        self.threshold = threshold
        self._samples: list[MemorySample] = []
        self._latest: dict[str, int] = {}
        self._peak: dict[str, int] = {}

    def record(self, token: int, worker: str, bytes_used: int) -> None:
        """Add one sample; the latest sample of a worker is what the threshold checks use."""
        if worker not in self.limits:
            raise ValueError(f"worker {worker!r} has no limit: one of {', '.join(sorted(self.limits))}")
        if token < 0:
            raise ValueError(f"token must be >= 0, got {token}")
        if bytes_used < 0:
            raise ValueError(f"bytes for {worker} at token {token} must be >= 0, got {bytes_used}")
        self._samples.append(MemorySample(token, worker, bytes_used))
        self._latest[worker] = bytes_used
        self._peak[worker] = max(bytes_used, self._peak.get(worker, 0))

    def latest(self, worker: str) -> int | None:
        return self._latest.get(worker)

    def peak(self, worker: str) -> int | None:
        return self._peak.get(worker)

    def needs_replacement(self, worker: str) -> bool:
        """True when ``worker``'s latest sample is above ``threshold`` of its limit."""
        if worker not in self.limits:
            raise ValueError(f"worker {worker!r} has no limit: one of {', '.join(sorted(self.limits))}")
        latest = self._latest.get(worker)
        return latest is not None and latest > self.threshold * self.limits[worker]

    def over_threshold(self) -> list[str]:
        """The workers that need re-placement now, sorted by name."""
        return sorted(w for w in self.limits if self.needs_replacement(w))

    @property
    def samples(self) -> list[MemorySample]:
        return list(self._samples)

    def to_json(self) -> list[dict[str, int | str]]:
        """The results file's ``memory`` list, in recording order."""
        return [s.to_json() for s in self._samples]


def predict(cfg: ModelConfig, placement: Mapping[Unit, str], worker: str, tokens: int) -> int:
    """Bytes the placement model expects ``worker`` to hold at ``tokens`` tokens of context."""
    return worker_bytes(cfg, placement, worker, tokens)


def crossing_token(
    cfg: ModelConfig,
    placement: Mapping[Unit, str],
    worker: str,
    limit_bytes: int,
    threshold: float = DEFAULT_THRESHOLD,
) -> int | None:
    """The smallest context length at which ``predict`` exceeds ``threshold * limit_bytes`` (0 if it
    already does at 0 tokens), or None if it never does (a worker without heads has no growing cache)."""
    _check_threshold(threshold)
    budget = threshold * limit_bytes
    fixed = predict(cfg, placement, worker, 0)
    if fixed > budget:
        return 0
    growth = predict(cfg, placement, worker, 1) - fixed
    if growth == 0:
        return None
    tokens = int((budget - fixed) // growth) + 1
    while tokens > 0 and fixed + (tokens - 1) * growth > budget:  # float rounding guard
        tokens -= 1
    return tokens
