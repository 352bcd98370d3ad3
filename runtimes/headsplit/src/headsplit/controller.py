"""The controller process: ``python -m headsplit.controller --config headsplit.json``.

Rank 0 of the RPC group (it hosts the rendezvous), it measures every worker (10 RTT samples, a matmul
FLOP/s benchmark, its decode steps of the run's units, its memory limit) one at a time, places the
units (costed by those steps, or by the rates of a profile run when ``placement_profile`` names its
costs file: headsplit.profile_costs), has every worker materialise its share at once, runs the engine,
writes the results file and shuts the group down.
Exit 0 also for an out-of-memory outcome; 1 when generation failed (the results file then has
``error``); 2 for a bad config.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from headsplit import engine, model
from headsplit.config import CONTROLS, DEFAULT_TAU, ModelConfig, preset
from headsplit.profile_costs import RULE, ProfileCosts, costs_from_document
from headsplit.units import Unit

_T = TypeVar("_T")

STRATEGIES = ("layerwise", "roundrobin", "greedy")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class WorkerEntry:
    rank: int
    name: str
    host: str
    address: str
    memory_limit_bytes: int
    # the device's own address to listen on instead (local mode: its loopback address 127.A.B.C)
    source_address: str | None = None
    # where the worker's supervisor writes how it ended (headsplit.worker), when this node can read it
    # (local mode: one machine); None: the note stays on the worker's node (its results/)
    exit_note: str | None = None


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    checkpoint: dict[str, Any] | None  # path, sha256; shards: {worker: {path, sha256}} (per-worker files)
    controller_host: str
    address: str
    port: int
    workers: tuple[WorkerEntry, ...]
    strategy: str
    speculation: bool
    tau: float
    speculation_profile: str | None
    tokens: int
    prompt: str
    memory_threshold: float
    rpc_timeout_s: float
    rpc_retries: int
    threads: int
    result: str
    placement: dict[str, str] | None  # explicit unit key -> worker (overrides strategy)
    replacement: bool  # False: a static placement (no re-placement when memory runs short)
    plan_tokens: int | None  # context the first placement must fit (None: prompt + tokens)
    # emulated memory pressure: {replace_at, full_at} (headsplit.memory.squeeze); None: the real limits
    memory_pressure: dict[str, int] | None = None
    # the prompt in the model's own tokens (tokenized where dit runs); None: byte-level tokens of prompt
    prompt_ids: tuple[int, ...] | None = None
    # after the generation, the teacher-forced perplexity of this paragraph: {text, ids (the model's own
    # tokens, or None: byte-level tokens of text)}; None: no perplexity pass
    perplexity: dict[str, Any] | None = None
    # the controller's node's own address when it is a device (local mode: its loopback address)
    source_address: str | None = None
    # the placement's per-unit costs measured by a profile run (the file headsplit.json's
    # placement_profile names, read at load); None: the start-up micro-benchmark's flops_per_s
    placement_costs: ProfileCosts | None = None
    # "dataflow": the workers push to each other, one start message per token; "rpc": the controller
    # calls every stage (headsplit.dataflow)
    control: str = "dataflow"

    @property
    def rendezvous(self) -> str:
        """Where the controller's rendezvous listens and the workers join it: its own address, if any
        (the rendezvous socket is headsplit's: it binds any address of the node, a loopback one too)."""
        return self.source_address or self.address


def _source_address(doc: dict[str, Any], where: str) -> str | None:
    value = doc.get("source_address")
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{where}source_address: expected null or an address, got {value!r}")
    return value


def _get(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    if key not in doc:
        raise ConfigError(f"{where}{key}: missing")
    value = doc[key]
    if not isinstance(value, kind) or (
        isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
        raise ConfigError(f"{where}{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _placement_costs(doc: dict[str, Any], base: Path, workers: list[WorkerEntry]) -> ProfileCosts | None:
    """The costs document ``placement_profile`` names (relative to ``base``: the config's directory),
    checked, with a profile of every worker's host."""
    name = doc.get("placement_profile")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"placement_profile: expected null or a file name, got {name!r}")
    file = base / name
    try:
        costs = costs_from_document(json.loads(file.read_text(encoding="utf-8")), "placement_profile")
    except (OSError, ValueError) as exc:  # ProfileError and JSONDecodeError are ValueErrors
        raise ConfigError(f"placement_profile: {file}: {exc}") from None
    for i, w in enumerate(workers):
        if w.host not in costs.devices:
            raise ConfigError(
                f"placement_profile: {file} has no costs of workers[{i}].host {w.host!r} "
                f"(profiled: {', '.join(costs.devices)})"
            )
    return costs


def parse_config(doc: dict[str, Any], base: Path | None = None) -> RunConfig:
    """Validate ``headsplit.json`` (the contract's run config); errors name the offending field. Files
    it names (``placement_profile``) are read relative to ``base`` (the working directory if None)."""
    m = _get(doc, "model", dict)
    try:
        if "preset" in m:
            cfg = preset(_get(m, "preset", str, "model."))
        elif "config" in m:
            cfg = ModelConfig.from_json(_get(m, "config", dict, "model."))
        else:
            raise ConfigError("model: needs preset or config")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model: {exc}") from None
    ck = doc.get("checkpoint")
    if ck is not None:
        if (
            not isinstance(ck, dict)
            or not isinstance(ck.get("path"), str)
            or not isinstance(ck.get("sha256"), str)
        ):
            raise ConfigError("checkpoint: expected null or {path: str, sha256: str}")
        shards = ck.get("shards")
        if shards is not None and (
            not isinstance(shards, dict)
            or not all(
                isinstance(v, dict) and isinstance(v.get("path"), str) and isinstance(v.get("sha256"), str)
                for v in shards.values()
            )
        ):
            raise ConfigError("checkpoint.shards: expected {worker name: {path: str, sha256: str}}")
        ck = {"path": ck["path"], "sha256": ck["sha256"], **({"shards": shards} if shards else {})}
    c = _get(doc, "controller", dict)
    ws = _get(doc, "workers", list)
    if not ws:
        raise ConfigError("workers: at least one worker is needed")
    workers = []
    for i, w in enumerate(ws):
        where = f"workers[{i}]."
        if not isinstance(w, dict):
            raise ConfigError(f"workers[{i}]: expected an object")
        rank = _get(w, "rank", int, where)
        if rank != i + 1:
            raise ConfigError(f"{where}rank: expected {i + 1} (ranks are 1..N in order), got {rank}")
        name = w.get("name", f"worker{rank}")
        if name != f"worker{rank}":
            raise ConfigError(
                f"{where}name: must be worker{rank} (the RPC name of rank {rank}), got {name!r}"
            )
        limit = w.get("memory_limit_bytes", 0)
        if not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"{where}memory_limit_bytes: expected an integer >= 0, got {limit!r}")
        note = w.get("exit_note")
        if note is not None and (not isinstance(note, str) or not note):
            raise ConfigError(f"{where}exit_note: expected null or a path, got {note!r}")
        workers.append(
            WorkerEntry(
                rank, name, str(w.get("host", name)), _get(w, "address", str, where), limit,
                _source_address(w, where), note,
            )
        )  # fmt: skip
    strategy = doc.get("strategy", "greedy")
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy: one of {', '.join(STRATEGIES)}, got {strategy!r}")
    control = doc.get("control", "dataflow")
    if control not in CONTROLS:
        raise ConfigError(f"control: one of {', '.join(CONTROLS)}, got {control!r}")
    tau = doc.get("tau", DEFAULT_TAU)
    if not isinstance(tau, int | float) or isinstance(tau, bool) or tau < 0:
        raise ConfigError(f"tau: expected a number >= 0, got {tau!r}")
    tokens = _get(doc, "tokens", int)
    if tokens < 1:
        raise ConfigError(f"tokens: must be >= 1, got {tokens}")
    threshold = doc.get("memory_threshold", 0.85)
    if not isinstance(threshold, int | float) or not 0 < threshold <= 1:
        raise ConfigError(f"memory_threshold: expected a number in (0, 1], got {threshold!r}")
    timeout = doc.get("rpc_timeout_s", 30)
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"rpc_timeout_s: expected a number > 0, got {timeout!r}")
    retries = doc.get("rpc_retries", 3)
    if not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"rpc_retries: expected an integer >= 0, got {retries!r}")
    threads = doc.get("threads", 1)
    if not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads: expected an integer >= 1, got {threads!r}")
    placement = doc.get("placement")
    if placement is not None:
        names = {w.name for w in workers}
        if not isinstance(placement, dict):
            raise ConfigError("placement: expected null or {unit key: worker name}")
        for k, v in placement.items():
            try:
                Unit.parse(k)
            except ValueError:
                raise ConfigError(
                    f"placement.{k}: not a unit key (L<layer>.head<h>, L<layer>.proj, L<layer>.ffn)"
                ) from None
            if v not in names:
                raise ConfigError(f"placement.{k}: unknown worker {v!r}")
    plan_tokens = doc.get("plan_tokens")
    if plan_tokens is not None and (not isinstance(plan_tokens, int) or plan_tokens < 1):
        raise ConfigError(f"plan_tokens: expected null or an integer >= 1, got {plan_tokens!r}")
    pressure = _memory_pressure(doc.get("memory_pressure"), tokens)
    prof = doc.get("speculation_profile")
    if prof is not None and not isinstance(prof, str):
        raise ConfigError(f"speculation_profile: expected null or a path, got {prof!r}")
    ids = doc.get("prompt_ids")
    if ids is not None and (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < cfg.vocab for i in ids)
    ):
        raise ConfigError(f"prompt_ids: expected null or a non-empty list of token ids in 0..{cfg.vocab - 1}")
    ppl = doc.get("perplexity")
    if ppl is not None:
        if not isinstance(ppl, dict) or not isinstance(ppl.get("text"), str) or len(ppl["text"]) < 2:
            raise ConfigError("perplexity: expected null or {text: str of >= 2 characters, ids: null | list}")
        pids = ppl.get("ids")
        if pids is not None and (
            not isinstance(pids, list)
            or len(pids) < 2
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < cfg.vocab for i in pids)
        ):
            raise ConfigError(
                f"perplexity.ids: expected null or a list of >= 2 token ids in 0..{cfg.vocab - 1}"
            )
        ppl = {"text": ppl["text"], "ids": pids}
    return RunConfig(
        model=cfg,
        checkpoint=ck,
        controller_host=str(c.get("host", "controller")),
        address=_get(c, "address", str, "controller."),
        source_address=_source_address(c, "controller."),
        port=_get(c, "port", int, "controller."),
        workers=tuple(workers),
        strategy=strategy,
        speculation=bool(doc.get("speculation", False)),
        tau=float(tau),
        speculation_profile=prof,
        tokens=tokens,
        prompt=str(doc.get("prompt", "")) or "Hello",
        memory_threshold=float(threshold),
        rpc_timeout_s=float(timeout),
        rpc_retries=retries,
        threads=threads,
        result=str(doc.get("result", "results/headsplit.json")),
        placement=placement,
        replacement=bool(doc.get("replacement", True)),
        plan_tokens=plan_tokens,
        memory_pressure=pressure,
        prompt_ids=tuple(ids) if ids is not None else None,
        perplexity=ppl,
        placement_costs=_placement_costs(doc, base or Path("."), workers),
        control=control,
    )


