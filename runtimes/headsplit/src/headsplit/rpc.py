"""torch.distributed.rpc (TensorPipe) between the controller (rank 0, ``controller``) and the workers
(rank R, ``worker<R>``): the worker-side call targets, the RPC transport with bounded retries, RTT and
FLOP/s measurement. Under dataflow control the tokens' messages go over headsplit.pushnet's
connections instead (set up through RPC: ``open_push``); a token without its last X within the
timeout is pushed again (``run_step``).

Retries are safe because every worker call is idempotent: ``heads`` cuts its KV caches back to the
step's start position before writing, ``proj``/``ffn``/``nbytes``/``export`` are pure, ``load`` and
``retain`` set state. Test hook: ``HEADSPLIT_STALL_ONCE=<method>`` in a worker's environment makes the
first call of that method sleep ``HEADSPLIT_STALL_S`` seconds (default 3) and then drop the call
without executing it -- a stalled link, as the controller sees it (dataflow: ``heads`` drops the first
X pushed to the worker).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as tdist
import torch.distributed.rpc as trpc
from torch.distributed.constants import default_pg_timeout

from headsplit import dataflow, engine, memory, netif, pushnet
from headsplit.config import ModelConfig
from headsplit.units import Unit

CONTROLLER_NAME = "controller"
RTT_SAMPLES = 10


def worker_name(rank: int) -> str:
    return f"worker{rank}"


RENDEZVOUS_SCHEME = "headsplit"


def _rendezvous(
    url: str, timeout: timedelta = default_pg_timeout, **_: Any
) -> Iterator[tuple[Any, int, int]]:
    """torch's ``tcp://`` rendezvous, except that rank 0's store listens on the URL's address only.

    torch's TCPStore server binds the wildcard whatever host it is given (torch 2.13: ``*:<port>``,
    IPv6 dual-stack); given a socket already bound and listening (``master_listen_fd``) it serves on
    that instead. The other ranks are clients and listen on nothing here."""
    parts = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    rank, world_size = int(query["rank"]), int(query["world_size"])
    address, port = str(parts.hostname), int(parts.port or 0)
    if rank == 0:
        sock = netif.listen_socket(address, port)
        # detached: the store serves on the descriptor from here on, and a collected socket object
        # must not close it under the store
        store = tdist.TCPStore(  # type: ignore[attr-defined, unused-ignore]
            address, port, world_size, True, timeout, master_listen_fd=sock.detach(), use_libuv=True
        )
    else:
        store = tdist.TCPStore(address, port, world_size, False, timeout)  # type: ignore[attr-defined, unused-ignore]
    yield store, rank, world_size
    raise RuntimeError(f"{RENDEZVOUS_SCHEME}:// rendezvous cannot be repeated (as torch's tcp://)")


def _register_rendezvous() -> None:
    with contextlib.suppress(RuntimeError):  # registered by an earlier init of this process
        tdist.register_rendezvous_handler(RENDEZVOUS_SCHEME, _rendezvous)  # type: ignore[attr-defined, no-untyped-call, unused-ignore]


def init(name: str, rank: int, world_size: int, address: str, port: int, timeout_s: float) -> None:
    """Join the RPC group; rank 0 hosts the rendezvous at address:port (bound to that address only:
    :func:`_rendezvous`). Only the ``uv`` (TCP) transport and the basic channel: the same path on one
    host as between boards, no shared memory. TensorPipe and Gloo listen on the address
    :func:`headsplit.netif.pin` pinned before this call (an interface's, or the process's own hostname)."""
    _register_rendezvous()
    opts = trpc.TensorPipeRpcBackendOptions(
        init_method=f"{RENDEZVOUS_SCHEME}://{address}:{port}",
        rpc_timeout=timeout_s,
        num_worker_threads=16,
        _transports=["uv"],
        _channels=["basic"],
    )
    trpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)  # type: ignore[no-untyped-call, unused-ignore]


def init_listening_only_on(
    name: str,
    rank: int,
    world_size: int,
    address: str,
    port: int,
    timeout_s: float,
    own: str | tuple[str, ...],
    field: str,
) -> list[str] | None:
    """:func:`init` (``address``: the controller's rendezvous), then this process's listening sockets as
    ``host:port``; None when one of them is not on its own address ``own`` (or one of them; given by the
    block's ``field``): the refusal is said on stderr with the stray sockets, and RPC is shut down."""
    import sys

    init(name, rank, world_size, address, port, timeout_s)
    listening = netif.listeners()
    stray = netif.stray_listeners(own, listening)
    if stray:
        who = "controller" if rank == 0 else "worker"
        print(
            f"headsplit {who}: refused: torch RPC listens on {', '.join(stray)}, not only on {field} "
            f"{own if isinstance(own, str) else ' and '.join(own)}",
            file=sys.stderr,
        )
        shutdown(graceful=False)
        return None
    return [f"{host}:{port}" for host, port in listening]


def shutdown(graceful: bool = True) -> None:
    """Graceful: blocks until every member of the group has reached shutdown (and its outstanding
    calls are done). Not graceful: this process leaves at once (after a failed run)."""
    trpc.shutdown(graceful=graceful)


# ------------------------------------------------------------------------------- worker-side state


@dataclass
class _Worker:
    state: engine.WorkerState | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    memory: list[dict[str, int]] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    stall_pending: str | None = None
    net: pushnet.PushNet | None = None  # dataflow control's connections (headsplit.pushnet)
    push_errors: list[str] = field(default_factory=list)
    # the pushed messages, in order of arrival, for the one thread that delivers them (_deliver_loop)
    inbox: queue.SimpleQueue[dataflow.Msg | None] | None = None
    delivering: threading.Thread | None = None


_W = _Worker(stall_pending=os.environ.get("HEADSPLIT_STALL_ONCE") or None)
DELIVER_JOIN_S = 30.0  # close_push's wait for the delivering thread to finish its last message
# this process's activations (a worker's outputs, or the controller's embedding), pulled by their
# consumers with remote_get: the data goes producer -> consumer, never through the controller
STORE: dict[str, torch.Tensor] = {}


def remote_get(key: str) -> torch.Tensor:
    return STORE[key]


def _pull(owner: str, key: str) -> torch.Tensor:
    """A worker pulling an activation from its producer (timeout: the group's rpc_timeout_s; a
    stalled pull fails the worker's call, which the controller retries)."""
    return trpc.rpc_sync(owner, remote_get, args=(key,))  # type: ignore[no-any-return, unused-ignore]


def worker_report() -> dict[str, Any]:
    errors = _W.push_errors + (_W.net.errors if _W.net is not None else [])
    return {"memory": list(_W.memory), "stalls": list(_W.stalls), "calls": _W.calls, "push_errors": errors}


def rss_bytes() -> int:
    return memory.status_bytes("VmRSS")


def node_memory_bytes() -> int:
    """The memory a worker may use when no limit is configured: its memory cgroup's limit (cgroup v1 or
    v2, the smallest up the hierarchy: the emulated rack's node cgroup), else RAM."""
    own = memory.own_memory_cgroup()
    limit = None if own is None else memory.effective_limit_bytes(own)
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            ram = int(line.split()[1]) * 1024
            return ram if limit is None else min(limit, ram)
    return limit or 0


def remote_setup(
    cfg_doc: dict[str, Any], checkpoint: dict[str, str] | None, unit_keys: list[str]
) -> tuple[int, int]:
    """Materialise this worker's units one at a time: seeded, or read from the checkpoint verified here."""
    t0 = time.perf_counter_ns()
    cfg = ModelConfig.from_json(cfg_doc)
    units = [Unit.parse(k) for k in unit_keys]
    share = engine.load_share(cfg, checkpoint, units)
    with _W.lock:
        st = engine.WorkerState(trpc.get_worker_info().name, cfg, fetch=_pull, store=STORE)
        st.load(*share)
        _W.state = st
        n, _ = st.nbytes()
    return n, time.perf_counter_ns() - t0


def remote_call(method: str, args: tuple[Any, ...]) -> Any:
    if _W.stall_pending == method:
        _W.stall_pending = None
        stall_s = float(os.environ.get("HEADSPLIT_STALL_S", "3"))
        _W.stalls.append({"time_ns": time.time_ns(), "call": method, "seconds": stall_s})
        time.sleep(stall_s)
        raise RuntimeError(f"test hook: call {method} stalled {stall_s} s and was dropped")
    with _W.lock:
        if _W.state is None:
            raise RuntimeError("worker not set up: call setup first")
        _W.calls += 1
        value = getattr(_W.state, method)(*args)
        if method in ("nbytes", "report"):  # report: (bytes, stage records) between dataflow tokens
            n = value[0] if method == "nbytes" else value[0][0]
            _W.memory.append({"time_ns": time.time_ns(), "bytes": int(n), "rss_bytes": rss_bytes()})
        return value


# the controller's inbox of dataflow control: the last X of a step (or a worker's error)
INBOX: queue.Queue[dataflow.Msg] = queue.Queue()


# this process's own address (where its listeners are and its pushes leave from): netif.pin's
OWN = {"address": "127.0.0.1"}


def set_own_address(address: str) -> None:
    OWN["address"] = address


def _push(msg: dataflow.Msg) -> None:
    """Send one dataflow message on its persistent connection (headsplit.pushnet). A push that fails
    leaves its step without its last X: the controller pushes the step again after its timeout."""
    net = _W.net
    try:
        if net is None:
            raise RuntimeError("no dataflow connections: remote_push_connect first")
        net.send(msg)
    except (OSError, RuntimeError, KeyError) as exc:
        _W.push_errors.append(f"{msg.src}>{msg.dst}: {type(exc).__name__}: {exc}")


def remote_push_open() -> tuple[str, int]:
    """Open this worker's dataflow listener on its own address, and start the thread that delivers
    what arrives on it; where it listens."""
    with _W.lock:
        if _W.net is None:
            inbox: queue.SimpleQueue[dataflow.Msg | None] = queue.SimpleQueue()
            _W.delivering = threading.Thread(
                target=_deliver_loop, args=(inbox,), name="hs-deliver", daemon=True
            )
            _W.delivering.start()
            _W.inbox = inbox
            _W.net = pushnet.PushNet(trpc.get_worker_info().name, OWN["address"], inbox.put)
        return _W.net.address


def _deliver_loop(inbox: queue.SimpleQueue[dataflow.Msg | None]) -> None:
    """A worker's pushed messages, delivered one at a time in order of arrival (until ``None``). The
    connections' reader threads only read whole frames and queue them here, so a reader never waits for
    the worker's lock: a push this worker makes while it holds the lock (``remote_deliver``) always
    finds its receiver reading, and two workers pushing large frames to each other cannot each wait
    for the other to read."""
    while (msg := inbox.get()) is not None:
        remote_deliver(msg)


def push_listener() -> list[str]:
    """The dataflow listener of this process as ``host:port`` (recorded beside torch RPC's listeners)."""
    if _W.net is None:
        return []
    host, port = _W.net.address
    return [f"{host}:{port}"]


def close_push() -> None:
    """Close this process's dataflow connections (after the RPC group is shut down). A worker's
    delivering thread first finishes what it was given (a speculative heads call the step's last X
    did not wait for may still be running) and ends: a thread still inside one of torch's kernels when
    the interpreter finalises aborts the process as it takes the GIL back ("terminate called without an
    active exception", signal 6; CI met it once in test_rpc.py's stalled-call test)."""
    if _W.inbox is not None:
        _W.inbox.put(None)
        _W.inbox = None
    if _W.delivering is not None:
        _W.delivering.join(DELIVER_JOIN_S)
        _W.delivering = None
    if _W.net is not None:
        _W.net.close()
        _W.net = None


def remote_push_connect(table: dict[str, tuple[str, int]]) -> None:
    """Connect to every other process of the run (name -> dataflow listener), once, before the first
    token."""
    assert _W.net is not None, "remote_push_open first"
    _W.net.connect({k: (str(h), int(p)) for k, (h, p) in table.items()})


def remote_deliver(msg: dataflow.Msg) -> None:
    """A pushed message arrives: the controller's last X into its inbox; a worker's into its scheduler
    (on the worker's delivering thread, ``_deliver_loop``), whose outputs are pushed on the moment each
    exists, under the worker's lock. Test hook: ``HEADSPLIT_STALL_ONCE=heads`` drops the first X
    this worker receives after stalling (the heads' input never arrives)."""
    if msg.dst == CONTROLLER_NAME:
        INBOX.put(msg)
        return
    if _W.stall_pending == "heads" and msg.kind == "x":
        _W.stall_pending = None
        stall_s = float(os.environ.get("HEADSPLIT_STALL_S", "3"))
        _W.stalls.append({"time_ns": time.time_ns(), "call": "heads", "seconds": stall_s})
        time.sleep(stall_s)
        return
    try:
        with _W.lock:
            if _W.state is None:
                raise RuntimeError("worker not set up: call setup first")
            _W.state.deliver(msg, _push)  # each output pushed the moment it exists
    except Exception as exc:  # the controller's step fails with it instead of timing out
        text = f"{msg.dst}: {type(exc).__name__}: {exc}"
        _push(dataflow.Msg("error", msg.step, msg.attempt, msg.start, msg.layer, msg.dst,
                           CONTROLLER_NAME, None, text=text))  # fmt: skip


def remote_ping() -> int:
    return time.time_ns()


def remote_flops(seconds: float = 0.2, n: int = 256) -> float:
    """Matmul micro-benchmark: FLOP/s of ``n x n`` float32 products over about ``seconds``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        iters += 1
    return 2.0 * n**3 * iters / (time.perf_counter() - t0)


def remote_unit_steps(cfg_doc: dict[str, Any], context_tokens: int) -> tuple[float, float, float]:
    """Seconds of one decode step of a layer's heads, its projection and its FFN on this worker, on the
    run's model (``engine.time_unit_steps``): what the placement costs each unit kind at."""
    return engine.time_unit_steps(ModelConfig.from_json(cfg_doc), context_tokens)


def remote_memory() -> int:
    return node_memory_bytes()


# ---------------------------------------------------------------------------------------- transport


class RpcCallFailed(RuntimeError):
    pass


class RpcPending:
    def __init__(self, transport: RpcTransport, worker: str, method: str, args: tuple[Any, ...]) -> None:
        self.t, self.worker, self.method, self.args = transport, worker, method, args
        self.issued_ns = 0
        self._done_ns = 0
        self._issue()

    def _issue(self) -> None:
        self.issued_ns = time.perf_counter_ns()
        self._done_ns = 0
        self.fut = trpc.rpc_async(
            self.worker, remote_call, args=(self.method, self.args), timeout=self.t.timeout_s
        )
        self.fut.add_done_callback(self._mark)

    def _mark(self, _: Any) -> None:
        self._done_ns = time.perf_counter_ns()

    @property
    def done_ns(self) -> int:
        return self._done_ns or time.perf_counter_ns()

    def result(self) -> Any:
        attempt = 0
        while True:
            try:
                value = self.fut.wait()
                if not self._done_ns:
                    self._done_ns = time.perf_counter_ns()
                return value
            except Exception as exc:
                attempt += 1
                msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                self.t.retries.append(
                    {
                        "time_ns": time.time_ns(),
                        "worker": self.worker,
                        "call": self.method,
                        "attempt": attempt,
                        "error": msg,
                    }
                )
                if attempt > self.t.max_retries:
                    raise RpcCallFailed(
                        f"{self.worker}.{self.method}: failed {attempt} times, last error: {msg}"
                    ) from exc
                self._issue()


class RpcTransport:
    """The engine's transport over torch RPC: each call with a timeout and at most ``max_retries``
    retries, every retry logged in ``retries`` (wall-clock ``time_ns``)."""

    def __init__(self, timeout_s: float, max_retries: int) -> None:
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retries: list[dict[str, Any]] = []

    def call(self, worker: str, method: str, *args: Any) -> engine.Pending:
        return RpcPending(self, worker, method, args)

    def _sync(self, worker: str, fn: Callable[..., Any], *args: Any) -> Any:
        attempt = 0
        while True:
            try:
                return trpc.rpc_sync(worker, fn, args=args, timeout=self.timeout_s)
            except Exception as exc:
                attempt += 1
                msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                self.retries.append(
                    {
                        "time_ns": time.time_ns(),
                        "worker": worker,
                        "call": fn.__name__.removeprefix("remote_"),
                        "attempt": attempt,
                        "error": msg,
                    }
                )
                if attempt > self.max_retries:
                    raise RpcCallFailed(
                        f"{worker}.{fn.__name__}: failed {attempt} times, last error: {msg}"
                    ) from exc

    def publish(self, key: str, t: torch.Tensor) -> None:
        engine.store_put(STORE, key, t)

    def open_push(self, workers: list[str]) -> None:
        """Dataflow control's connections (headsplit.pushnet): every worker opens its listener, then
        every process connects to every other, before the first token."""
        if _W.net is None:
            _W.net = pushnet.PushNet(CONTROLLER_NAME, OWN["address"], remote_deliver)
        table = {w: tuple(self._sync(w, remote_push_open)) for w in workers}
        table[CONTROLLER_NAME] = _W.net.address
        for w in workers:
            self._sync(w, remote_push_connect, table)
        _W.net.connect(table)

    def run_step(self, msgs: list[dataflow.Msg]) -> dataflow.Msg:
        """Push the step's start messages and wait for its last X. No last X within the timeout (per
        position the step computes: dataflow.step_timeout_s; a stalled link, a lost push): the step
        is pushed again as a new attempt (the workers drop the old attempt's messages; ``heads`` cuts
        its caches back, so re-running is safe), at most ``max_retries`` times; a worker's error
        fails the step at once."""
        attempt = 0
        while True:
            for m in msgs:
                _push(dataclasses.replace(m, attempt=attempt))
            want = (msgs[0].step, attempt)
            wait_s = dataflow.step_timeout_s(self.timeout_s, msgs)
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    got = INBOX.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if got.key != want:
                    continue  # an earlier attempt's
                if got.kind == "error":
                    raise RpcCallFailed(f"step {got.step}: {got.text}")
                return got
            attempt += 1
            msg = f"no last X within {wait_s:g} s"
            self.retries.append(
                {"time_ns": time.time_ns(), "worker": "", "call": "step", "attempt": attempt, "error": msg}
            )
            if attempt > self.max_retries:
                raise RpcCallFailed(f"step {msgs[0].step}: failed {attempt} times, last error: {msg}")

    def fetch(self, owner: str, key: str) -> torch.Tensor:
        return self._sync(owner, remote_get, key)  # type: ignore[no-any-return, unused-ignore]

    def rtt_ns(self, worker: str, samples: int = RTT_SAMPLES) -> list[int]:
        out = []
        for _ in range(samples):
            t0 = time.perf_counter_ns()
            self._sync(worker, remote_ping)
            out.append(time.perf_counter_ns() - t0)
        return out

    def flops_per_s(self, worker: str) -> float:
        return float(self._sync(worker, remote_flops))

    def unit_step_s(self, worker: str, cfg: ModelConfig, context_tokens: int) -> tuple[float, float, float]:
        heads, proj, ffn = self._sync(worker, remote_unit_steps, cfg.to_json(), context_tokens)
        return float(heads), float(proj), float(ffn)

    def node_memory(self, worker: str) -> int:
        return int(self._sync(worker, remote_memory))

    def setup(
        self, worker: str, cfg: ModelConfig, checkpoint: dict[str, str] | None, units: list[Unit]
    ) -> int:
        n, _ = self._sync(worker, remote_setup, cfg.to_json(), checkpoint, [u.key() for u in units])
        return int(n)
