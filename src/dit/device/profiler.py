"""Stage-by-stage profiling of any :class:`~dit.device.adapter.StageModel` (stdlib only).

Used by the device agent, by the edge service's capacity profile and by real TensorFlow /
PyTorch adapters alike: it only calls ``make_input``, ``run_stage``, ``output_bytes`` and ``ops``.

Per stage and measured pass it records

* ``latency_ns``: from one **timing pass** per repetition that runs all stages as a partition runs
  them, with nothing but clock reads between stages (``latency_method`` in the summary):

  - ``one_call``: a model that implements :class:`~dit.device.adapter.TimedPass` (the Keras
    adapters) runs all stages in one framework call with a clock read between stages, and
    ``latency_ns`` is the difference of consecutive boundaries: a per-stage call would add the
    framework's fixed dispatch cost (~0.2 ms per ``tf.function`` call) to every stage. The call's own
    fixed cost, paid once per pass, is counted once: boundary 0 is read just before the call (stage
    1 carries the entry) and the last boundary just after it returns (stage N carries the return),
    so the stages add up to the wall time of one whole forward call;
  - ``back_to_back``: any other model's stages are called one after the other with
    ``time.monotonic_ns()`` between them. Timing each stage of the instrumented pass instead (the
    sampler and memory reads between stages) leaves gaps in which a CPU quota refills, so under a
    ``cpu_share_pct`` the stages run at full speed in the profile and slower in inference;
  - ``per_stage_call`` (``one_call=False``): ``time.monotonic_ns()`` around each ``run_stage`` of the
    instrumented pass.

  The timing passes of all repetitions run back to back first, as forward passes do (a
  stage-by-stage pass between them would also leave a framework's thread pools cold for every
  call); the other columns then come from an instrumented stage-by-stage pass of each repetition on
  the same input (CPU and memory need Python between the stages), and ``start_ns`` from the timing
  pass;
* ``cpu_pct``: the stage's *mean* CPU use, 100 x process CPU time (``time.process_time_ns``, all
  threads) / wall time of the stage. It exceeds 100 when the stage computes on several threads (e.g. a
  BLAS pool);
* ``cpu_peak_pct``: the stage's *peak* CPU use, from samples of the process CPU time every
  ``cpu_sample_interval_ns`` (2 ms by default) while a stage runs: on Linux by a helper process
  (:class:`HelperCpuSampler`, no GIL taken in the profiled process), else by a sampling thread
  (:class:`CpuSampler`, minus its own thread CPU time). The peak is the
  largest 100 x delta-CPU / delta-wall over consecutive samples inside the stage (windows shorter than
  half the interval are merged into the next), and never less than ``cpu_pct`` (the whole stage is a
  window too: a stage shorter than two intervals has peak = mean);
* ``peak_mem_bytes``: the process peak RSS during the stage. Method ``clear_refs``: the kernel's
  high-water mark VmHWM is reset to the current RSS by writing ``5`` to ``/proc/self/clear_refs``
  just before the stage and read from ``/proc/self/status`` just after (both outside the timed
  window). Where that is not permitted (non-Linux, old kernel, restricted /proc) the method is
  ``ru_maxrss``: ``resource.getrusage`` peak since process start, a monotone upper bound.
  The method used is in the summary;
* ``output_bytes`` and ``ops`` from the adapter, and ``start_ns`` relative to the origin.

``layers.csv`` has one stage-0 row per repetition (latency 0, output_bytes = input size, ops 0,
cpu 0, peak memory as read before the pass).
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import os
import resource
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from dit.device.adapter import StageModel, TimedPass

LAYERS_COLUMNS = (
    "rep",
    "stage",
    "latency_ns",
    "output_bytes",
    "ops",
    "cpu_pct",
    "peak_mem_bytes",
    "start_ns",
    "cpu_peak_pct",
)
DEFAULT_CPU_SAMPLE_INTERVAL_NS = 2_000_000

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


@dataclass(frozen=True)
class StageRecord:
    rep: int
    stage: int
    latency_ns: int
    output_bytes: int
    ops: int
    cpu_pct: float
    peak_mem_bytes: int
    start_ns: int
    cpu_peak_pct: float = 0.0


class CpuSampler:
    """Samples the process's CPU time at a fixed interval while a stage runs (a daemon thread).

    ``begin()`` before a stage, ``end(mean_pct)`` after it returns the stage's peak CPU in percent of one
    core. Each sample is ``(clock, process CPU - sampler thread CPU)``, in a list of its own per stage
    (``begin`` swaps in a new one, ``end`` takes a copy: a sample in flight across a boundary is at most a
    few microseconds off the stage). Between stages the thread waits on an event and costs nothing.
    ``interval_ns`` 0 disables sampling (peak = mean).
    """

    def __init__(
        self,
        interval_ns: int = DEFAULT_CPU_SAMPLE_INTERVAL_NS,
        clock: Callable[[], int] = time.monotonic_ns,
        cpu: Callable[[], int] = time.process_time_ns,
        own_cpu: Callable[[], int] = time.thread_time_ns,
    ) -> None:
        if interval_ns < 0:
            raise ValueError(f"cpu_sample_interval_ns: {interval_ns} is negative")
        self.interval_ns = interval_ns
        self._clock = clock
        self._cpu = cpu
        self._own_cpu = own_cpu
        self._samples: list[tuple[int, int]] = []
        self._active = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        if interval_ns > 0:
            self._thread = threading.Thread(target=self._run, name="dit-cpu-sampler", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        interval_s = self.interval_ns / 1e9
        while True:
            self._active.wait()
            if self._closed:
                return
            samples = self._samples  # a list of this stage (begin() swaps in a new one)
            samples.append((self._clock(), self._cpu() - self._own_cpu()))
            time.sleep(interval_s)

    def begin(self) -> None:
        self._samples = []
        self._active.set()

    def end_window(self, t0: int, t1: int, mean_pct: float) -> float:
        """:meth:`end` (the thread's samples are this stage's by construction: no filter)."""
        return self.end(mean_pct)

    def end(self, mean_pct: float) -> float:
        """Stop sampling; the peak over this stage's samples (at least ``mean_pct``)."""
        self._active.clear()
        return peak_pct(list(self._samples), self.interval_ns, mean_pct)

    def close(self) -> None:
        self._closed = True
        self._active.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


