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


@dataclass(frozen=True)
class Pressure:
    """Emulated memory pressure on one worker (the run config's ``memory_pressure``): its limit and the
    run's threshold, derived from the first placement so that its own KV growth crosses the threshold
    at generated token ``replace_at`` and passes the limit at ``full_at``."""

    worker: str
    limit_bytes: int
    threshold: float
    replace_at: int
    full_at: int

    def to_json(self) -> dict[str, int | float | str]:
        return {
            "worker": self.worker,
            "limit_bytes": self.limit_bytes,
            "threshold": self.threshold,
            "replace_at": self.replace_at,
            "full_at": self.full_at,
        }


def squeeze(
    cfg: ModelConfig,
    placement: Mapping[Unit, str],
    prompt_tokens: int,
    replace_at: int,
    full_at: int,
    measured: Mapping[str, int] | None = None,
) -> Pressure:
    """The limit and threshold that put the worker whose memory grows fastest under pressure.

    After generated token ``i`` the KV caches hold ``prompt_tokens + i`` positions, and the engine samples
    every worker then: that worker's bytes first pass ``threshold * limit`` at token ``replace_at`` (the
    re-placement) and ``limit`` at token ``full_at`` (a static placement's out-of-memory). The worker:
    the one holding most KV groups (its bytes grow fastest), the first by name on a tie. ``measured``:
    each worker's own count of its bytes with empty caches (what the engine's samples start from), else
    the placement's model of it (:func:`predict` at 0 tokens). ``ValueError``
    when ``0 < replace_at < full_at`` does not hold, or no worker holds an attention head (nothing grows).
    """
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    if not 0 < replace_at < full_at:
        raise ValueError(f"memory_pressure: needs 0 < replace_at < full_at, got {replace_at} and {full_at}")
    workers = sorted(set(placement.values()), key=_name_order)
    growth = {w: predict(cfg, placement, w, 1) - predict(cfg, placement, w, 0) for w in workers}
    worker = max(workers, key=lambda w: growth[w])  # max keeps the first of equals: name order
    if growth[worker] <= 0:
        raise ValueError("memory_pressure: no worker holds an attention head, so no worker's memory grows")
    base = predict(cfg, placement, worker, 0) if measured is None else measured[worker]
    limit = base + growth[worker] * (prompt_tokens + full_at - 1)
    # halfway between the bytes after token replace_at - 1 and after token replace_at: float-safe
    below = base + growth[worker] * (prompt_tokens + replace_at - 1)
    return Pressure(worker, limit, (below + growth[worker] / 2) / limit, replace_at, full_at)


def _name_order(name: str) -> tuple[int, str]:
    digits = name.lstrip("abcdefghijklmnopqrstuvwxyz")
    return (int(digits), name) if digits.isdigit() else (0, name)
