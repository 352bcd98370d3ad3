"""The load generator: the ``load`` device command (stdlib only).

Modes (the scenario's ``load.<device>.mode``):

- ``light`` / ``moderate`` / ``heavy`` — a *fixed* regime. The CPU and memory targets are drawn **once**,
  uniformly within the regime's ranges (:data:`REGIMES`, the thesis's figures), CPU first, then memory.
- ``continuous`` — the targets are redrawn within ``regime`` (default ``moderate``) every ``interval_s``
  seconds (default 10), the first draw at start.
- ``processes`` — ``processes`` fully busy processes (the background-process model of the delay
  analysis); no duty cycle, no memory load, no pinning (the OS spreads them like any background work).
  They are forked children: they inherit the environment (hence the run-id tag) and the process group
  of the load process, so teardown kills them with the group; each also dies when its parent dies
  (``PR_SET_PDEATHSIG`` where available, else a parent-pid check every few ms).

An explicit ``cpu_pct`` / ``mem_pct`` overrides the drawn value of that target (the draws still happen,
so the other target's sequence does not depend on the override).

**Seed.** The generator is ``random.Random`` seeded with the first 8 bytes (big-endian) of
``SHA-256("dit-load/<scenario seed>/<device name>")`` (:func:`load_rng`): two runs of the same
scenario draw the same targets on the same device, and two devices draw independently.

**CPU** is a duty cycle on one core: every ``period_ms`` (100 ms) the generator busy-spins on
``time.monotonic_ns`` for ``target * period`` and sleeps for the rest of the period (periods are on an
absolute schedule; an overrun restarts the schedule). When another process preempted the spin, the
spin is extended by the CPU time it lost (its thread CPU time is checked once per period; config
``compensate``, default true; :class:`DutyCycle`), so the generator's own CPU share is the target also on
a core it shares with the inference runtime. It pins itself with ``os.sched_setaffinity`` to
``cpu_core`` when given, else to the **highest-numbered core it may run on** (core 3 on a Pi 4): the
inference runtime's first threads and most interrupts land on the low cores.

**Memory** targets are a fraction of the memory available to the device: the **cgroup limit** when the
process is in a memory cgroup with a limit (``/proc/self/cgroup`` → cgroup v2 ``memory.max`` or v1
``memory.limit_in_bytes``, the smallest limit on the path up to the hierarchy's mount point), else
``board_memory_mb`` when the config gives it (local mode: the memory of the board a device stands for,
``DIT_LOCAL_MEMORY_MB``, so that a light load is a board's 10-20 %, not a laptop's), else **MemTotal**
of ``/proc/meminfo`` (the board's memory, not what happens to be free). The generator
allocates that many bytes in 8 MiB chunks and writes one byte in every page, so the pages are resident.
For the host's safety an allocation is clamped to MemAvailable - 64 MiB at the time (logged as
``clamped``). Allocating (or releasing) happens between two duty-cycle periods and keeps the core busy
while it lasts (hundreds of MB take a fraction of a second on a Pi): the row of a target change is
written once its memory is in place.

**Settling.** With a ``settle`` config (``timing.settle`` of the scenario, ``steady: true``) the generator
does not report ready at once: it runs its duty cycle and measures the CPU share it actually got (its
thread CPU time over wall time, ``time.thread_time_ns``) over a sliding window of ``window_s``; once that
share is within ``tolerance_pct`` percentage points of the CPU target it is *steady*, and the ready file
(which the apply stage waits for) carries ``settle``: ``{"steady", "reason", "elapsed_s", "achieved_pct",
"target_pct", "tolerance_pct", "window_s", "timeout_s"}``. After ``timeout_s`` without a steady window it
reports ready anyway with ``steady: false, reason: "timeout"`` (the controller warns and records it: see
:mod:`dit.conditions.load.settle`). The first target holds while settling (continuous mode redraws after it). Mode
``processes`` has no duty cycle: it reports ``steady: true, reason: "no duty cycle"`` once its processes
run.

Every target change is one row of ``load.csv`` (``results_dir``) with its ``time.monotonic_ns()``;
``load.json`` holds the origin pair and how targets were chosen. SIGTERM stops the generator at once in
the idle part of a period, else at the end of the busy part (≤ one period, 100 ms by default); it writes a
``stop`` row and closes the file (the stop signal is :class:`dit.device.sampling.StopSignal`).
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import hashlib
import io
import mmap
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from dit.device.common import ConfigError, Origin, require, write_json
from dit.device.sampling import StopSignal, deadline_ns
from dit.device.tags import RUN_ENV

#: The thesis's compute regimes in percent: (CPU range, memory range). Mirrors ``dit.conditions.load.LOAD_REGIMES``.
REGIMES: Final[Mapping[str, tuple[tuple[float, float], tuple[float, float]]]] = {
    "light": ((10.0, 20.0), (10.0, 20.0)),
    "moderate": ((30.0, 50.0), (30.0, 40.0)),
    "heavy": ((60.0, 80.0), (50.0, 60.0)),
}
MODES: Final = ("light", "moderate", "heavy", "continuous", "processes")
PERIOD_NS: Final = 100_000_000
CHUNK_BYTES: Final = 8 * 1024 * 1024
RESERVE_BYTES: Final = 64 * 1024 * 1024
CSV_COLUMNS: Final = (
    "t_mono_ns",
    "event",
    "mode",
    "cpu_pct",
    "mem_pct",
    "mem_bytes",
    "clamped",
    "processes",
    "core",
)
_UNLIMITED_V1: Final = 1 << 62  # v1 reports "no limit" as a page-rounded LONG_MAX


def load_rng(seed: int, host: str) -> random.Random:
    """The seeded generator of ``host``'s load (see the module docstring)."""
    digest = hashlib.sha256(f"dit-load/{seed}/{host}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def draw_targets(rng: random.Random, regime: str) -> tuple[float, float]:
    """One (cpu_pct, mem_pct) draw within ``regime``'s ranges, CPU first, rounded to 0.01 %."""
    (cpu_lo, cpu_hi), (mem_lo, mem_hi) = REGIMES[regime]
    cpu = round(rng.uniform(cpu_lo, cpu_hi), 2)
    mem = round(rng.uniform(mem_lo, mem_hi), 2)
    return cpu, mem


def busy_ns(cpu_pct: float, period_ns: int = PERIOD_NS) -> int:
    """Busy part of one duty-cycle period for a CPU target in percent (clamped to 0..100)."""
    return round(period_ns * min(max(cpu_pct, 0.0), 100.0) / 100.0)


# --------------------------------------------------------------------------- memory basis


@dataclass(frozen=True)
class MemoryBasis:
    """What a memory percentage is a percentage of."""

    total_bytes: int
    source: str  # "cgroup2 <dir>/memory.max" | "cgroup1 <dir>/memory.limit_in_bytes" | "meminfo MemTotal"


def read_meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """``/proc/meminfo`` in bytes (``kB`` values multiplied by 1024)."""
    out: dict[str, int] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        value = int(parts[0])
        out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


def _mounts(mountinfo: Path) -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of every cgroup mount."""
    found: list[tuple[str, str, str, set[str]]] = []
    for line in mountinfo.read_text(encoding="utf-8").splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((tail[0], fields[3], fields[4], set(tail[2].split(","))))
    return found


def _limit_on_path(mount_point: Path, rel: str, filename: str) -> tuple[int, Path] | None:
    """The smallest limit in ``filename`` from the cgroup directory up to the mount point."""
    best: tuple[int, Path] | None = None
    directory = mount_point / rel.strip("/") if rel.strip("/") else mount_point
    while True:
        try:
            text = (directory / filename).read_text(encoding="ascii").strip()
        except OSError:
            text = ""
        if text and text != "max" and text.isdigit():
            value = int(text)
            if value < _UNLIMITED_V1 and (best is None or value < best[0]):
                best = (value, directory)
        if directory == mount_point or mount_point not in directory.parents:
            return best
        directory = directory.parent


def cgroup_memory_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"), mountinfo: Path = Path("/proc/self/mountinfo")
) -> tuple[int, str] | None:
    """The memory limit of this process's cgroup (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``)."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
        mounts = _mounts(mountinfo)
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            kind, filename = "cgroup2", "memory.max"
            candidates = [m for m in mounts if m[0] == "cgroup2"]
        elif "memory" in controllers.split(","):
            kind, filename = "cgroup1", "memory.limit_in_bytes"
            candidates = [m for m in mounts if m[0] == "cgroup" and "memory" in m[3]]
        else:
            continue
        for _, root, point, _ in candidates:
            if path != root and not path.startswith(root.rstrip("/") + "/"):
                continue
            rel = path[len(root.rstrip("/")) :] if root != "/" else path
            found = _limit_on_path(Path(point), rel, filename)
            if found is not None:
                return found[0], f"{kind} {found[1]}/{filename}"
    return None


def memory_basis(
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
    meminfo: Path = Path("/proc/meminfo"),
    board_bytes: int | None = None,
) -> MemoryBasis:
    """The cgroup limit if there is one (below MemTotal), else ``board_bytes`` (local mode's board, if
    below MemTotal), else MemTotal."""
    total = read_meminfo(meminfo)["MemTotal"]
    limit = cgroup_memory_limit(proc_cgroup, mountinfo)
    if limit is not None and limit[0] < total:
        return MemoryBasis(limit[0], limit[1])
    if board_bytes is not None and board_bytes < total:
        return MemoryBasis(board_bytes, "board_memory_mb (local mode: the board a device stands for)")
    return MemoryBasis(total, "meminfo MemTotal")


class MemoryLoad:
    """Resident memory of a chosen size: 8 MiB chunks, every page written once."""

    def __init__(self) -> None:
        self._chunks: list[bytearray] = []
        self.size = 0

    def resize(self, target: int) -> None:
        target = max(0, target)
        while self.size > target and self._chunks:
            last = self._chunks.pop()
            self.size -= len(last)
            del last
        while self.size < target:
            n = min(CHUNK_BYTES, target - self.size)
            chunk = bytearray(n)
            page = mmap.PAGESIZE
            count = len(range(0, n, page))
            chunk[::page] = b"\x01" * count  # write one byte per page: the pages become resident
            self._chunks.append(chunk)
            self.size += n

    def touched(self) -> bool:
        """Every page of every chunk carries the written byte (for tests)."""
        page = mmap.PAGESIZE
        return all(all(b == 1 for b in chunk[::page]) for chunk in self._chunks)


# --------------------------------------------------------------------------- CPU


def pick_core(requested: int | None = None) -> int | None:
    """The core to pin to: ``requested`` if allowed, else the highest allowed core; None without affinity."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    allowed = sorted(getter(0))
    if requested is not None:
        if requested not in allowed:
            raise ConfigError(f"cpu_core: {requested} is not among the allowed cores {allowed}")
        return requested
    return allowed[-1] if allowed else None


def pin(core: int | None) -> None:
    setter = getattr(os, "sched_setaffinity", None)
    if core is not None and setter is not None:
        setter(0, {core})


def spin_until(deadline_ns: int, clock: Callable[[], int] = time.monotonic_ns) -> None:
    while clock() < deadline_ns:
        pass


class DutyCycle:
    """Busy for ``busy`` ns of every ``period`` ns on an absolute schedule.

    The busy part spins on ``clock`` (``time.monotonic_ns``) until ``start + busy``. With ``compensate``
    (the default) the thread's CPU time (``cpu_clock``, ``time.thread_time_ns``) is then checked: when
    the scheduler took the core away during the spin (another process ran), the spin goes on for the CPU
    time still missing, up to the end of the period. Without contention this is the plain wall-clock spin
    (one extra clock read per period); with it, the generator still consumes its target share of the core
    (as far as the scheduler lets it) instead of losing whatever was preempted.
    """

    SLACK_NS: Final = 50_000  # CPU time short of the target that is not worth another spin

    def __init__(
        self,
        period_ns: int = PERIOD_NS,
        clock: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], object] = time.sleep,
        cpu_clock: Callable[[], int] = time.thread_time_ns,
        compensate: bool = True,
    ) -> None:
        self.period_ns = period_ns
        self.clock = clock
        self.sleep = sleep
        self.cpu_clock = cpu_clock
        self.compensate = compensate
        self.next_start = clock()

    def period(self, cpu_pct: float) -> None:
        """Run one period: spin for the busy part, sleep until the next period starts."""
        start = self.next_start
        end = start + self.period_ns
        busy = busy_ns(cpu_pct, self.period_ns)
        if busy > 0:
            cpu_start = self.cpu_clock() if self.compensate else 0
            deadline = start + busy
            while True:
                spin_until(min(deadline, end), self.clock)
                if not self.compensate:
                    break
                missing = busy - (self.cpu_clock() - cpu_start)
                now = self.clock()
                if missing <= self.SLACK_NS or now >= end:
                    break
                deadline = now + missing
        self.next_start = end
        remaining = self.next_start - self.clock()
        if remaining > 0:
            self.sleep(remaining / 1e9)
        elif remaining < -self.period_ns:
            self.next_start = self.clock()  # far behind (suspended, starved): restart the schedule


# --------------------------------------------------------------------------- settling


@dataclass(frozen=True)
class SettleConfig:
    """When the generator counts as steady (the ``settle`` config; scenario ``timing.settle``)."""

    timeout_s: float
    tolerance_pct: float
    window_s: float


@dataclass(frozen=True)
class SettleResult:
    """How settling ended, as the ready file and the controller report it."""

    steady: bool
    reason: str  # steady | timeout | stopped | no duty cycle
    elapsed_s: float
    achieved_pct: float | None  # CPU share over the last full window (None: no full window yet)
    target_pct: float | None
    tolerance_pct: float
    window_s: float
    timeout_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class SettleWatch:
    """Decides, from ``(wall_ns, cpu_ns)`` observations of the duty-cycle thread, when the load is steady.

    The achieved share is ``100 * delta-CPU / delta-wall`` between the newest observation and the latest
    one at least ``window`` before it. Steady: a full window and ``|achieved - target| <= tolerance``.
    Timeout: ``timeout`` after ``start_ns`` without that (the last achieved share is reported).
    """

    def __init__(self, target_pct: float, cfg: SettleConfig, start_ns: int) -> None:
        self.target_pct = target_pct
        self.cfg = cfg
        self.start_ns = start_ns
        self.window_ns = round(cfg.window_s * 1e9)
        self.timeout_ns = round(cfg.timeout_s * 1e9)
        self.achieved: float | None = None
        self._samples: deque[tuple[int, int]] = deque()

    def _result(self, steady: bool, reason: str, now_ns: int) -> SettleResult:
        return SettleResult(
            steady=steady,
            reason=reason,
            elapsed_s=round((now_ns - self.start_ns) / 1e9, 3),
            achieved_pct=None if self.achieved is None else round(self.achieved, 2),
            target_pct=self.target_pct,
            tolerance_pct=self.cfg.tolerance_pct,
            window_s=self.cfg.window_s,
            timeout_s=self.cfg.timeout_s,
        )

    def observe(self, wall_ns: int, cpu_ns: int) -> SettleResult | None:
        """One observation; the result once steady or timed out, else None."""
        self._samples.append((wall_ns, cpu_ns))
        while len(self._samples) >= 2 and self._samples[1][0] <= wall_ns - self.window_ns:
            self._samples.popleft()
        base_wall, base_cpu = self._samples[0]
        if wall_ns - base_wall >= self.window_ns > 0:
            self.achieved = 100.0 * (cpu_ns - base_cpu) / (wall_ns - base_wall)
            if abs(self.achieved - self.target_pct) <= self.cfg.tolerance_pct:
                return self._result(True, "steady", wall_ns)
        if wall_ns - self.start_ns >= self.timeout_ns:
            return self._result(False, "timeout", wall_ns)
        return None

    def stopped(self, now_ns: int) -> SettleResult:
        return self._result(False, "stopped", now_ns)


def settle(
    period: Callable[[], None],
    watch: SettleWatch,
    stopped: Callable[[], bool],
    clock: Callable[[], int] = time.monotonic_ns,
    cpu_clock: Callable[[], int] = time.thread_time_ns,
) -> SettleResult:
    """Run duty-cycle periods until ``watch`` says steady or timed out (or a stop is requested)."""
    while True:
        result = watch.observe(clock(), cpu_clock())
        if result is not None:
            return result
        if stopped():
            return watch.stopped(clock())
        period()


# --------------------------------------------------------------------------- busy processes


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1


def _busy_child(parent: int) -> None:
    StopSignal.release()  # a signal to the group ends the child at once, whatever the parent blocks
    _die_with_parent()
    while os.getppid() == parent:
        for _ in range(20_000):  # a few ms of pure computation between parent checks
            pass


def start_busy_processes(count: int) -> list[int]:
    parent = os.getpid()
    pids: list[int] = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                _busy_child(parent)
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def stop_processes(pids: list[int], grace_s: float = 2.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    pending = list(pids)
    while pending:
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                pending.remove(pid)
        if pending and time.monotonic() > deadline:
            for pid in pending:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + grace_s
        if pending:
            time.sleep(0.01)


# --------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class LoadConfig:
    host: str
    run_id: str
    results_dir: Path
    mode: str
    regime: str | None
    cpu_pct: float | None
    mem_pct: float | None
    processes: int
    interval_s: float
    seed: int
    cpu_core: int | None
    period_ns: int
    duration_s: float | None
    ready_file: Path | None
    compensate: bool
    settle: SettleConfig | None = None
    board_memory_mb: int | None = None


def _number(cfg: Mapping[str, Any], key: str, lo: float, hi: float | None = None) -> float | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: {value!r} is not a number")
    if value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{key}: {value} is outside {lo}..{hi if hi is not None else 'inf'}")
    return float(value)


def parse_config(cfg: Mapping[str, Any]) -> LoadConfig:
    mode = str(require(cfg, "mode", str))
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    regime: str | None
    if mode == "continuous":
        regime = str(cfg.get("regime") or "moderate")
    elif mode == "processes":
        regime = None
    else:
        regime = mode
    if regime is not None and regime not in REGIMES:
        raise ConfigError(f"regime: {regime!r} is not one of {', '.join(REGIMES)}")
    processes = cfg.get("processes")
    if mode == "processes" and (
        isinstance(processes, bool) or not isinstance(processes, int) or processes < 1
    ):
        raise ConfigError(f"processes: {processes!r} is not a positive integer (mode processes)")
    core = cfg.get("cpu_core")
    if core is not None and (isinstance(core, bool) or not isinstance(core, int) or core < 0):
        raise ConfigError(f"cpu_core: {core!r} is not a core number")
    seed = require(cfg, "seed", int)
    interval = _number(cfg, "interval_s", 1e-3)
    period_ms = _number(cfg, "period_ms", 1.0, 10_000.0)
    ready = cfg.get("ready_file")
    board = _number(cfg, "board_memory_mb", 1.0)
    return LoadConfig(
        board_memory_mb=None if board is None else int(board),
        settle=_settle_config(cfg.get("settle")),
        host=str(require(cfg, "host", str)),
        run_id=str(cfg.get("run_id", "")),
        results_dir=Path(require(cfg, "results_dir", str)),
        mode=mode,
        regime=regime,
        cpu_pct=_number(cfg, "cpu_pct", 0.0, 100.0),
        mem_pct=_number(cfg, "mem_pct", 0.0, 100.0),
        processes=int(processes) if mode == "processes" and isinstance(processes, int) else 0,
        interval_s=interval if interval is not None else 10.0,
        seed=int(seed),
        cpu_core=core,
        period_ns=round((period_ms if period_ms is not None else 100.0) * 1e6),
        duration_s=_number(cfg, "duration_s", 0.0),
        ready_file=Path(str(ready)) if ready else None,
        compensate=bool(cfg.get("compensate", True)),
    )


def _settle_config(raw: Any) -> SettleConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"settle: {raw!r} is not a mapping or null")
    values: dict[str, float] = {}
    for key, lo, hi, default in (
        ("timeout_s", 0.0, 3600.0, 60.0),
        ("tolerance_pct", 0.0, 100.0, 5.0),
        ("window_s", 0.01, 60.0, 1.0),
    ):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo < value <= hi:
            raise ConfigError(f"settle.{key}: {value!r} is not a number in ({lo}, {hi}]")
        values[key] = float(value)
    return SettleConfig(**values)


class LoadLog:
    """``load.csv``: one flushed row per target change."""

    def __init__(self, path: Path) -> None:
        self._fh: io.TextIOWrapper = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115
        self._writer = csv.writer(self._fh, lineterminator="\n")
        self._writer.writerow(CSV_COLUMNS)
        self._fh.flush()

    def row(
        self,
        event: str,
        cfg: LoadConfig,
        cpu: float | None,
        mem: float | None,
        mem_bytes: int,
        clamped: bool,
        core: int | None,
    ) -> None:
        self._writer.writerow(
            [
                time.monotonic_ns(),
                event,
                cfg.mode,
                "" if cpu is None else f"{cpu:.2f}",
                "" if mem is None else f"{mem:.2f}",
                mem_bytes,
                int(clamped),
                cfg.processes,
                "" if core is None else core,
            ]
        )
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _apply_memory(load: MemoryLoad, mem_pct: float, basis: MemoryBasis) -> bool:
    """Resize the memory load; True when the target was clamped to what is available."""
    target = int(basis.total_bytes * mem_pct / 100.0)
    available = read_meminfo().get("MemAvailable", target) + load.size - RESERVE_BYTES
    clamped = target > available
    load.resize(min(target, max(available, 0)))
    return clamped


def run_load(raw: Mapping[str, Any]) -> int:
    """The ``load`` command (config keys: see :class:`LoadConfig` and ``docs/protocol.md``)."""
    cfg = parse_config(raw)
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(RUN_ENV, cfg.run_id)
    with StopSignal() as stop:
        return _load(cfg, stop)


def _load(cfg: LoadConfig, stop: StopSignal) -> int:
    origin = Origin.now()
    rng = load_rng(cfg.seed, cfg.host)
    core = pick_core(cfg.cpu_core) if cfg.mode != "processes" else None
    board = None if cfg.board_memory_mb is None else cfg.board_memory_mb * 1024 * 1024
    basis = memory_basis(board_bytes=board) if cfg.mode != "processes" else None
    header: dict[str, Any] = {
        "host": cfg.host,
        "run_id": cfg.run_id,
        "pid": os.getpid(),
        "origin_wall_ns": origin.wall_ns,
        "origin_mono_ns": origin.mono_ns,
        "mode": cfg.mode,
        "regime": cfg.regime,
        "seed": cfg.seed,
        "rng": "random.Random(int.from_bytes(sha256('dit-load/<seed>/<host>')[:8], 'big'))",
        "cpu_override_pct": cfg.cpu_pct,
        "mem_override_pct": cfg.mem_pct,
        "interval_s": cfg.interval_s if cfg.mode == "continuous" else None,
        "processes": cfg.processes,
        "core": core,
        "period_ns": cfg.period_ns,
        "compensate": cfg.compensate if cfg.mode != "processes" else None,
        "memory_basis_bytes": basis.total_bytes if basis else None,
        "memory_basis_source": basis.source if basis else None,
    }
    write_json(cfg.results_dir / "load.json", header)
    log = LoadLog(cfg.results_dir / "load.csv")
    end = deadline_ns(time.monotonic_ns(), cfg.duration_s)
    try:
        if cfg.mode == "processes":
            pids = start_busy_processes(cfg.processes)
            log.row("start", cfg, 100.0, None, 0, False, None)
            steady: dict[str, Any] | None = None
            if cfg.settle is not None:
                s = cfg.settle
                steady = SettleResult(
                    True, "no duty cycle", 0.0, None, None, s.tolerance_pct, s.window_s, s.timeout_s
                ).as_dict()
            _ready(cfg, {"pid": os.getpid(), "children": pids, "settle": steady})
            try:
                while not stop.wait(0.05) and (end is None or time.monotonic_ns() < end):
                    pass
            finally:
                stop_processes(pids)
            log.row("stop", cfg, None, None, 0, False, None)
            return 0
        return _run_duty(cfg, rng, core, basis, log, stop, end)
    finally:
        log.close()


def _ready(cfg: LoadConfig, extra: dict[str, Any]) -> None:
    if cfg.ready_file is not None:
        write_json(cfg.ready_file, {"host": cfg.host, **extra})


def _run_duty(
    cfg: LoadConfig,
    rng: random.Random,
    core: int | None,
    basis: MemoryBasis | None,
    log: LoadLog,
    stop: StopSignal,
    end: int | None,
) -> int:
    assert cfg.regime is not None and basis is not None
    pin(core)
    memory = MemoryLoad()

    def targets() -> tuple[float, float]:
        cpu, mem = draw_targets(rng, str(cfg.regime))
        return (cpu if cfg.cpu_pct is None else cfg.cpu_pct, mem if cfg.mem_pct is None else cfg.mem_pct)

    cpu, mem = targets()
    clamped = _apply_memory(memory, mem, basis)
    log.row("start", cfg, cpu, mem, memory.size, clamped, core)
    # The idle part of a period is a wait for the stop signal: a stop ends it at once.
    duty = DutyCycle(cfg.period_ns, sleep=stop.wait, compensate=cfg.compensate)
    steady: dict[str, Any] | None = None
    if cfg.settle is not None:
        watch = SettleWatch(cpu, cfg.settle, time.monotonic_ns())
        steady = settle(lambda: duty.period(cpu), watch, stop.poll).as_dict()
    _ready(
        cfg, {"pid": os.getpid(), "cpu_pct": cpu, "mem_pct": mem, "mem_bytes": memory.size, "settle": steady}
    )
    interval_ns = round(cfg.interval_s * 1e9)
    next_draw = duty.next_start + interval_ns
    while not stop.poll() and (end is None or time.monotonic_ns() < end):
        if cfg.mode == "continuous" and time.monotonic_ns() >= next_draw:
            cpu, mem = targets()
            clamped = _apply_memory(memory, mem, basis)
            log.row("target", cfg, cpu, mem, memory.size, clamped, core)
            next_draw += interval_ns * max(1, (time.monotonic_ns() - next_draw) // interval_ns + 1)
        duty.period(cpu)
    memory.resize(0)
    log.row("stop", cfg, None, None, 0, False, core)
    return 0