# The helper process: samples the profiled process's CPU clock (clock_gettime on the pid-encoded
# process CPU clock, Linux) between a "b" (begin) and an "e" (end) on its stdin, and answers each "e"
# with a count and (monotonic ns, CPU ns) pairs. It shares no GIL with the profiled process.
_HELPER = r"""
import os, select, struct, sys, time
pid, interval = int(sys.argv[1]), int(sys.argv[2]) / 1e9
clock = ((~pid) << 3) | 2
time.clock_gettime_ns(clock)
os.write(1, b"r")
samples, active = [], False
while True:
    ready, _, _ = select.select([0], [], [], interval if active else None)
    if not ready:
        samples.append((time.monotonic_ns(), time.clock_gettime_ns(clock)))
        continue
    data = os.read(0, 64)
    if not data:
        break
    for c in data:
        samples.append((time.monotonic_ns(), time.clock_gettime_ns(clock)))
        if c == 98:
            samples, active = samples[-1:], True
        elif c == 101:
            active = False
            out = struct.pack("<q", len(samples)) + b"".join(struct.pack("<qq", t, u) for t, u in samples)
            os.write(1, out)
            samples = []
"""


class HelperCpuSampler:
    """Samples this process's CPU clock from a helper process (Linux), so the sampler takes no GIL.

    Same interface as :class:`CpuSampler`; ``end`` also needs the stage's ``t0``/``t1`` (monotonic ns:
    the helper's samples are filtered to the stage, since it wakes a little after ``begin``). Raises
    ``OSError`` when the helper cannot start or cannot read the clock (then use :class:`CpuSampler`).
    """

    def __init__(self, interval_ns: int = DEFAULT_CPU_SAMPLE_INTERVAL_NS) -> None:
        if not sys.platform.startswith("linux") or not sys.executable:
            raise OSError("the helper sampler needs Linux and a Python executable")
        self.interval_ns = interval_ns
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _HELPER, str(os.getpid()), str(interval_ns)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in = self._proc.stdin.fileno()
        self._out = self._proc.stdout.fileno()
        if self._read_exact(1, timeout_s=30.0) != b"r":
            self.close()
            raise OSError("the CPU sampler helper did not start")

    def _read_exact(self, n: int, timeout_s: float = 10.0) -> bytes:
        data = b""
        while len(data) < n:
            ready, _, _ = select.select([self._out], [], [], timeout_s)
            chunk = os.read(self._out, n - len(data)) if ready else b""
            if not chunk:
                raise OSError("the CPU sampler helper stopped answering")
            data += chunk
        return data

    def begin(self) -> None:
        os.write(self._in, b"b")

    def end_window(self, t0: int, t1: int, mean_pct: float) -> float:
        os.write(self._in, b"e")
        (count,) = struct.unpack("<q", self._read_exact(8))
        raw = self._read_exact(16 * count)
        samples = [struct.unpack_from("<qq", raw, 16 * i) for i in range(count)]
        inside = [(t, c) for t, c in samples if t0 <= t <= t1]
        return peak_pct(inside, self.interval_ns, mean_pct)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def peak_pct(samples: list[tuple[int, int]], interval_ns: int, mean_pct: float) -> float:
    """Largest 100 x delta-CPU / delta-wall over consecutive ``(wall_ns, cpu_ns)`` samples, >= ``mean_pct``.

    A window shorter than half ``interval_ns`` (a late wake-up right after another sample) is merged into
    the following one, so a short window does not turn clock granularity into a spurious peak.
    """
    peak = mean_pct
    if len(samples) < 2:
        return round(peak, 2)
    start_t, start_c = samples[0]
    for t, c in samples[1:]:
        wall = t - start_t
        if wall < interval_ns // 2:
            continue
        peak = max(peak, 100.0 * (c - start_c) / wall)
        start_t, start_c = t, c
    return round(peak, 2)