def _memory_pressure(value: Any, tokens: int) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"memory_pressure: expected null or {{replace_at, full_at}}, got {value!r}")
    out: dict[str, int] = {}
    for key in ("replace_at", "full_at"):
        got = value.get(key)
        if not isinstance(got, int) or isinstance(got, bool) or got < 1:
            raise ConfigError(f"memory_pressure.{key}: expected an integer >= 1, got {got!r}")
        out[key] = got
    if out["full_at"] <= out["replace_at"]:
        raise ConfigError(
            f"memory_pressure.full_at: must be after replace_at ({out['replace_at']}), got {out['full_at']}"
        )
    if out["replace_at"] >= tokens:
        raise ConfigError(
            f"memory_pressure.replace_at: must be before the last token ({tokens - 1}), got {out['replace_at']}"
        )
    return out


def load_run_config(path: str | Path) -> RunConfig:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{p}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: expected a JSON object")
    try:
        return parse_config(doc, p.parent)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def wait_start() -> None:
    """Honour ``DIT_START_AT_NS``: the testbed starts every node's workload at one instant."""
    raw = os.environ.get("DIT_START_AT_NS")
    if raw:
        delay = (int(raw) - time.time_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)


def _speculate_layers(rc: RunConfig) -> frozenset[int] | None:
    if not rc.speculation or rc.speculation_profile is None:
        return None
    from headsplit.speculation import load_profile

    return frozenset(load_profile(rc.speculation_profile)["speculate_layers"])


