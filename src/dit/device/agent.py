"""The device entry point: ``python -m dit.device <command> --config FILE`` (stdlib only).

Commands: ``edge`` (the edge inference service, see :mod:`dit.device.edge`) and ``profile``
(timed start, layer-by-layer profile, partitioned inference). The agent never forks or
daemonises; the caller starts it in its own session with ``DIT_RUN_ID`` in the environment
(set from the config's ``run_id`` when absent, so any child process inherits it).

Exit codes: 0 success, 1 runtime failure, 2 bad command line or config, 3 partition
equivalence mismatch. On failure after the results directory exists, ``error.json`` says why.
With ``DIT_STATUS_FILE`` in the environment the agent also keeps a status record there (running, then
the exit code): see :class:`StatusFile`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from dit.device.adapter import GeneratesTokens, StageModel, load_ref
from dit.device.client import (
    EdgeConnection,
    EquivalenceError,
    InferenceRecord,
    reference_output,
    run_inference,
    write_inference_csv,
)
from dit.device.common import (
    ConfigError,
    Origin,
    build_model,
    read_config,
    read_start_file,
    require,
    write_json,
)
from dit.device.edge import run_edge
from dit.device.link_emulator import run_link_emulator
from dit.device.load import run_load
from dit.device.monitor import run_monitor
from dit.device.netem_vary import run_netem_vary
from dit.device.power import run_power
from dit.device.profiler import profile_model, write_layers_csv
from dit.device.protocol import ProtocolError, read_key
from dit.device.seeding import seed_from_env
from dit.device.tags import (  # set by dit_proc / dit_launch on every tagged process
    HOST_ENV,
    PREPARED_FILE_ENV,
    RUN_ENV,
    START_AT_ENV,
    START_AT_FILE_ENV,
    START_WAIT_TIMEOUT_ENV,
    TAG_ENV,
)
from dit.device.threads import effective as effective_threads

STATUS_ENV = "DIT_STATUS_FILE"  # where the process keeps its status record (see StatusFile)

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_EQUIVALENCE = 0, 1, 2, 3
SPIN_NS = 2_000_000  # the last ~2 ms before the start instant are a busy wait
FIFO_PRIORITY = 10  # above every SCHED_OTHER task, below the kernel's own RT threads (50+)
# The two-phase start: how often the start-at file is looked for (the lead is a second or more, so a few
# ms of polling delay cost nothing), and how long at most when the environment does not say.
START_FILE_POLL_S = 0.005
START_WAIT_TIMEOUT_S = 3600.0
THREAD_ENV = (
    "DIT_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)


CLOCK_REALTIME, TIMER_ABSTIME, EINTR = 0, 1, 4  # <time.h>, <errno.h> (Linux)
ABSOLUTE_WAIT = "clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME)"
RELATIVE_WAIT = "time.sleep"
NO_WAIT = "none (reached the instant late or within the spin)"


def _absolute_sleeper() -> Callable[[int], bool] | None:
    """``sleep(until_wall_ns) -> bool``: one ``clock_nanosleep`` on the wall clock with ``TIMER_ABSTIME``
    (libc through ctypes, stdlib only), so that no time passes between reading the clock and
    sleeping; None where libc has no such call."""
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).clock_nanosleep
    except (OSError, AttributeError, ImportError):
        return None

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(Timespec), ctypes.c_void_p]
    call.restype = ctypes.c_int

    def sleep(until_ns: int) -> bool:
        target = Timespec(until_ns // 1_000_000_000, until_ns % 1_000_000_000)
        while True:
            error = int(call(CLOCK_REALTIME, TIMER_ABSTIME, ctypes.byref(target), None))
            if error != EINTR:  # clock_nanosleep returns the error number itself
                return error == 0

    return sleep


def sleep_until(
    start_at_ns: int,
    clock: Callable[[], int] = time.time_ns,
    absolute: Callable[[int], bool] | bool | None = True,
) -> str:
    """Sleep until the wall clock reaches ``start_at_ns``: an absolute-clock sleep to ``SPIN_NS``
    before it, then a busy spin to the instant. Returns how it slept (recorded with the start).

    ``absolute`` is a sleeper (tests), True for libc's ``clock_nanosleep`` on the real wall clock
    (only with ``clock=time.time_ns``: its clock is the one slept on), or False; without one the
    coarse part is relative ``time.sleep`` calls, re-read against the clock until the spin.
    """
    sleeper = absolute if callable(absolute) else None
    if absolute is True and clock is time.time_ns:
        sleeper = _absolute_sleeper()
    ahead = start_at_ns - clock() > SPIN_NS
    method = RELATIVE_WAIT if ahead else NO_WAIT  # reached within the spin or late: nothing to sleep
    if sleeper is not None and ahead and sleeper(start_at_ns - SPIN_NS):
        method = ABSOLUTE_WAIT
    while True:  # the fallback, and a safety net if the absolute sleep came back early
        remaining = start_at_ns - clock()
        if remaining <= SPIN_NS:
            break
        time.sleep((remaining - SPIN_NS) / 1e9)
    while clock() < start_at_ns:
        pass
    return method


def wait_for_start_file(
    path: Path,
    timeout_s: float,
    poll_s: float = START_FILE_POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait until ``path`` appears and return its start instant; ``TimeoutError`` naming the file after
    ``timeout_s`` (the profile stage writes it once every node is prepared, or never when one failed)."""
    deadline = clock() + timeout_s
    while True:
        start_at = read_start_file(path)
        if start_at is not None:
            return start_at
        if clock() >= deadline:
            raise TimeoutError(
                f"no start instant: {path} did not appear within {timeout_s:g} s of this process being "
                "prepared (the profile stage writes it once every node is prepared)"
            )
        sleep(poll_s)