class PeakMemory:
    """Per-stage peak RSS: VmHWM reset through clear_refs where permitted, else ru_maxrss."""

    def __init__(self, force_method: str | None = None) -> None:
        self.method = force_method or ("clear_refs" if self._clear_refs_works() else "ru_maxrss")
        if self.method not in ("clear_refs", "ru_maxrss"):
            raise ValueError(f"unknown peak memory method {self.method!r}")

    @staticmethod
    def _vmhwm() -> int | None:
        try:
            with open(_STATUS, encoding="ascii", errors="replace") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        return None

    def _clear_refs_works(self) -> bool:
        if not sys.platform.startswith("linux") or self._vmhwm() is None:
            return False
        try:
            self._reset_hwm()
        except OSError:
            return False
        return True

    @staticmethod
    def _reset_hwm() -> None:
        with open(_CLEAR_REFS, "w", encoding="ascii") as fh:
            fh.write("5")

    def reset(self) -> None:
        if self.method == "clear_refs":
            try:
                self._reset_hwm()
            except OSError:
                self.method = "ru_maxrss"

    def read(self) -> int:
        if self.method == "clear_refs":
            value = self._vmhwm()
            if value is not None:
                return value
            self.method = "ru_maxrss"
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024


@dataclass
class ProfileResult:
    model: str
    num_stages: int
    warmup: int
    repetitions: int
    peak_mem_method: str
    records: list[StageRecord]
    cpu_sample_interval_ns: int = DEFAULT_CPU_SAMPLE_INTERVAL_NS
    cpu_peak_method: str = "thread"
    latency_method: str = "per_stage_call"

    def mean_latency_ns(self) -> list[float]:
        """Mean latency per stage, index 0..N (index 0 is always 0.0)."""
        sums = [0] * (self.num_stages + 1)
        counts = [0] * (self.num_stages + 1)
        for r in self.records:
            sums[r.stage] += r.latency_ns
            counts[r.stage] += 1
        return [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]

    def summary(self) -> dict[str, Any]:
        means = self.mean_latency_ns()
        per_stage: list[dict[str, Any]] = []
        for stage in range(self.num_stages + 1):
            rows = [r for r in self.records if r.stage == stage]
            if not rows:
                continue
            lat = [r.latency_ns for r in rows]
            per_stage.append(
                {
                    "stage": stage,
                    "mean_latency_ns": means[stage],
                    "min_latency_ns": min(lat),
                    "max_latency_ns": max(lat),
                    "output_bytes": rows[0].output_bytes,
                    "ops": rows[0].ops,
                    "mean_cpu_pct": sum(r.cpu_pct for r in rows) / len(rows),
                    "max_cpu_peak_pct": max(r.cpu_peak_pct for r in rows),
                    "max_peak_mem_bytes": max(r.peak_mem_bytes for r in rows),
                }
            )
        return {
            "model": self.model,
            "stages": self.num_stages,
            "warmup": self.warmup,
            "repetitions": self.repetitions,
            "peak_mem_method": self.peak_mem_method,
            "cpu_sample_interval_ns": self.cpu_sample_interval_ns,
            "cpu_peak_method": self.cpu_peak_method,
            "latency_method": self.latency_method,
            "forward_mean_ns": sum(means),
            "per_stage": per_stage,
        }