def _memory_check(limits: dict[str, int], threshold: float) -> engine.MemoryCheck:
    """hs-place's MemoryTracker when it is installed, else the engine's own threshold check."""
    try:
        # looked up at run time: memory.py is hs-place's module (absent until that branch is merged)
        mem = importlib.import_module("headsplit.memory")
    except ImportError:
        return engine.threshold_check(threshold)
    tracker = mem.MemoryTracker(limits, threshold)

    def check(token: int, worker: str, used: int, limit: int) -> bool:
        tracker.record(token, worker, used)
        return bool(tracker.needs_replacement(worker))

    return check


def worker_checkpoint(ck: dict[str, Any] | None, worker: str) -> dict[str, str] | None:
    """What ``worker`` reads: its own shard (verified there by its SHA-256) or the whole checkpoint."""
    if ck is None:
        return None
    shards = ck.get("shards")
    if shards:
        if worker not in shards:
            raise ConfigError(f"checkpoint.shards: no shard for {worker}")
        return {"path": str(shards[worker]["path"]), "sha256": str(shards[worker]["sha256"])}
    return {"path": str(ck["path"]), "sha256": str(ck["sha256"])}


def perplexity_pass(rc: RunConfig, eng: engine.Engine) -> dict[str, Any]:
    """The teacher-forced perplexity of ``rc.perplexity``'s paragraph through ``eng`` (the run's own
    placement, workers and speculation at tau), cut to the model's positions; the results' section."""
    assert rc.perplexity is not None
    text = str(rc.perplexity["text"])
    given = rc.perplexity.get("ids")
    ids = [int(i) for i in given] if given is not None else model.tokenize(text, rc.model)
    used = ids[: rc.model.max_positions + 1]  # positions 0..max_positions - 1 are fed
    t0 = time.perf_counter_ns()
    p = eng.perplexity(used)
    return {
        "perplexity": p.perplexity,
        "nll_mean": p.nll_mean,
        "tokens": p.tokens,
        "paragraph_tokens": len(ids),
        "paragraph_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "tokenizer": "byte-level" if given is None else "model",
        "speculation": rc.speculation,
        "tau": rc.tau,
        "speculated": p.speculated,
        "accepted": p.accepted,
        "elapsed_ns": time.perf_counter_ns() - t0,
    }