def _start_wait_timeout_s() -> float:
    raw = os.environ.get(START_WAIT_TIMEOUT_ENV)
    if not raw:
        return START_WAIT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ConfigError(f"{START_WAIT_TIMEOUT_ENV}: {raw!r} is not a positive number of seconds")
    return value


@contextlib.contextmanager
def start_priority(system: Any = os) -> Iterator[dict[str, Any]]:
    """Wait for the start instant at SCHED_FIFO where permitted, then drop back to the prior policy.

    The raised priority keeps the other work of the board off the CPU during the final spin; the
    profile itself runs at the prior policy so its timings are not those of a real-time task. Yields
    what was used (recorded in ``origin.json`` as ``start_sched``): SCHED_FIFO needs root and, in a
    cgroup v1 ``cpu`` group, an RT budget (``cpu.rt_runtime_us``); without them ``detail`` says why.
    """
    used: dict[str, Any] = {"policy": "SCHED_OTHER", "priority": 0, "detail": ""}
    if not hasattr(system, "sched_setscheduler"):
        used["detail"] = "no sched_setscheduler on this platform"
        yield used
        return
    if system.geteuid() != 0:
        used["detail"] = "not root"
        yield used
        return
    prior_policy, prior_param = system.sched_getscheduler(0), system.sched_getparam(0)
    try:
        system.sched_setscheduler(0, system.SCHED_FIFO, system.sched_param(FIFO_PRIORITY))
    except OSError as exc:
        used["detail"] = f"sched_setscheduler: {exc.strerror or exc}"
        yield used
        return
    used.update(policy="SCHED_FIFO", priority=FIFO_PRIORITY)
    try:
        yield used
    finally:
        system.sched_setscheduler(0, prior_policy, prior_param)


def _int(cfg: Mapping[str, Any], key: str, where: str, default: int | None = None, minimum: int = 0) -> int:
    if key not in cfg and default is not None:
        return default
    value: int = require(cfg, key, int, where)
    if value < minimum:
        path = f"{where}.{key}" if where else key
        raise ConfigError(f"{path}: {value} is less than {minimum}")
    return value


def say(text: str) -> None:
    """A progress line on stdout (``logs/<tag>.out``, which the run's terminal follows live)."""
    print(text, flush=True)


class _Announced:
    """The model, saying which profiling pass starts (each pass begins with ``make_input``)."""

    def __init__(self, model: StageModel, warmup: int, repetitions: int) -> None:
        self._model = model
        self._warmup = warmup
        self._repetitions = repetitions
        self._passes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def make_input(self) -> Any:
        self._passes += 1
        if self._passes <= self._warmup:
            say(f"profiling warm-up {self._passes}/{self._warmup}")
        else:
            say(f"profiling repetition {self._passes - self._warmup}/{self._repetitions}")
        return self._model.make_input()


def _on_record(
    rec: InferenceRecord, records: list[InferenceRecord], vectors: Sequence[Sequence[int]], reps: int
) -> None:
    records.append(rec)
    if rec.repetition == reps - 1:
        vector = list(vectors[rec.round]) if rec.round < len(vectors) else []
        say(f"round {rec.round + 1}/{len(vectors)} vector {vector} done ({reps} inferences)")