def profile_model(
    model: StageModel,
    *,
    repetitions: int,
    warmup: int = 0,
    origin_mono_ns: int | None = None,
    peak_memory: PeakMemory | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    cpu_sample_interval_ns: int = DEFAULT_CPU_SAMPLE_INTERVAL_NS,
    one_call: bool = True,
    wall_clock: Callable[[], int] = time.time_ns,
    stop: Callable[[], bool] | None = None,
) -> ProfileResult:
    """Run ``warmup`` unrecorded passes then ``repetitions`` measured passes, stage by stage.

    ``one_call`` (default): the latencies come from one pass of all stages per repetition, the
    model's ``timed_pass`` when it implements :class:`~dit.device.adapter.TimedPass` (``one_call``),
    else its stages called back to back with only a clock read between them (``back_to_back``); see
    the module docstring. ``False`` times each stage of the instrumented pass (``per_stage_call``).
    ``wall_clock`` is the scale of the ``timed_pass`` boundaries, mapped onto ``clock`` by reading
    both just before the call.

    ``stop``: asked before every repetition (after the warm-up); when it says True the profile ends
    there, with the repetitions done (``repetitions`` is then an upper bound). Each repetition's timing
    pass then runs just before its stage-by-stage pass instead of all timing passes first, so that a
    stop costs at most one repetition: the edge's profile at the start instant ends when the first
    request arrives (:mod:`dit.device.edge`).
    """
    if repetitions < 0 or warmup < 0:
        raise ValueError(f"repetitions ({repetitions}) and warmup ({warmup}) must be >= 0")
    origin = clock() if origin_mono_ns is None else origin_mono_ns
    mem = peak_memory or PeakMemory()
    timed = one_call and isinstance(model, TimedPass)
    sampler = make_sampler(cpu_sample_interval_ns, clock is time.monotonic_ns)
    timer: _OneCallTimer | _BackToBackTimer | None = None
    method = "per_stage_call"
    if timed:
        timer, method = _OneCallTimer(cast(TimedPass, model), clock, wall_clock), "one_call"
    elif one_call:
        timer, method = _BackToBackTimer(model, clock), "back_to_back"
    try:
        records = _passes(model, repetitions, warmup, origin, mem, clock, sampler, timer, stop)
    finally:
        sampler.close()
    return ProfileResult(
        model=model.name,
        num_stages=model.num_stages,
        warmup=warmup,
        repetitions=len({r.rep for r in records}) if stop is not None else repetitions,
        peak_mem_method=mem.method,
        records=records,
        cpu_sample_interval_ns=cpu_sample_interval_ns,
        cpu_peak_method=sampler_method(sampler),
        latency_method=method,
    )


Sampler = CpuSampler | HelperCpuSampler


def make_sampler(interval_ns: int, monotonic: bool = True) -> Sampler:
    """The helper-process sampler where it works (Linux, the real monotonic clock), else the thread."""
    if interval_ns > 0 and monotonic:
        try:
            return HelperCpuSampler(interval_ns)
        except OSError:
            pass
    return CpuSampler(interval_ns)


def sampler_method(sampler: Sampler) -> str:
    if isinstance(sampler, HelperCpuSampler):
        return "helper_process"
    return "thread" if sampler.interval_ns > 0 else "off"


class _OneCallTimer:
    """One :meth:`~dit.device.adapter.TimedPass.timed_pass` per repetition: :meth:`run` makes the
    call and keeps what it returned, :meth:`stages` turns that into (start on ``clock``, latency) per
    stage once all the passes have run."""

    def __init__(self, model: TimedPass, clock: Callable[[], int], wall_clock: Callable[[], int]) -> None:
        self._model = model
        self._clock = clock
        self._wall = wall_clock

    def run(self, x: Any) -> tuple[int, int, Sequence[int]]:
        """The clocks read just before the call (``clock``, then the wall clock) and the model's
        boundaries, not yet read: converting a framework's timestamps between two passes would put
        Python between them that a forward pass does not have (and the boundaries may be lazy)."""
        mono, wall = self._clock(), self._wall()
        _, bounds = self._model.timed_pass(x)
        return mono, wall, bounds

    def stages(self, timed: tuple[int, int, Sequence[int]], num_stages: int) -> list[tuple[int, int]]:
        """Stage ``i`` is boundary ``i - 1`` to boundary ``i``, except that the first boundary is the
        wall clock read just before the call: the call's entry (dispatch, argument conversion),
        paid once per pass, goes to stage 1. Its return is the model's to include in the last
        boundary (:meth:`~dit.models.keras_staged.KerasStagedModel.timed_pass` reads the clock as
        the framework call returns); what the model does after that, such as converting its
        timestamps, is instrumentation, not inference, and is left out."""
        mono, wall, lazy = timed
        bounds = list(lazy)
        if len(bounds) != num_stages + 1:
            raise ValueError(f"timed_pass returned {len(bounds)} boundaries for {num_stages} stages")
        bounds = [min(wall, bounds[0]), *bounds[1:]]
        to_clock = mono - wall
        return [(a + to_clock, b - a) for a, b in itertools.pairwise(bounds)]