UNIT_STEPS_RULE = (
    "per worker at start, one decode step of a layer's heads (with their KV copies), of its projection and "
    "of its FFN on the run's model at the planned context, the three in turn, every worker at once "
    "(workers[].unit_step_ns); a unit "
    "kind's rate is the cost model's FLOPs of that step over its time"
)


def costs_record(rc: RunConfig, hp: Any, context_tokens: int) -> dict[str, Any]:
    """The results' ``placement.costs``: where the placement's per-unit costs came from. For a profile
    run, per unit kind the FLOPs of one of the run's units at ``context_tokens`` beside one profiled
    unit's (the median over the devices) and their ratio, the scale the measured rates were carried
    over by (1 when the profiled model is the run's own)."""
    costs = rc.placement_costs
    if costs is None:
        return {
            "source": "micro-benchmark",
            "rule": UNIT_STEPS_RULE,
        }
    kinds: dict[str, Any] = {}
    for kind in ("head", "proj", "ffn"):
        unit = Unit(0, kind, 0) if kind == "head" else Unit(0, kind)
        run_flops = float(hp.unit_flops(rc.model, unit, context_tokens))
        profiled = statistics.median(costs.devices[w.host][kind].median_unit_flops for w in rc.workers)
        kinds[kind] = {
            "run_unit_flops": run_flops,
            "profile_unit_flops": profiled,
            "scale": run_flops / profiled,
        }
    return {"source": "profile", **costs.source(), "rule": RULE, "kinds": kinds}


