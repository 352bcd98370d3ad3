"""The edge inference service (asyncio + one executor thread, stdlib only).

Devices connect over TCP (``dit.device.protocol``) and send a REQUEST (the activation after
their partition point) or a SKIP (partition point N). The service ACKs a REQUEST the moment its
last byte has been read, admits it to the scheduler (``batch``: when every configured device has
sent a REQUEST or SKIP for the same (round, repetition); ``immediate``: on arrival), and a single
executor thread runs the remaining stages *one stage at a time* across all admitted requests:

* **RR**: stages are served in rounds. A round is a snapshot of the admitted, unfinished requests
  in device order (order of ``devices``); each gets one stage, then a new round is formed.
  A request admitted during a round joins the next round.
* **SJF**: at every stage boundary the request with the smallest remaining workload runs (the
  sum of its remaining stages' estimates: capacity-profile mean latency when the service
  profiled itself, else the adapter's ``ops``; ties by device order, then arrival). Because the
  running request's remaining workload only shrinks, it runs to completion unless a request
  with a smaller remaining workload is admitted meanwhile (preemptive at stage granularity,
  i.e. shortest-remaining-work-first).

Per request, on the service's monotonic clock: ``barrier_ns = release - ack``, ``remote_ns`` =
sum of its stage slices (the first slice includes decoding the activation, the last one encoding
the result), ``queue_ns = (done - release) - remote_ns``. They go back in the RESULT and into
``edge_requests.csv`` (times relative to the service's origin).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dit.device.adapter import StageModel
from dit.device.common import ConfigError, Origin, build_model, read_start_file, require, write_json
from dit.device.printable import printable
from dit.device.profiler import profile_model, write_layers_csv
from dit.device.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    NONCE_BYTES,
    Ack,
    AuthError,
    Error,
    Hello,
    Message,
    MsgType,
    ProtocolError,
    Request,
    Result,
    Session,
    Skip,
    encode_parts,
    read_body,
    read_header,
    read_key,
)
from dit.device.tags import RUN_ENV

EDGE_REQUEST_COLUMNS = (
    "device",
    "round",
    "repetition",
    "partition_point",
    "request_bytes",
    "recv_start_ns",
    "ack_ns",
    "release_ns",
    "done_ns",
    "barrier_ns",
    "queue_ns",
    "remote_ns",
    "stages",
)
EDGE_STAGE_COLUMNS = ("device", "round", "repetition", "stage", "start_ns", "end_ns")
POLICIES = ("RR", "SJF")
ADMISSIONS = ("batch", "immediate")


@dataclass(frozen=True)
class EdgeConfig:
    run_id: str
    host: str
    bind: str
    port: int
    policy: str
    admission: str
    devices: tuple[str, ...]
    model: Mapping[str, Any]
    profile_repetitions: int | None
    profile_warmup: int
    profile_min_s: float
    results_dir: Path
    ready_file: Path
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    start_at_file: Path | None = None
    key_file: Path | None = None  # the run's key: every connection must prove it (docs/protocol.md)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> EdgeConfig:
        policy = require(cfg, "policy", str)
        if policy not in POLICIES:
            raise ConfigError(f"policy: {policy!r} is not one of {list(POLICIES)}")
        admission = cfg.get("admission", "batch")
        if admission not in ADMISSIONS:
            raise ConfigError(f"admission: {admission!r} is not one of {list(ADMISSIONS)}")
        devices = require(cfg, "devices", list)
        if not devices or not all(isinstance(d, str) and d for d in devices):
            raise ConfigError(f"devices: {devices!r} must be a non-empty list of device names")
        if len(set(devices)) != len(devices):
            raise ConfigError(f"devices: {devices!r} has duplicates")
        port = cfg.get("port", 0)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port: {port!r} is not an integer in 0..65535")
        profile = cfg.get("profile")
        reps: int | None = None
        warmup = 0
        min_s = 0.0
        if profile is not None:
            if not isinstance(profile, Mapping):
                raise ConfigError(f"profile: {profile!r} must be a mapping or null")
            reps = require(profile, "repetitions", int, "profile")
            warmup = profile.get("warmup", 0)
            if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0 or reps < 1:
                raise ConfigError(f"profile: repetitions {reps!r} must be >= 1 and warmup {warmup!r} >= 0")
            min_s = profile.get("min_seconds", 0.0)
            if isinstance(min_s, bool) or not isinstance(min_s, int | float) or not 0 <= min_s <= 3600:
                raise ConfigError(f"profile: min_seconds {min_s!r} must be a number of seconds in 0..3600")
        start_at_file = cfg.get("start_at_file")
        if start_at_file is not None and (not isinstance(start_at_file, str) or not start_at_file):
            raise ConfigError(f"start_at_file: {start_at_file!r} must be a path or null")
        key_file = cfg.get("key_file")
        if key_file is not None and (not isinstance(key_file, str) or not key_file):
            raise ConfigError(f"key_file: {key_file!r} must be a path or null")
        max_frame = cfg.get("max_frame_bytes", DEFAULT_MAX_FRAME_BYTES)
        if isinstance(max_frame, bool) or not isinstance(max_frame, int) or max_frame < 1:
            raise ConfigError(f"max_frame_bytes: {max_frame!r} is not a positive integer")
        return cls(
            run_id=str(cfg.get("run_id", "")),
            host=str(cfg.get("host", "edge")),
            bind=str(cfg.get("bind", "127.0.0.1")),
            port=port,
            policy=policy,
            admission=admission,
            devices=tuple(devices),
            model=require(cfg, "model", dict),
            profile_repetitions=reps,
            profile_warmup=warmup,
            profile_min_s=float(min_s),
            results_dir=Path(require(cfg, "results_dir", str)),
            ready_file=Path(require(cfg, "ready_file", str)),
            max_frame_bytes=max_frame,
            start_at_file=Path(start_at_file) if start_at_file else None,
            key_file=Path(key_file) if key_file else None,
        )


@dataclass(eq=False)
class Job:
    """One admitted REQUEST and its progress through the remaining stages."""

    device: str
    device_index: int
    round: int
    repetition: int
    point: int
    payload: bytes
    recv_start_ns: int
    ack_ns: int
    seq: int
    reply: Callable[[Message], None] = field(repr=False)
    request_bytes: int = 0
    release_ns: int = 0
    next_stage: int = 0  # set to point + 1 on creation
    activation: Any = None
    remote_ns: int = 0
    done_ns: int = 0
    result: bytes = b""
    error: str | None = None

    def __post_init__(self) -> None:
        self.next_stage = self.point + 1


class Scheduler:
    """Which admitted job gets the next stage (not thread-safe: the caller holds the lock)."""

    def __init__(self, policy: str, num_stages: int, estimates: Sequence[float]) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.policy = policy
        self.num_stages = num_stages
        self._suffix = [0.0] * (num_stages + 2)
        self.set_estimates(estimates)
        self.pending: list[Job] = []
        self._round: deque[Job] = deque()

    def set_estimates(self, estimates: Sequence[float]) -> None:
        if len(estimates) != self.num_stages + 1:
            raise ValueError(f"need {self.num_stages + 1} stage estimates (index 0..N), got {len(estimates)}")
        # suffix[s] = sum of estimates of stages s..N
        for s in range(self.num_stages, 0, -1):
            self._suffix[s] = self._suffix[s + 1] + float(estimates[s])

    def remaining(self, job: Job) -> float:
        return self._suffix[job.next_stage]

    def add(self, job: Job) -> None:
        self.pending.append(job)

    def pick(self) -> Job | None:
        if not self.pending:
            return None
        if self.policy == "SJF":
            return min(self.pending, key=lambda j: (self.remaining(j), j.device_index, j.seq))
        while self._round and self._round[0] not in self.pending:
            self._round.popleft()
        if not self._round:
            self._round.extend(sorted(self.pending, key=lambda j: (j.device_index, j.seq)))
        return self._round.popleft()

    def complete(self, job: Job) -> None:
        self.pending.remove(job)


class Executor(threading.Thread):
    """The single compute thread: one stage at a time, chosen by the scheduler."""

    def __init__(
        self,
        model: StageModel,
        scheduler: Scheduler,
        on_done: Callable[[Job], None],
        on_stage: Callable[[Job, int, int, int], None] | None = None,
    ) -> None:
        super().__init__(name="dit-edge-executor", daemon=True)
        self.model = model
        self.scheduler = scheduler
        self.on_done = on_done
        self.on_stage = on_stage  # (job, stage, start_ns, end_ns), called on this thread
        self.cond = threading.Condition()
        self._stopping = False

    def submit(self, jobs: Sequence[Job]) -> None:
        with self.cond:
            for job in jobs:
                self.scheduler.add(job)
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify()

    def set_estimates(self, estimates: Sequence[float]) -> None:
        """SJF's stage estimates from a new capacity profile (from the next pick on)."""
        with self.cond:
            self.scheduler.set_estimates(estimates)

    def run(self) -> None:
        model, n = self.model, self.model.num_stages
        while True:
            with self.cond:
                while not self._stopping and not self.scheduler.pending:
                    self.cond.wait()
                if self._stopping:
                    return
                job = self.scheduler.pick()
            if job is None:  # pragma: no cover - pending was non-empty under the lock
                continue
            stage = job.next_stage
            t0 = time.monotonic_ns()
            try:
                x = model.decode(job.payload, job.point) if stage == job.point + 1 else job.activation
                x = model.run_stage(stage, x)
                if stage == n:
                    job.result = model.encode(x)
                    job.activation = None
                else:
                    job.activation = x
            except Exception as exc:
                job.error = f"stage {stage} of {model.name!r} failed: {type(exc).__name__}: {exc}"
            t1 = time.monotonic_ns()
            job.remote_ns += t1 - t0
            job.next_stage = stage + 1
            if self.on_stage is not None:
                self.on_stage(job, stage, t0, t1)
            if stage == n or job.error is not None:
                job.done_ns = t1
                job.payload = b""
                with self.cond:
                    self.scheduler.complete(job)
                self.on_done(job)


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass


PROGRESS_S = 2.0  # at most one progress line per this many seconds


def say(text: str, error: bool = False) -> None:
    """A line on stdout (stderr for ``error``), flushed: ``logs/edge.out|err``, which the run's terminal
    follows live. Without these the service wrote only its CSV files and the terminal never showed it.
    What a peer sent (a device name) may carry terminal escapes: they are shown escaped."""
    print(f"edge: {printable(text)}", file=sys.stderr if error else sys.stdout, flush=True)


#: Refusals said on stderr per reason; later ones are only counted (a flood must not fill the disk).
REFUSALS_SAID = 10


class EdgeService:
    """The asyncio side: connections, ACKs, admission, results and the request log."""

    def __init__(
        self,
        cfg: EdgeConfig,
        model: StageModel,
        origin: Origin,
        estimates: Sequence[float],
        key: bytes | None = None,
    ) -> None:
        self.cfg = cfg
        self.key = key
        self.model = model
        self.origin = origin
        self.device_index = {d: i for i, d in enumerate(cfg.devices)}
        self.executor = Executor(
            model, Scheduler(cfg.policy, model.num_stages, estimates), self._done_threadsafe, self._stage_done
        )
        self._rounds: dict[tuple[int, int], dict[str, Job | None]] = {}
        self._seen: set[tuple[str, int, int]] = set()
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._log: TextIO | None = None
        self._csv: Any = None
        self._stage_log: TextIO | None = None
        self._stage_csv: Any = None
        self.completed = 0
        self.skips = 0
        # frames refused before anything in them was used, by reason: "unsigned" (a keyed connection
        # that did not start with a HELLO), "bad_mac" (a tag the run's key does not give), "malformed"
        self.refused: dict[str, int] = {}
        self._said_ns = 0  # when the last progress line was printed
        self._traffic = False  # a device sent its first REQUEST or SKIP (ends the profile at the start)
        self.start_profile: dict[str, Any] | None = None  # what the profile at the start instant did

    # --- executor callbacks ------------------------------------------------------------------

    def _stage_done(self, job: Job, stage: int, start_ns: int, end_ns: int) -> None:
        """Executor thread: one row of ``edge_stages.csv`` (the order stages actually ran in)."""
        if self._stage_csv is not None:
            o = self.origin.mono_ns
            with contextlib.suppress(ValueError):  # file closed after a timed-out shutdown join
                self._stage_csv.writerow(
                    [job.device, job.round, job.repetition, stage, start_ns - o, end_ns - o]
                )
                if self._stage_log is not None:
                    # Flushed per row (after end_ns was taken): collect reads it while we run.
                    self._stage_log.flush()

    def _done_threadsafe(self, job: Job) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closed during shutdown
            loop.call_soon_threadsafe(self._finish, job)

    def _finish(self, job: Job) -> None:
        if job.error is not None:
            job.reply(Error(job.error))
        else:
            queue_ns = (job.done_ns - job.release_ns) - job.remote_ns
            barrier_ns = job.release_ns - job.ack_ns
            job.reply(
                Result(
                    job.round,
                    job.repetition,
                    barrier_ns,
                    queue_ns,
                    job.remote_ns,
                    self.model.num_stages - job.point,
                    job.result,
                )
            )
            self._log_job(job, barrier_ns, queue_ns)
        job.result = b""

    def _log_job(self, job: Job, barrier_ns: int, queue_ns: int) -> None:
        self.completed += 1
        now = time.monotonic_ns()
        if now - self._said_ns >= PROGRESS_S * 1e9 or self.completed == 1:
            self._said_ns = now
            say(
                f"{self.completed} requests served (last: {job.device} round {job.round} repetition "
                f"{job.repetition}, point {job.point}, {(job.done_ns - job.release_ns) / 1e6:.2f} ms)"
            )
        if self._csv is None or self._log is None:
            return
        o = self.origin.mono_ns
        self._csv.writerow(
            [
                job.device, job.round, job.repetition, job.point, job.request_bytes,
                job.recv_start_ns - o, job.ack_ns - o, job.release_ns - o, job.done_ns - o,
                barrier_ns, queue_ns, job.remote_ns, self.model.num_stages - job.point,
            ]
        )  # fmt: skip
        self._log.flush()

    # --- admission ---------------------------------------------------------------------------

    def _release(self, jobs: Sequence[Job], now: int | None = None) -> None:
        now = time.monotonic_ns() if now is None else now
        for job in jobs:
            job.release_ns = now
        if jobs:
            self.executor.submit(jobs)

    def _admit(self, device: str, round_: int, repetition: int, job: Job | None) -> None:
        if self.cfg.admission == "immediate":
            if job is not None:
                self._release([job], now=job.ack_ns)  # released on arrival: barrier_ns = 0
            return
        key = (round_, repetition)
        batch = self._rounds.setdefault(key, {})
        batch[device] = job
        if len(batch) == len(self.cfg.devices):
            del self._rounds[key]
            self._release(sorted((j for j in batch.values() if j is not None), key=lambda j: j.device_index))

    def _check(self, device: str, round_: int, repetition: int, point: int, kind: MsgType) -> str | None:
        n = self.model.num_stages
        if device not in self.device_index:
            return f"unknown device {device!r}; this service serves {list(self.cfg.devices)}"
        if kind is MsgType.REQUEST and not 0 <= point < n:
            return f"{device}: REQUEST partition point {point} is outside 0..{n - 1} (send SKIP at {n})"
        if kind is MsgType.SKIP and point != n:
            return f"{device}: SKIP partition point {point} is not N = {n}"
        key = (device, round_, repetition)
        if key in self._seen:
            return f"{device}: duplicate message for round {round_} repetition {repetition}"
        self._seen.add(key)
        return None

    # --- connections -------------------------------------------------------------------------

    def _refuse(self, reason: str, peer: str, detail: str, device: str | None = None) -> None:
        """Count a refused frame (``edge_summary.json``) and say so, up to :data:`REFUSALS_SAID` per reason."""
        count = self.refused[reason] = self.refused.get(reason, 0) + 1
        if count > REFUSALS_SAID:
            return
        claimed = f" claiming device '{device}'" if device is not None else ""
        more = f" (further {reason} refusals are only counted)" if count == REFUSALS_SAID else ""
        say(f"refused a frame from {peer}{claimed}: {detail}; connection dropped{more}", error=True)

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes, peer: str
    ) -> Session | None:
        """A keyed connection starts with the device's HELLO, answered with ours: the session, or None
        (refused: the first frame was something else, which is neither used nor answered)."""
        head = await read_header(reader, self.cfg.max_frame_bytes)
        if head is None:
            return None
        msg = await read_body(reader, *head)
        if not isinstance(msg, Hello):
            device = msg.device if isinstance(msg, Request | Skip) else None
            self._refuse("unsigned", peer, f"a {head[0].name} before the HELLO (unsigned)", device)
            return None
        nonce = os.urandom(NONCE_BYTES)
        writer.writelines(encode_parts(Hello(nonce)))
        await writer.drain()
        return Session(key, msg.nonce, nonce, edge=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        max_frame = self.cfg.max_frame_bytes
        address = writer.get_extra_info("peername")
        peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        session: Session | None = None

        def reply(msg: Message) -> None:
            if not writer.is_closing():
                writer.writelines(encode_parts(msg, max_frame, session))

        try:
            if self.key is not None:
                session = await self._handshake(reader, writer, self.key, peer)
                if session is None:
                    return
            while True:
                head = await read_header(reader, max_frame)
                if head is None:
                    break
                recv_start = time.monotonic_ns()
                msg = await read_body(reader, *head, session)
                ack_ns = time.monotonic_ns()
                if isinstance(msg, Request | Skip):
                    # only a frame that verified ends the profile at the start instant
                    self._traffic = True
                    problem = self._check(msg.device, msg.round, msg.repetition, msg.partition_point, head[0])
                    if problem is not None:
                        say(f"refused a {head[0].name} from {msg.device}: {problem}", error=True)
                        reply(Error(problem))
                        await writer.drain()
                        continue
                    reply(Ack(msg.round, msg.repetition, head[0]))
                    job = None
                    if isinstance(msg, Request):
                        job = Job(
                            device=msg.device,
                            device_index=self.device_index[msg.device],
                            round=msg.round,
                            repetition=msg.repetition,
                            point=msg.partition_point,
                            payload=msg.payload,
                            recv_start_ns=recv_start,
                            ack_ns=ack_ns,
                            seq=self._seq,
                            reply=reply,
                            request_bytes=len(msg.payload),
                        )
                        self._seq += 1
                    else:
                        self.skips += 1
                    self._admit(msg.device, msg.round, msg.repetition, job)
                    await writer.drain()
                else:
                    keyless = isinstance(msg, Hello) and self.key is None
                    reply(Error("this edge service has no key (its config has no key_file)" if keyless
                                else f"unexpected {head[0].name} frame from a device"))  # fmt: skip
                    await writer.drain()
                    break
        except AuthError as exc:
            self._refuse("bad_mac", peer, str(exc), exc.device)
        except ProtocolError as exc:
            self._refuse("malformed", peer, f"protocol error: {exc}")
            # Answer, half-close, and discard what the peer still sends (briefly), so that closing
            # with unread input does not reset the connection before the ERROR frame is read.
            with contextlib.suppress(ConnectionError, OSError, TimeoutError):
                reply(Error(f"protocol error: {exc}"))
                await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()
                await asyncio.wait_for(_discard(reader), timeout=2.0)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _profile_at_start(self, path: Path, stop: asyncio.Event) -> None:
        """Profile the capacity again from the run's common start instant, beside the devices' own
        layer profiles, until the first REQUEST or SKIP arrives, or ``profile.min_seconds`` pass with
        ``profile.repetitions`` done.

        The profile at service start (apply) sees the devices idle but for their load; during the
        inference their CPUs compute, and in local mode and on the emulated rack the edge shares the
        machine with them (docs/protocol.md). This one replaces it, for SJF's estimates and in
        ``layers.csv`` (the first moves to ``layers_startup.csv``), when it completed at least
        ``profile.repetitions`` repetitions; ``edge_summary.json`` says which (``start_profile``)."""
        try:
            start_at = read_start_file(path)
            while start_at is None and not stop.is_set() and not self._traffic:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), START_FILE_POLL_S)
                start_at = read_start_file(path)
        except ConfigError as exc:
            say(f"no capacity profile at the start instant: {exc}", error=True)
            self.start_profile = {"used": False, "reason": str(exc)}
            return
        if start_at is None:
            return  # stopped, or devices came without a start instant (a profile stage of old)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, (start_at - time.time_ns()) / 1e9))
        if stop.is_set() or self._traffic:
            why = "stopped" if stop.is_set() else "a request came"
            self.start_profile = {"used": False, "reason": f"{why} before the start instant"}
            return
        try:
            await self._profile_from(start_at, stop)
        except Exception as exc:  # the start-up profile stays; the service goes on serving
            say(f"capacity profile at the start instant failed: {type(exc).__name__}: {exc}", error=True)
            self.start_profile = {"used": False, "reason": f"{type(exc).__name__}: {exc}"}

    async def _profile_from(self, start_at: int, stop: asyncio.Event) -> None:
        cfg = self.cfg
        least = cfg.profile_repetitions or 1
        deadline = time.monotonic_ns() + int(max(cfg.profile_min_s, 0.0) * 1e9)
        # No sizing passes here (capacity_repetitions times two on this, the event loop's, thread: ACKs
        # would wait for them); ``ended`` bounds it, and the passes make their inputs one at a time.
        reps = max(least, MAX_CAPACITY_REPETITIONS)
        asked = [0]  # repetitions done: the profiler asks before each one

        def ended() -> bool:
            done, asked[0] = asked[0], asked[0] + 1
            # min_seconds ends it only once it has its repetitions (a slow model); a request always does
            return self._traffic or stop.is_set() or (time.monotonic_ns() >= deadline and done >= least)

        t0 = time.monotonic_ns()
        result = await asyncio.to_thread(
            profile_model, self.model, repetitions=reps, origin_mono_ns=self.origin.mono_ns, stop=ended
        )
        took_ns = time.monotonic_ns() - t0
        done = result.repetitions
        by = "request" if self._traffic else ("stop" if stop.is_set() else "min_seconds")
        info: dict[str, Any] = {
            "start_at_ns": start_at,
            "repetitions": done,
            "duration_ns": took_ns,
            "ended_by": by,
        }
        if done < least:
            self.start_profile = info | {"used": False, "reason": f"only {done} repetitions (ended by {by})"}
            say(
                f"capacity profile at the start instant: {done} repetitions, too few; the start-up profile stays"
            )
            return
        results = cfg.results_dir
        with contextlib.suppress(FileNotFoundError):
            os.replace(results / "layers.csv", results / "layers_startup.csv")
        with contextlib.suppress(FileNotFoundError):
            os.replace(results / "profile_summary.json", results / "profile_summary_startup.json")
        write_layers_csv(results / "layers.csv", result)
        write_json(
            results / "profile_summary.json",
            result.summary()
            | {"min_seconds": cfg.profile_min_s, "duration_ns": took_ns, "taken": "start_instant"},
        )
        self.executor.set_estimates(result.mean_latency_ns())
        self.start_profile = info | {"used": True}
        say(f"capacity profile at the start instant: {done} repetitions in {took_ns / 1e9:.2f} s ({by})")

    async def serve(self, stop: asyncio.Event) -> None:
        """Listen, write the ready file, serve until ``stop`` is set, then flush and close."""
        self._loop = asyncio.get_running_loop()
        cfg = self.cfg
        port = cfg.port
        self._log = open(cfg.results_dir / "edge_requests.csv", "w", newline="", encoding="utf-8")  # noqa: SIM115
        self._csv = csv.writer(self._log)
        self._csv.writerow(EDGE_REQUEST_COLUMNS)
        self._log.flush()
        self._stage_log = open(cfg.results_dir / "edge_stages.csv", "w", newline="", encoding="utf-8")  # noqa: SIM115
        self._stage_csv = csv.writer(self._stage_log)
        self._stage_csv.writerow(EDGE_STAGE_COLUMNS)
        self._stage_log.flush()
        self.executor.start()
        server: asyncio.Server | None = None
        try:
            server = await asyncio.start_server(self._handle, host=cfg.bind, port=cfg.port, limit=1 << 20)
            port = int(server.sockets[0].getsockname()[1])
            ready = {
                "port": port,
                "pid": os.getpid(),
                "origin_wall_ns": self.origin.wall_ns,
                "origin_mono_ns": self.origin.mono_ns,
                "host": cfg.host,
                "run_id": cfg.run_id,
                "policy": cfg.policy,
                "admission": cfg.admission,
            }
            write_json(cfg.ready_file, ready)
            say(
                f"listening on {cfg.bind}:{port} · policy {cfg.policy} · admission {cfg.admission} · "
                f"model {self.model.name} ({self.model.num_stages} stages) · devices {', '.join(cfg.devices)}"
                + (
                    " · frames signed with the run's key"
                    if self.key is not None
                    else " · NO KEY: frames unsigned"
                )
            )
            profiling = None
            if cfg.start_at_file is not None and cfg.profile_repetitions is not None:
                profiling = asyncio.create_task(self._profile_at_start(cfg.start_at_file, stop))
            await stop.wait()
            say("stopping")
            if profiling is not None:
                await profiling  # it polls ``stop`` (or ends its last repetition)
        finally:
            if server is not None:
                server.close()
            for w in list(self._writers):
                w.close()
            self.executor.stop()
            await asyncio.to_thread(self.executor.join, 30.0)
            await asyncio.sleep(0)  # deliver and log results finished just before the stop
            self._log.close()
            self._log = None
            self._stage_log.close()
            write_json(
                cfg.results_dir / "edge_summary.json",
                {
                    "run_id": cfg.run_id,
                    "host": cfg.host,
                    "port": port,
                    "policy": cfg.policy,
                    "admission": cfg.admission,
                    "devices": list(cfg.devices),
                    "model": self.model.name,
                    "stages": self.model.num_stages,
                    "completed_requests": self.completed,
                    "skips": self.skips,
                    "authenticated": self.key is not None,
                    "refused_frames": sum(self.refused.values()),
                    "refused": dict(sorted(self.refused.items())),
                    "unfinished_rounds": [list(k) for k in sorted(self._rounds)],
                    "start_profile": self.start_profile,
                    "stopped_wall_ns": time.time_ns(),
                },
            )
            refused = sum(self.refused.values())
            say(
                f"stopped · {self.completed} requests served, {self.skips} skips, {len(self._rounds)} unfinished rounds"
                + (f", {refused} frame{'s' if refused != 1 else ''} refused" if refused else "")
            )