def generate_tokens(
    model: GeneratesTokens, tokens: int, repetitions: int, warmup: int, origin_mono_ns: int, results: Path
) -> dict[str, Any]:
    """A decoder's token generation (``tokens`` > 0), profiled by the model's own profiler (it needs
    the framework, which the device code does not import): ``tokens.csv`` and ``heads.csv``."""
    profile = load_ref(model.generation_profiler, "generation profiler")
    record: dict[str, Any] = profile(
        model,
        tokens=tokens,
        repetitions=repetitions,
        warmup=warmup,
        origin_mono_ns=origin_mono_ns,
        results=results,
        say=say,
    )
    return record


def run_profile(cfg: Mapping[str, Any]) -> int:
    """The ``profile`` command (see ``docs/protocol.md`` for the config and the files written)."""
    run_id = str(require(cfg, "run_id", str))
    host = str(require(cfg, "host", str))
    results = Path(require(cfg, "results_dir", str))
    spec = require(cfg, "model", dict)
    repetitions = _int(cfg, "repetitions", "", default=1)
    warmup = _int(cfg, "warmup", "", default=0)
    start_at = cfg.get("start_at_ns")
    start_from = "config" if start_at is not None else None
    # The two-phase start (the profile stage's prepared main processes): the instant is picked once
    # every node is prepared, so it comes from a file written later, not from the environment.
    start_file = os.environ.get(START_AT_FILE_ENV) or None
    prepared_file = os.environ.get(PREPARED_FILE_ENV) or None
    if start_file is not None:
        if start_at is not None:
            raise ConfigError(f"start_at_ns: given, but {START_AT_FILE_ENV} says the instant comes later")
        if prepared_file is None:
            raise ConfigError(f"{PREPARED_FILE_ENV}: not set, but {START_AT_FILE_ENV} is")
        start_from = "file"
    elif start_at is None and os.environ.get(START_AT_ENV):  # the profile stage's common instant
        try:
            start_at = int(os.environ[START_AT_ENV])
        except ValueError:
            raise ConfigError(f"{START_AT_ENV}: {os.environ[START_AT_ENV]!r} is not an integer") from None
        start_from = "environment"
    if start_at is not None and (isinstance(start_at, bool) or not isinstance(start_at, int)):
        raise ConfigError(f"start_at_ns: {start_at!r} is not an integer (time.time_ns epoch) or null")
    start_wait_timeout_s = _start_wait_timeout_s()
    threads = cfg.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads: {threads!r} is not a positive integer or null")
    sample_ms = cfg.get("cpu_sample_interval_ms", 2.0)
    if isinstance(sample_ms, bool) or not isinstance(sample_ms, int | float) or not 0 <= sample_ms <= 1000:
        raise ConfigError(f"cpu_sample_interval_ms: {sample_ms!r} is not a number in 0..1000")
    inf: Mapping[str, Any] = cfg.get("inference") or {"enabled": False}
    inf_enabled = bool(inf.get("enabled", False))
    tokens = _int(cfg, "tokens", "", default=0)

    results.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(RUN_ENV, run_id)
    if threads is not None:
        for name in THREAD_ENV:
            os.environ[name] = str(threads)

    model = build_model(spec)
    n = model.num_stages
    if tokens and not isinstance(model, GeneratesTokens):
        raise ConfigError(
            f"tokens: {tokens} tokens need a decoder model (gpt2, tinyllama, hf_decoder, smollm2-135m), "
            f"not {model.name}"
        )

    vectors: list[list[int]] = []
    device_index = 0
    inf_reps = 0
    tolerance: float | None = None
    conn: EdgeConnection | None = None
    if inf_enabled:
        raw_vectors = require(inf, "vectors", list, "inference")
        device_index = _int(inf, "device_index", "inference")
        inf_reps = _int(inf, "repetitions", "inference", default=1)
        for r, vec in enumerate(raw_vectors):
            if not isinstance(vec, list) or device_index >= len(vec):
                raise ConfigError(f"inference.vectors[{r}]: {vec!r} has no position {device_index}")
            p = vec[device_index]
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= n:
                raise ConfigError(f"inference.vectors[{r}][{device_index}]: {p!r} is outside 0..{n}")
            vectors.append([int(v) for v in vec])
        eq: Mapping[str, Any] = inf.get("equivalence") or {}
        if eq.get("enabled", False):
            tol = eq.get("tolerance", 0.0)
            if isinstance(tol, bool) or not isinstance(tol, int | float) or tol < 0:
                raise ConfigError(f"inference.equivalence.tolerance: {tol!r} is not a number >= 0")
            tolerance = float(tol)
        edge = require(inf, "edge", dict, "inference")
        key_file = edge.get("key_file")
        if key_file is not None and (not isinstance(key_file, str) or not key_file):
            raise ConfigError(f"inference.edge.key_file: {key_file!r} must be a path or null")
        try:
            key = read_key(key_file) if key_file else None
        except ProtocolError as exc:
            raise ConfigError(f"inference.edge.key_file: {exc}") from None
        conn = EdgeConnection(
            str(require(edge, "host", str, "inference.edge")),
            _int(edge, "port", "inference.edge", minimum=1),
            connect_timeout_s=float(inf.get("connect_timeout_s", 30.0)),
            timeout_s=float(inf.get("timeout_s", 600.0)),
            source=str(edge.get("source") or "") or None,
            key=key,
        )

    reference = reference_output(model) if tolerance is not None else None
    if conn is not None:
        conn.connect()  # before the start instant: connection setup is not an inference phase

    prepared_wall_ns = time.time_ns()  # everything before the instant is done
    if start_file is not None and prepared_file is not None:
        write_json(
            Path(prepared_file), {"prepared_wall_ns": prepared_wall_ns, "pid": os.getpid(), "host": host}
        )
        say("prepared: waiting for the common start instant")
        start_at = wait_for_start_file(Path(start_file), start_wait_timeout_s)
    # How long the node waited, prepared, for the instant (negative: it was still preparing when the
    # instant passed, which the two-phase start exists to prevent).
    prepared_to_start = start_at - prepared_wall_ns if start_at is not None else None

    with start_priority() as start_sched:
        if start_at is not None:
            start_sched["wait"] = sleep_until(start_at)
            start_sched["spin_ns"] = SPIN_NS
        origin = Origin.now()
    start_sched["start_from"] = start_from
    start_sched["prepared_to_start_ns"] = prepared_to_start
    lateness = origin.wall_ns - start_at if start_at is not None else 0
    origin_doc = {
        "host": host,
        "run_id": run_id,
        "start_at_ns": start_at,
        "origin_wall_ns": origin.wall_ns,
        "origin_mono_ns": origin.mono_ns,
        "lateness_ns": lateness,
        "prepared_wall_ns": prepared_wall_ns,
        "prepared_to_start_ns": prepared_to_start,
        "start_sched": start_sched,
    }
    write_json(results / "origin.json", origin_doc)

    say(f"profiling {model.name}: {n} stages, {repetitions} repetitions after {warmup} warm-up")
    announced = cast(StageModel, _Announced(model, warmup, repetitions))
    prof = profile_model(
        announced,
        repetitions=repetitions,
        warmup=warmup,
        origin_mono_ns=origin.mono_ns,
        cpu_sample_interval_ns=round(sample_ms * 1e6),
    )
    say(f"profiling done: {len(prof.records)} stage records")
    write_layers_csv(results / "layers.csv", prof)
    prof_summary = prof.summary()
    write_json(results / "profile_summary.json", prof_summary)

    records: list[InferenceRecord] = []
    inference_summary: dict[str, Any] = {"enabled": inf_enabled}
    if inf_enabled:
        try:
            run_inference(
                model,
                conn,
                device=host,
                vectors=vectors,
                device_index=device_index,
                repetitions=inf_reps,
                origin_mono_ns=origin.mono_ns,
                reference=reference,
                tolerance=tolerance,
                on_record=lambda rec: _on_record(rec, records, vectors, inf_reps),
            )
        finally:
            write_inference_csv(results / "inference.csv", records)
            if conn is not None:
                conn.close()
        diffs = [r.max_abs_diff for r in records if r.max_abs_diff is not None]
        inference_summary.update(
            {
                "records": len(records),
                "vectors": len(vectors),
                "repetitions": inf_reps,
                "device_index": device_index,
                "equivalence": {
                    "enabled": tolerance is not None,
                    "tolerance": tolerance,
                    "max_abs_diff": max(diffs) if diffs else None,
                },
            }
        )

    generation: dict[str, Any] = {}
    if tokens:
        assert isinstance(model, GeneratesTokens)  # refused above otherwise
        generation = generate_tokens(model, tokens, repetitions, warmup, origin.mono_ns, results)

    write_json(
        results / "done.json",
        {
            "status": "ok",
            "host": host,
            "run_id": run_id,
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "threads": threads,
            "threads_effective": effective_threads(),
            "origin": origin_doc,
            "model": {"name": model.name, "stages": n},
            "profile": {
                "warmup": warmup,
                "repetitions": repetitions,
                "peak_mem_method": prof.peak_mem_method,
                "forward_mean_ns": prof_summary["forward_mean_ns"],
            },
            "inference": inference_summary,
            **({"generation": generation} if tokens else {}),
            "finished_wall_ns": time.time_ns(),
            "elapsed_ns": time.monotonic_ns() - origin.mono_ns,
        },
    )
    return EXIT_OK