class SetupRefused(RuntimeError):
    """A worker would need more memory than its node allows: refused before anything is built."""


def setup_needs(
    cfg: ModelConfig,
    placement: engine.Placement,
    tokens: int,
    node_limits: dict[str, int],
    workers_doc: list[dict[str, Any]],
) -> dict[str, Any]:
    """Each worker's peak need (:func:`headsplit.memory.needs`), said on the log and recorded in
    ``workers_doc`` (``need_bytes``); :class:`SetupRefused` when one passes what its node allows."""
    mem = importlib.import_module("headsplit.memory")
    needs: dict[str, Any] = mem.needs(cfg, placement, tokens)
    for d in workers_doc:
        need = needs.get(d["name"])
        d["need_bytes"] = need.peak_bytes if need is not None else 0
        if need is not None:
            limit = node_limits[d["name"]]
            print(
                f"headsplit controller: {d['name']} needs {need.describe()}, its node allows {limit / 1e6:.0f} MB"
            )
    refused = mem.over_limit(needs, node_limits)
    if refused:
        raise SetupRefused(
            f"placement refused before set-up: {'; '.join(refused)} (the kernel would kill it): give its "
            "node more memory (hardware.<device>.memory_limit_mb, dit rack up --memory-mb) or place the "
            "model on more workers"
        )
    return needs


# what torch RPC (TensorPipe) says when the peer's process is gone: its connection closed under the call
GONE = re.compile(r"\bEOF\b|connection (reset|refused|closed)|broken pipe|pipe closed", re.IGNORECASE)
NOTE_WAIT_S = 5.0  # the supervisor writes its note as soon as its child is gone; the call fails at once