MAX_CAPACITY_REPETITIONS = 1000
START_FILE_POLL_S = 0.05  # how often the service looks for the start-at file (idle, before the run)


def capacity_repetitions(model: StageModel, repetitions: int, min_s: float) -> int:
    """Repetitions for the capacity profile: at least ``repetitions``, and enough to last ``min_s``.

    The profile costs about two passes per repetition (the timing pass and the stage-by-stage pass);
    the faster of two passes of all stages timed here (the first one is cold: it would make too few)
    sizes them, capped at :data:`MAX_CAPACITY_REPETITIONS`. A few repetitions of a fast model last a
    fraction of a second, a sample of whatever ran on the machine in that instant; in local mode and on
    the emulated rack the edge's speed depends on what the devices' CPUs are doing (docs/protocol.md)."""
    if min_s <= 0:
        return repetitions
    passes: list[int] = []
    for _ in range(2):
        x = model.make_input()
        t0 = time.monotonic_ns()
        for stage in range(1, model.num_stages + 1):
            x = model.run_stage(stage, x)
        passes.append(time.monotonic_ns() - t0)
    pass_s = max(min(passes) / 1e9, 1e-6)
    return max(repetitions, min(MAX_CAPACITY_REPETITIONS, math.ceil(min_s / (2 * pass_s))))


