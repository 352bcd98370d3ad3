"""Per-worker memory over the generated tokens: what was measured, what the placement predicts.

The engine feeds :class:`MemoryTracker` one sample per token and worker (``record``); when a worker's
latest sample passes ``threshold`` (default 0.85, the article's "85 percent of memory") of its limit,
``needs_replacement`` / ``over_threshold`` say so and the controller calls
:func:`headsplit.placement.replace`. The kept samples are the results file's ``memory`` list.
:func:`predict` is the placement's memory model (:func:`headsplit.placement.worker_bytes`), and
:func:`crossing_token` says at which context length a placement will cross the threshold.
:func:`needs` is what each worker process needs at its peak (set-up included), which the plug-in and the
controller hold against each node's limit; :class:`ExitNote` and :func:`loss_message` say how a worker
that was lost ended (its memory cgroup's counters: :func:`read_cgroup`).
Standard library only, like placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from headsplit.config import ModelConfig
from headsplit.placement import DEFAULT_THRESHOLD, bytes_by_worker, worker_bytes
from headsplit.units import DTYPE_BYTES, Unit


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


# ------------------------------------------------------------------- a worker's peak, and its death

# A worker process before it builds anything: the interpreter, torch (2.13, CPU wheel) and torch RPC up.
# Measured here (x86-64, docs/headsplit.md "Set-up memory"): 248 MB RSS with torch imported, 264-266 MB
# above its units at a worker's peak with RPC up; rounded up, since a board's aarch64 wheel and its
# allocator differ.
RUNTIME_BASE_BYTES = 320 * 1_000_000
# A unit is built one tensor at a time: the most a build holds beyond what it keeps is one tensor's
# staging (a checkpoint's bf16 bytes before float32, or a transposed GPT-2 tensor before its copy), plus
# the allocator's slack (measured: 3 MB over the kept bytes with seeded weights).
SETUP_SLACK_BYTES = 16 << 20


def largest_tensor_bytes(cfg: ModelConfig) -> int:
    """The largest single tensor any unit holds (an FFN matrix, or a projection): float32 bytes."""
    return DTYPE_BYTES * cfg.hidden * max(cfg.hidden, cfg.ffn_hidden)


def setup_margin_bytes(cfg: ModelConfig) -> int:
    """What building a worker's units may hold beyond the units themselves, at its worst moment."""
    return largest_tensor_bytes(cfg) + SETUP_SLACK_BYTES


@dataclass(frozen=True)
class Need:
    """The memory one worker needs at its peak: its process, its units' weights (with KV copies), the
    set-up's margin or its KV caches at the run's context, whichever is larger."""

    worker: str
    units_bytes: int  # weights and KV-weight copies, caches empty (what set-up builds)
    cache_bytes: int  # KV caches at the context the run reaches
    margin_bytes: int  # set-up's staging beyond the kept bytes
    base_bytes: int = RUNTIME_BASE_BYTES

    @property
    def peak_bytes(self) -> int:
        return self.base_bytes + self.units_bytes + max(self.margin_bytes, self.cache_bytes)

    def describe(self) -> str:
        """``1373 MB at its peak (units 1060 MB + set-up margin 63 MB + process 320 MB)``."""
        larger = (
            f"KV caches {_mb(self.cache_bytes)}"
            if self.cache_bytes > self.margin_bytes
            else f"set-up margin {_mb(self.margin_bytes)}"
        )
        return (
            f"{_mb(self.peak_bytes)} at its peak (units {_mb(self.units_bytes)} + {larger} + "
            f"process {_mb(self.base_bytes)})"
        )


def needs(cfg: ModelConfig, placement: Mapping[Unit, str], tokens: int) -> dict[str, Need]:
    """Every worker's :class:`Need` for ``placement`` at ``tokens`` tokens of context (name order)."""
    empty = bytes_by_worker(cfg, placement, 0)
    full = bytes_by_worker(cfg, placement, tokens)
    margin = setup_margin_bytes(cfg)
    return {w: Need(w, empty[w], full[w] - empty[w], margin) for w in sorted(empty, key=_name_order)}


def over_limit(needs_by_worker: Mapping[str, Need], limits: Mapping[str, int]) -> list[str]:
    """One sentence per worker whose peak passes its limit (limits of 0 or absent: none), naming both."""
    return [
        f"{w} needs {n.describe()}, its memory limit is {_mb(limits[w])}"
        for w, n in needs_by_worker.items()
        if limits.get(w, 0) > 0 and n.peak_bytes > limits[w]
    ]


def status_bytes(field: str, status: Path = Path("/proc/self/status")) -> int:
    """A size line of this process's /proc status (``VmRSS``, ``VmHWM``: the peak RSS) in bytes, 0 where
    /proc does not say."""
    try:
        for line in status.read_text(encoding="utf-8").splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _mb(n_bytes: float) -> str:
    return f"{n_bytes / 1e6:.0f} MB"