class _BackToBackTimer:
    """Stages 1..N of one pass called back to back, with only a clock read between them: the
    latencies of a model without :class:`~dit.device.adapter.TimedPass`, taken as a partition runs
    its stages. Measuring each stage with the sampler and memory reads between stages instead lets a
    CPU quota refill in the gaps, so stages under a quota (``cpu_share_pct``, the rack's
    ``--cpu-share``) run at full speed in the profile and slower in inference (measured on the rack
    at 25 %: 84 ms stage by stage against 122 ms back to back for the ch4 stand-in)."""

    def __init__(self, model: StageModel, clock: Callable[[], int]) -> None:
        self._model = model
        self._clock = clock

    def stages(self, x: Any, num_stages: int) -> list[tuple[int, int]]:
        bounds = [self._clock()]
        for stage in range(1, num_stages + 1):
            x = self._model.run_stage(stage, x)
            bounds.append(self._clock())
        return [(a, b - a) for a, b in itertools.pairwise(bounds)]


def _passes(
    model: StageModel,
    repetitions: int,
    warmup: int,
    origin: int,
    mem: PeakMemory,
    clock: Callable[[], int],
    sampler: Sampler,
    timer: _OneCallTimer | _BackToBackTimer | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[StageRecord]:
    n = model.num_stages
    records: list[StageRecord] = []
    passes = warmup + repetitions
    inputs: list[Any] = []
    timings: list[list[tuple[int, int]]] = []
    if timer is not None and stop is not None:
        pass  # interleaved: each repetition's timing pass just before its stage-by-stage pass (below)
    elif timer is not None:
        # The latency passes, all stages in one call each, back to back as forward passes run: a
        # stage-by-stage pass in between would hand every call a cold framework thread pool. The
        # stage-by-stage passes below, on the same inputs, give the other columns.
        inputs = [model.make_input() for _ in range(passes)]
        if isinstance(timer, _OneCallTimer):
            calls = [timer.run(x) for x in inputs]
            timings = [timer.stages(c, n) for c in calls]
        else:
            timings = [timer.stages(x, n) for x in inputs]
    for pass_no in range(passes):
        rep = pass_no - warmup  # negative while warming up
        if stop is not None and rep >= 0 and stop():
            break
        x = inputs[pass_no] if inputs else model.make_input()
        timed = timings[pass_no] if timings else None
        if timer is not None and stop is not None:
            timed = (
                timer.stages(x, n) if isinstance(timer, _BackToBackTimer) else timer.stages(timer.run(x), n)
            )
        if rep >= 0:
            start0 = timed[0][0] if timed is not None else clock()
            records.append(StageRecord(rep, 0, 0, model.output_bytes(0), 0, 0.0, mem.read(), start0 - origin))
        for stage in range(1, n + 1):
            mem.reset()
            sampler.begin()
            c0 = time.process_time_ns()
            t0 = clock()
            x = model.run_stage(stage, x)
            t1 = clock()
            c1 = time.process_time_ns()
            wall = t1 - t0
            cpu = 100.0 * (c1 - c0) / wall if wall > 0 else 0.0
            peak = sampler.end_window(t0, t1, round(cpu, 2))
            if rep < 0:
                continue
            start, latency = timed[stage - 1] if timed is not None else (t0, wall)
            records.append(
                StageRecord(
                    rep=rep,
                    stage=stage,
                    latency_ns=latency,
                    output_bytes=model.output_bytes(stage),
                    ops=model.ops(stage),
                    cpu_pct=round(cpu, 2),
                    peak_mem_bytes=mem.read(),
                    start_ns=start - origin,
                    cpu_peak_pct=peak,
                )
            )
    return records


def write_layers_csv(path: Path, result: ProfileResult) -> None:
    """Write ``layers.csv`` (columns :data:`LAYERS_COLUMNS`) atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=LAYERS_COLUMNS)
        writer.writeheader()
        for r in result.records:
            writer.writerow(asdict(r))
    os.replace(tmp, path)