def _note(path: str | None, wait_s: float) -> Any:
    """The exit note at ``path`` (waiting up to ``wait_s`` for it), None when there is none to read."""
    if path is None:
        return None
    mem = importlib.import_module("headsplit.memory")
    file = Path(path)
    deadline = time.monotonic() + wait_s
    while not file.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        return mem.ExitNote.from_json(json.loads(file.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class SetupTransport(Protocol):
    def setup(
        self, worker: str, cfg: ModelConfig, checkpoint: dict[str, str] | None, units: list[Unit]
    ) -> int: ...


class StepTimingTransport(Protocol):
    def unit_step_s(
        self, worker: str, cfg: ModelConfig, context_tokens: int
    ) -> tuple[float, float, float]: ...


def _at_once(calls: dict[str, Callable[[], _T]], prefix: str) -> dict[str, _T]:
    """Every call at the same time, one thread each; every call ends before this returns; the first
    failure, in the order of ``calls``, is raised."""
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=max(len(calls), 1), thread_name_prefix=prefix
    ) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
    return {name: future.result() for name, future in futures.items()}  # leaving the pool waited


def set_up_workers(
    tr: SetupTransport, cfg: ModelConfig, shares: dict[str, tuple[dict[str, str] | None, list[Unit]]]
) -> None:
    """Every worker builds its share at once, each on its own board (or CPU quota): the set-up lasts as
    long as the slowest worker's, not the sum of them (one after another, four TinyLlama workers at 25 %
    of a CPU each took 26.6 s of every Chapter 6 variant on the emulated rack). Set-up is no
    measurement. Every call ends before this returns; the first failure, in worker order, is raised."""
    _at_once(
        {n: functools.partial(tr.setup, n, cfg, ckpt, units) for n, (ckpt, units) in shares.items()},
        "hs-setup",
    )


def time_unit_steps(
    tr: StepTimingTransport, cfg: ModelConfig, workers: list[str], context_tokens: int
) -> dict[str, tuple[float, float, float]]:
    """Every worker times its decode steps of a layer's heads, projection and FFN (``engine.
    time_unit_steps``) at the same time, each on its own board (or CPU quota), so that a change in the
    machine's speed while they are timed falls on all of them alike. One after another, four workers
    with the same 25 % quota of one CPU on the emulated rack timed their heads' step 21-44 ms (a
    2x spread between identical boards, from the VM's speed drifting over the two seconds), and
    greedy dealt one of them 15 of a layer's 32 heads and another 3. The placement prices each unit
    kind on each worker from these."""
    return _at_once(
        {w: functools.partial(tr.unit_step_s, w, cfg, context_tokens) for w in workers}, "hs-steps"
    )


def why_lost(rc: RunConfig, message: str, needs: dict[str, Any], node_limits: dict[str, int]) -> str:
    """A failed worker call (``workerN.remote_setup: failed 4 times, last error: EOF``) with its cause
    first when a worker is gone: killed by its memory cgroup, by another signal, or an exit status, from
    the note its supervisor wrote (:mod:`headsplit.worker`) where this node can read it. The worker lost
    may be another than the one called (a call that pulled from it)."""
    mem = importlib.import_module("headsplit.memory")
    worker, _, rest = message.partition(".")
    call = rest.partition(":")[0].removeprefix("remote_") or "its call"
    entry = next((w for w in rc.workers if w.name == worker), None)
    if entry is None:
        return message
    note = _note(entry.exit_note, NOTE_WAIT_S)
    if note is None:  # the one called may be alive and another gone under it
        note = next(filter(None, (_note(w.exit_note, 0) for w in rc.workers if w is not entry)), None)
    if note is None and (entry.exit_note is not None or not GONE.search(message)):
        return message  # nothing says a process is gone: it failed while alive, as far as can be told
    lost = worker if note is None else note.worker
    cause = mem.loss_message(lost, call, note, needs.get(lost), node_limits.get(lost, 0))
    return f"{cause} ({message})"


def run(rc: RunConfig) -> dict[str, Any]:
    """Everything after the RPC group is up; returns the results document."""
    from headsplit import rpc

    cfg = rc.model
    tr = rpc.RpcTransport(rc.rpc_timeout_s, rc.rpc_retries)
    workers_doc: list[dict[str, Any]] = []
    limits: dict[str, int] = {}
    node_limits: dict[str, int] = {}  # what the kernel allows each worker process (cgroup, else RAM)
    prompt_ids = list(rc.prompt_ids) if rc.prompt_ids is not None else model.tokenize(rc.prompt, cfg)
    model.check_positions(cfg, len(prompt_ids), rc.tokens)
    context = len(prompt_ids) + rc.tokens
    planned = rc.plan_tokens or context  # smaller: the KV growth is left to re-placement
    replan: Callable[[engine.Placement, int], engine.Placement] | None = None
    # hs-place's module, imported before the clock starts: planning_ns times the planning alone.
    # An explicit placement runs without it, but re-places with it when it is installed.
    hp: Any = None
    try:
        hp = importlib.import_module("headsplit.placement")
    except ImportError:
        if rc.placement is None:
            raise
    # the placement prices unit kinds from the profile run's costs, else from every worker's decode
    # steps of the run's units timed now, at once (the matmul's flops_per_s is no unit's rate)
    timed = (
        time_unit_steps(tr, cfg, [w.name for w in rc.workers], planned)
        if rc.placement_costs is None and hp is not None
        else {}
    )
    for w in rc.workers:
        rtt = tr.rtt_ns(w.name)
        flops = tr.flops_per_s(w.name)
        node_limits[w.name] = tr.node_memory(w.name)
        limits[w.name] = w.memory_limit_bytes or node_limits[w.name]
        step_s = timed.get(w.name)
        if rc.placement_costs is not None:
            rates = rc.placement_costs.rates(w.host)
        elif step_s is not None:
            rates = hp.step_rates(cfg, planned, step_s)
        else:
            rates = (flops,) * 3
        workers_doc.append(
            {
                "name": w.name,
                "host": w.host,
                "rtt_ns": rtt,
                "flops_per_s": flops,
                "placement_flops_per_s": dict(zip(("head", "proj", "ffn"), rates, strict=True)),
                "memory_limit_bytes": w.memory_limit_bytes,
                "memory_bytes": limits[w.name],
                "node_memory_bytes": node_limits[w.name],
            }
        )
        if step_s is not None:
            ns = (round(s * 1e9) for s in step_s)
            workers_doc[-1]["unit_step_ns"] = dict(zip(("heads", "proj", "ffn"), ns, strict=True))
    t0 = time.perf_counter_ns()
    specs = []
    if hp is not None:
        specs = [
            hp.WorkerSpec(
                d["name"],
                limits[d["name"]],
                d["flops_per_s"],
                int(statistics.median(d["rtt_ns"])),
                tuple(d["placement_flops_per_s"].values()),
            )
            for d in workers_doc
        ]
    if rc.placement is not None:
        placement = {Unit.parse(k): v for k, v in rc.placement.items()}
    else:
        placement = dict(hp.place(cfg, specs, rc.strategy, context_tokens=planned))
    threshold = rc.memory_threshold
    overhead: dict[str, int] = {}  # per worker, its own count minus the placement's model (when measured)
    if hp is not None and rc.replacement:

        def replan_fn(current: engine.Placement, tokens: int) -> engine.Placement:
            # tokens: generated so far; the KV caches hold the prompt and those
            so_far = len(prompt_ids) + tokens
            ahead = max(context - so_far, 1)
            # every worker under the run's threshold for the tokens ahead (the trigger's own fraction)
            return dict(
                hp.replace(
                    cfg,
                    specs,
                    current,
                    tokens_so_far=so_far,
                    tokens_ahead=ahead,
                    threshold=threshold,
                    overhead_bytes=overhead,
                )
            )

        replan = replan_fn
    planning_ns = time.perf_counter_ns() - t0
    names = [w.name for w in rc.workers]
    engine.check_placement(cfg, placement, names)
    placement_doc: dict[str, Any] = {"planning_ns": planning_ns, "context_tokens": planned}
    if hp is not None:
        # what the cost model predicts for this placement (no speculation): to compare with the run
        placement_doc["predicted_token_s"] = hp.estimate_token_s(
            cfg, specs, placement, context_tokens=planned
        )
        placement_doc["costs"] = costs_record(rc, hp, planned)
    needs: dict[str, Any] = {}
    if hp is not None:
        needs = setup_needs(cfg, placement, planned, node_limits, workers_doc)
    if rc.checkpoint:
        cw = model.load_checkpoint(
            cfg, rc.checkpoint["path"], rc.checkpoint["sha256"], names=model.controller_tensor_names(cfg)
        )
    else:
        cw = model.seeded_weights(cfg, model.controller_tensor_names(cfg))
    t_setup = time.perf_counter_ns()
    try:
        shares = {n: (worker_checkpoint(rc.checkpoint, n), engine.units_of(placement, n)) for n in names}
        set_up_workers(tr, cfg, shares)
    except rpc.RpcCallFailed as exc:
        raise rpc.RpcCallFailed(why_lost(rc, str(exc), needs, node_limits)) from exc
    if rc.control == "dataflow":
        tr.open_push(names)
    setup_ns = time.perf_counter_ns() - t_setup
    pressure: dict[str, Any] | None = None
    if rc.memory_pressure is not None:
        # the budget from this placement and what each worker holds now (caches empty): the workers' own
        # count, which the engine samples, not the placement's model of it
        held = {n: int(tr.call(n, "nbytes").result()[0]) for n in names}
        squeezed = importlib.import_module("headsplit.memory").squeeze(
            cfg, placement, len(prompt_ids), measured=held, **rc.memory_pressure
        )
        limits[squeezed.worker] = squeezed.limit_bytes
        threshold = squeezed.threshold
        specs = [
            dataclasses.replace(s, memory_bytes=squeezed.limit_bytes) if s.name == squeezed.worker else s
            for s in specs
        ]
        for d in workers_doc:
            if d["name"] == squeezed.worker:
                d["memory_bytes"] = squeezed.limit_bytes
        pressure = squeezed.to_json()
        overhead = {n: held[n] - int(hp.worker_bytes(cfg, placement, n, 0)) for n in names}
    opts = engine.EngineOptions(
        speculation=rc.speculation,
        tau=rc.tau,
        speculate_layers=_speculate_layers(rc),
        memory_limits=limits,
        memory_check=_memory_check(limits, threshold),
        replan=replan,
        control=rc.control,
    )
    eng = engine.Engine(cfg, tr, placement, cw, opts)
    doc: dict[str, Any] = {
        "model": cfg.to_json(),
        "checkpoint": rc.checkpoint,
        "strategy": "explicit" if rc.placement is not None else rc.strategy,
        "control": rc.control,
        "speculation": rc.speculation,
        "tau": rc.tau,
        "speculate_layers": sorted(opts.speculate_layers) if opts.speculate_layers is not None else None,
        "threads": rc.threads,
        "workers": workers_doc,
        "placement": {**placement_doc, "units": {u.key(): w for u, w in sorted(placement.items())}},
        "prompt_tokens": len(prompt_ids),
        "setup_ns": setup_ns,
        "replacement": rc.replacement and hp is not None,
        "memory_threshold": threshold,
        "memory_pressure": pressure,
    }
    # the one progress line (the node's log): generation starts now
    print(f"headsplit controller: generating {rc.tokens} tokens", flush=True)
    start_ns = time.time_ns()
    error = None
    try:
        res = eng.generate(prompt_ids, rc.tokens)
    except rpc.RpcCallFailed as exc:
        error = why_lost(rc, str(exc), needs, node_limits)
        res = eng.result
    end_ns = time.time_ns()
    secs = max(end_ns - start_ns, 1) / 1e9
    quality: dict[str, Any] | None = None
    if rc.perplexity is not None and error is None and res.oom is None:
        # after the generation (its clock stopped): the same engine scores the held-out paragraph
        print("headsplit controller: perplexity pass", flush=True)
        try:
            quality = perplexity_pass(rc, eng)
        except rpc.RpcCallFailed as exc:
            error = f"perplexity: {exc}"
    doc.update(
        tokens=res.tokens,
        memory=res.memory,
        replacements=res.replacements,
        replacement_errors=res.replacement_errors,
        migration_bytes=eng.migration_bytes,
        retries=tr.retries,
        oom=res.oom,
        generated=res.generated,
        tokens_generated=len(res.generated),
        tokens_per_s=len(res.generated) / secs,
        start_ns=start_ns,
        end_ns=end_ns,
        error=error,
    )
    if rc.perplexity is not None:
        doc["perplexity"] = quality  # None: not measured (the generation failed or ran out of memory)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headsplit.controller")
    ap.add_argument("--config", required=True)
    args = ap.parse_args(argv)
    try:
        rc = load_run_config(args.config)
    except ConfigError as exc:
        print(f"headsplit controller: {exc}", file=sys.stderr)
        return 2
    from headsplit import netif

    try:
        # before the start instant: a refused address fails the run at once, and nothing listens
        own, note = netif.pin(
            rc.address,
            rc.source_address,
            where="controller.address",
            source_where="controller.source_address",
        )
    except netif.BindRefused as exc:
        print(f"headsplit controller: refused: {exc}", file=sys.stderr)
        return 2
    if note:
        print(f"headsplit controller: {note}", file=sys.stderr, flush=True)
    wait_start()
    torch.set_num_threads(rc.threads)
    from headsplit import rpc

    rpc.set_own_address(own)

    field = "controller.source_address" if rc.source_address else "controller.address"
    listening = rpc.init_listening_only_on(
        rpc.CONTROLLER_NAME, 0, 1 + len(rc.workers), rc.rendezvous, rc.port, rc.rpc_timeout_s,
        tuple(dict.fromkeys((own, rc.rendezvous))), field,
    )  # fmt: skip
    if listening is None:
        return 2
    code = 0
    try:
        doc = run(rc)
        if doc["error"]:
            code = 1
    except Exception as exc:  # a failed run is a result file with its error, not a traceback
        doc, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
    doc["listeners"] = listening + rpc.push_listener()
    if code:
        print(f"headsplit controller: {doc['error']}", file=sys.stderr)
    # the result first: a shutdown after a failure may wait on a worker that is gone
    out = Path(rc.result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    rpc.shutdown(graceful=code == 0)
    rpc.close_push()
    return code


if __name__ == "__main__":
    sys.exit(main())