@dataclass(frozen=True)
class CgroupMemory:
    """A memory cgroup's counters (cgroup v1 or v2), each None where the kernel does not keep it."""

    path: str
    limit_bytes: int | None
    peak_bytes: int | None  # v1 memory.max_usage_in_bytes, v2 memory.peak
    oom_kills: int | None  # v1 memory.oom_control oom_kill, v2 memory.events oom_kill
    failcnt: int | None = None  # v1: how often the limit was hit

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CgroupMemory:
        def count(key: str) -> int | None:
            value = doc.get(key)
            return None if value is None else int(value)

        return cls(
            str(doc["path"]), count("limit_bytes"), count("peak_bytes"), count("oom_kills"), count("failcnt")
        )

    def describe(self) -> str:
        parts = [f"memory cgroup {self.path}"]
        if self.limit_bytes is not None:
            parts.append(f"limit {_mb(self.limit_bytes)}")
        if self.oom_kills is not None:
            parts.append(f"oom_kill {self.oom_kills}")
        if self.failcnt is not None:
            parts.append(f"failcnt {self.failcnt}")
        if self.peak_bytes is not None:
            parts.append(f"peak {_mb(self.peak_bytes)}")
        return ", ".join(parts)


# v1 reports "no limit" as the largest page-aligned signed 64-bit value; v2 writes "max"
_NO_LIMIT = 1 << 62


def _read_int(path: Path) -> int | None:
    try:
        raw = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


def _read_keyed(path: Path, key: str) -> int | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def own_memory_cgroup(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> Path | None:
    """The memory cgroup directory of this process (v1's ``memory`` hierarchy, else v2's unified one),
    or None when there is none to read."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    unified: str | None = None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            found = root / "memory" / rel.lstrip("/")
            return found if found.is_dir() else None
        if controllers == "":
            unified = rel
    if unified is not None and (root / "cgroup.controllers").is_file():
        found = root / unified.lstrip("/")
        return found if found.is_dir() else None
    return None


def read_cgroup(path: Path) -> CgroupMemory:
    """The counters of the memory cgroup at ``path`` (v2 when it has ``memory.events``, else v1)."""
    if (path / "memory.events").exists():
        return CgroupMemory(
            str(path),
            _read_int(path / "memory.max"),  # "max": no limit
            _read_int(path / "memory.peak"),
            _read_keyed(path / "memory.events", "oom_kill"),
        )
    limit = _read_int(path / "memory.limit_in_bytes")
    return CgroupMemory(
        str(path),
        None if limit is None or limit >= _NO_LIMIT else limit,
        _read_int(path / "memory.max_usage_in_bytes"),
        _read_keyed(path / "memory.oom_control", "oom_kill"),
        _read_int(path / "memory.failcnt"),
    )


def effective_limit_bytes(path: Path) -> int | None:
    """The smallest limit from the memory cgroup ``path`` up its hierarchy (a parent's limit binds its
    children too); None when none has one."""
    limits: list[int] = []
    here = path
    while (here / "memory.limit_in_bytes").exists() or (here / "memory.max").exists():
        limit = read_cgroup(here).limit_bytes
        if limit is not None:
            limits.append(limit)
        if here.parent == here:
            break
        here = here.parent
    return min(limits) if limits else None


@dataclass(frozen=True)
class ExitNote:
    """How a worker process ended, written by its supervisor (``headsplit.worker``) beside its results."""

    worker: str
    returncode: int  # negative: killed by that signal (Popen's convention)
    cgroup: CgroupMemory | None

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "returncode": self.returncode,
            "cgroup": None if self.cgroup is None else self.cgroup.to_json(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ExitNote:
        cg = doc.get("cgroup")
        return cls(
            str(doc["worker"]), int(doc["returncode"]), None if cg is None else CgroupMemory.from_json(cg)
        )

    def oom_killed(self) -> bool:
        return self.signal == 9 and bool(self.cgroup and self.cgroup.oom_kills)


def loss_message(worker: str, call: str, note: ExitNote | None, need: Need | None, limit_bytes: int) -> str:
    """Why ``worker`` stopped answering during ``call``, as far as this machine can tell.

    ``note``: its supervisor's record (None: not readable here, e.g. the worker's node is another
    machine); ``need``: what the placement asked of it; ``limit_bytes``: its memory limit (0: unknown)."""
    wanted = "" if need is None else f"; it needs {need.describe()}"
    limit = f"{_mb(limit_bytes)}" if limit_bytes > 0 else "unknown"
    if note is None:
        return (
            f"{worker} stopped answering during {call} and no record of its exit is readable here "
            f"(its node's logs/ and results/{worker}.exit.json say how it ended){wanted}, "
            f"its memory limit is {limit}"
        )
    if note.oom_killed():
        assert note.cgroup is not None
        return (
            f"{worker} was killed by the kernel's memory limit (signal 9; {note.cgroup.describe()}) during "
            f"{call}{wanted}: raise its node's memory limit or spread the model over more workers"
        )
    if note.signal is not None:
        cg = "" if note.cgroup is None else f"; {note.cgroup.describe()}"
        return f"{worker} was killed by signal {note.signal} during {call}{cg}{wanted}, its memory limit is {limit}"
    return f"{worker} exited with status {note.returncode} during {call} (its node's logs/ say why){wanted}"