COMMANDS: dict[str, Callable[[Mapping[str, Any]], int]] = {
    "edge": run_edge,
    "link-emulator": run_link_emulator,
    "load": run_load,
    "monitor": run_monitor,
    "netem-vary": run_netem_vary,
    "power": run_power,
    "profile": run_profile,
}


def _write_error(cfg: Mapping[str, Any] | None, kind: str, exc: BaseException) -> None:
    if not cfg or not isinstance(cfg.get("results_dir"), str):
        return
    with contextlib.suppress(OSError):
        write_json(
            Path(cfg["results_dir"]) / "error.json",
            {
                "status": "error",
                "kind": kind,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exception(exc),
                "wall_ns": time.time_ns(),
            },
        )


class StatusFile:
    """The process's own status record, at the path ``$DIT_STATUS_FILE`` names (none without it).

    Written atomically when the command starts (``state: running``, with the pid) and again when it ends
    (``state: exited``, the exit code and the error if any). ``dit_proc`` sets the variable for every
    tagged process (``logs/<tag>.status.json`` in the node's run root); ``dit_collect`` reads the records
    before teardown: an exit code other than 0, or a ``running`` record whose process is gone (killed by a
    signal), degrades the run (``docs/raw-results.md``). SIGTERM from teardown is a clean stop (exit 0).
    """

    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.record: dict[str, Any] = {
            "command": command,
            "tag": os.environ.get(TAG_ENV, ""),
            "host": os.environ.get(HOST_ENV, ""),
            "run_id": os.environ.get(RUN_ENV, ""),
            "pid": os.getpid(),
            "started_wall_ns": time.time_ns(),
        }

    @classmethod
    def from_env(cls, argv: Sequence[str]) -> StatusFile | None:
        path = os.environ.get(STATUS_ENV)
        return cls(Path(path), argv[0] if argv else "") if path else None

    def _write(self, **fields: Any) -> None:
        self.record.update(fields)
        with contextlib.suppress(OSError):  # a status that cannot be written must not fail the command
            write_json(self.path, self.record)

    def running(self) -> None:
        self._write(state="running", exit_code=None, error=None)

    def exited(self, code: int, error: str | None) -> None:
        self._write(state="exited", exit_code=code, error=error, ended_wall_ns=time.time_ns())


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    status = StatusFile.from_env(args_list)
    if status is not None:
        status.running()
    code = EXIT_FAILURE
    error: str | None = "ended by an exception the agent does not handle"
    try:
        code, error = _main(args_list)
    except SystemExit as exc:  # argparse: bad command line
        code = exc.code if isinstance(exc.code, int) else EXIT_CONFIG
        error = "bad command line" if code else None
        raise
    finally:
        if status is not None:
            status.exited(code, error)
    return code


def _main(argv: Sequence[str]) -> tuple[int, str | None]:
    """Run one command: ``(exit code, error message or None)``; the message also goes to stderr."""
    parser = argparse.ArgumentParser(prog="dit-device", description="dit device-side commands (stdlib only)")
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("--config", required=True, type=Path, help="JSON config file")
    args = parser.parse_args(argv)
    cfg: Mapping[str, Any] | None = None
    try:
        cfg = read_config(args.config)
        seed_from_env()  # $DIT_SEED: random now, numpy / tensorflow / torch when first imported
        code = COMMANDS[args.command](cfg)
        return code, None if code == EXIT_OK else f"{args.command} returned exit code {code}"
    except ConfigError as exc:
        error = f"config error: {exc}"
        _write_error(cfg, "config", exc)
        code = EXIT_CONFIG
    except EquivalenceError as exc:
        error = str(exc)
        _write_error(cfg, "equivalence", exc)
        code = EXIT_EQUIVALENCE
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        _write_error(cfg, "failure", exc)
        code = EXIT_FAILURE
    print(f"dit-device {args.command}: {error}", file=sys.stderr)
    return code, error