def run_edge(cfg_dict: Mapping[str, Any]) -> int:
    """Entry point of ``python -m dit.device edge``: runs until SIGTERM/SIGINT, then returns 0."""
    cfg = EdgeConfig.from_dict(cfg_dict)
    try:
        key = read_key(cfg.key_file) if cfg.key_file is not None else None
    except ProtocolError as exc:
        raise ConfigError(f"key_file: {exc}") from None
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    if cfg.run_id:
        os.environ.setdefault(RUN_ENV, cfg.run_id)
    sys.setswitchinterval(0.0005)  # hand the GIL to the network thread quickly while computing
    origin = Origin.now()
    model = build_model(cfg.model)
    estimates: list[float] = [0.0] + [float(model.ops(s)) for s in range(1, model.num_stages + 1)]
    profile_info: dict[str, Any] | None = None
    if cfg.profile_repetitions is not None:
        reps = capacity_repetitions(model, cfg.profile_repetitions, cfg.profile_min_s)
        t0 = time.monotonic_ns()
        result = profile_model(
            model, repetitions=reps, warmup=cfg.profile_warmup, origin_mono_ns=origin.mono_ns
        )
        took_ns = time.monotonic_ns() - t0
        write_layers_csv(cfg.results_dir / "layers.csv", result)
        say(
            f"capacity profile of {model.name}: {model.num_stages} stages, {reps} repetitions in {took_ns / 1e9:.2f} s"
        )
        profile_info = result.summary() | {
            "min_seconds": cfg.profile_min_s,
            "duration_ns": took_ns,
            "taken": "service_start",
        }
        write_json(cfg.results_dir / "profile_summary.json", profile_info)
        estimates = result.mean_latency_ns()
    write_json(
        cfg.results_dir / "origin.json",
        {
            "host": cfg.host,
            "run_id": cfg.run_id,
            "origin_wall_ns": origin.wall_ns,
            "origin_mono_ns": origin.mono_ns,
            "workload_estimate": "capacity_profile_mean_latency_ns" if profile_info else "ops",
        },
    )
    service = EdgeService(cfg, model, origin, estimates, key)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await service.serve(stop)

    asyncio.run(main())
    return 0
