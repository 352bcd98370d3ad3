"""The token loop: heads in parallel on their workers, gather at the projection, FFN, broadcast;
cross-layer speculation; migration of units and KV slices; memory per worker per token.

Two controls (``EngineOptions.control``). ``dataflow`` (the default; headsplit.dataflow): per token
the controller pushes one start message and receives the last X through ``Transport.run_step``; the
workers push activations to each other and run each stage when its inputs have arrived; between tokens
one ``report`` call per worker (issued at once) returns its bytes and stage records. ``rpc``: the
controller calls every stage of every layer and waits, as below.

The engine talks to workers only through a ``Transport``: ``call(worker, method, *args)`` returns a
``Pending`` whose ``result()`` is the value of ``WorkerState.<method>`` (with the worker's compute
time, and for heads/proj/ffn the time it spent pulling its inputs). ``InProcessTransport`` holds
``WorkerState`` objects in this process; ``headsplit.rpc.RpcTransport`` reaches the same class in
worker processes.

Data path under rpc control. The controller sends only control messages (which unit, which step, where the input is);
activations go producer -> consumer directly: every worker keeps what it produced in its store under
``<step>:<name>`` and its consumers pull it (``Ref`` = (owner, key)). Per layer: the head workers
pull X from its holder (the broadcast: the controller's embedding for layer 0, else the previous
FFN worker), the projection worker pulls the head outputs and X (the gather) and keeps Z, the FFN
worker pulls Z and keeps X = Z + FFN(Z); speculating, the next layer's head workers pull Z from the
projection worker at once. The controller pulls the last X for the LM head. Bytes per link count
these pulls (``src>dst``, src the producer); transfers within a worker count nothing, so a
layer-wise placement moves bytes only at its layer boundaries.

Speculation on transition l -> l+1 (layer l's Z forwarded to layer l+1's heads while layer l's FFN
runs): accepted when ||FFN(Z)|| / ||Z|| < tau (strictly: tau = 0 never accepts, so the output is
bit-for-bit the exact one), else layer l+1's heads run again on the exact X; the KV entries written by
the speculative call are replaced (``heads`` cuts its caches back to the step's start position).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from headsplit import checkpoint as ckpt
from headsplit import dataflow, model
from headsplit.config import DEFAULT_TAU, ModelConfig
from headsplit.units import Unit, all_units

Placement = dict[Unit, str]
SlotKey = tuple[int, int]  # (layer, kv head)
Ref = tuple[str, str]  # (owner: worker or controller, key) of an activation held in the owner's store
Fetch = Callable[[str, str], torch.Tensor]  # (owner, key) -> tensor, pulled from the owner
CONTROLLER = dataflow.CONTROLLER


def store_put(store: dict[str, torch.Tensor], key: str, t: torch.Tensor) -> None:
    """Keys are ``<step>:<name>``; a key of a new step drops the older steps' entries (nothing of a
    finished step is read again: every step starts from a fresh embedding)."""
    step = int(key.split(":", 1)[0])
    for k in [k for k in store if int(k.split(":", 1)[0]) < step]:
        del store[k]
    store[key] = t


class Pending(Protocol):
    issued_ns: int

    def result(self) -> Any: ...

    @property
    def done_ns(self) -> int: ...


class Transport(Protocol):
    def call(self, worker: str, method: str, *args: Any) -> Pending: ...

    def publish(self, key: str, t: torch.Tensor) -> None:
        """Put a controller-produced activation (the embedding) where workers can pull it."""

    def fetch(self, owner: str, key: str) -> torch.Tensor:
        """Pull an activation from its owner to the controller (the last X)."""

    def run_step(self, msgs: list[dataflow.Msg]) -> dataflow.Msg:
        """Dataflow control: push the step's start messages and return the message that reaches the
        controller (the last X), once the workers have pushed everything in between."""


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def _tree_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return _nbytes(obj)
    if isinstance(obj, Mapping):
        return sum(_tree_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tree_bytes(v) for v in obj)
    return 0


# ------------------------------------------------------------------------------------------ workers


class WorkerState:
    """What one worker holds -- its units' weights and its KV slots (weights + cache) -- and the calls
    the engine makes on it. Every call returns ``(value, compute_ns)``."""

    def __init__(
        self,
        name: str,
        cfg: ModelConfig,
        fetch: Fetch | None = None,
        store: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.units: dict[str, model.Weights] = {}
        self.slots: dict[SlotKey, model.KVSlot] = {}
        # activations this worker produced this step, pulled by the workers that consume them
        self.store: dict[str, torch.Tensor] = {} if store is None else store
        self.fetch = fetch
        self.node: dataflow.Node | None = None  # dataflow control's scheduler, set by configure

    def _get(self, ref: Ref) -> torch.Tensor:
        owner, key = ref
        if owner == self.name:
            return self.store[key]
        if self.fetch is None:
            raise RuntimeError(f"{self.name}: no way to fetch {key} from {owner}")
        return self.fetch(owner, key)

    def get(self, key: str) -> torch.Tensor:
        """Serve one stored activation to a consumer (not through the call lock: never blocks)."""
        return self.store[key]

    def load(
        self,
        units: Mapping[str, model.Weights],
        slots: Mapping[SlotKey, tuple[model.Weights, torch.Tensor, torch.Tensor]],
    ) -> tuple[None, int]:
        t0 = time.perf_counter_ns()
        self.units.update(units)
        for key, (w, k, v) in slots.items():
            self.slots[key] = model.KVSlot(w, k, v)
        return None, time.perf_counter_ns() - t0

    def export(
        self, unit_keys: list[str], slot_keys: list[SlotKey]
    ) -> tuple[
        tuple[dict[str, model.Weights], dict[SlotKey, tuple[model.Weights, torch.Tensor, torch.Tensor]]], int
    ]:
        t0 = time.perf_counter_ns()
        units = {k: self.units[k] for k in unit_keys}
        slots = {k: (self.slots[k].weights, self.slots[k].k, self.slots[k].v) for k in slot_keys}
        return (units, slots), time.perf_counter_ns() - t0

    def retain(self, unit_keys: list[str], slot_keys: list[SlotKey]) -> tuple[int, int]:
        """Drop every unit and slot not listed (after a migration); returns how many were dropped."""
        t0 = time.perf_counter_ns()
        keep_u, keep_s = set(unit_keys), set(slot_keys)
        gone = [k for k in self.units if k not in keep_u]
        gone_s = [k for k in self.slots if k not in keep_s]
        for k in gone:
            del self.units[k]
        for s in gone_s:
            del self.slots[s]
        return len(gone) + len(gone_s), time.perf_counter_ns() - t0

    def heads_compute(
        self, layer: int, heads: list[int], x: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, int]:
        """This worker's heads of ``layer`` on X: their outputs concatenated in head order, and the
        compute time."""
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            hw = {h: self.units[Unit(layer, "head", h).key()] for h in heads}
            slots = {kvh: self.slots[(layer, kvh)] for kvh in {self.cfg.kv_head_of(h) for h in heads}}
            outs = model.heads_forward(self.cfg, hw, slots, x, start_pos)
            out = torch.cat([outs[h] for h in sorted(heads)], dim=-1)
        return out, time.perf_counter_ns() - t0

    def proj_compute(
        self, layer: int, parts: list[tuple[torch.Tensor, list[int]]], x: torch.Tensor
    ) -> tuple[torch.Tensor, int]:
        """Z = X + proj(every head's output, in head order), from each head worker's outputs."""
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            by_head: dict[int, torch.Tensor] = {}
            for t, hs in parts:
                by_head.update(zip(sorted(hs), torch.split(t, self.cfg.head_dim, dim=-1), strict=True))
            concat = torch.cat([by_head[h] for h in range(self.cfg.n_heads)], dim=-1)
            z = x + model.proj(self.cfg, self.units[Unit(layer, "proj").key()], concat)
        return z, time.perf_counter_ns() - t0

    def ffn_compute(self, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        """X = Z + FFN(Z) and ||FFN(Z)|| / ||Z|| for the speculation test."""
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            d = model.ffn(self.cfg, self.units[Unit(layer, "ffn").key()], z)
            ratio = model.ffn_ratio(d, z)
            x = z + d
        return x, ratio, time.perf_counter_ns() - t0

    def heads(
        self, layer: int, heads: list[int], x_ref: Ref, start_pos: int, out: str
    ) -> tuple[None, int, int]:
        """(rpc control) This worker's heads of ``layer`` on X (pulled from its holder); the outputs,
        concatenated in head order, are stored as ``out``. Returns (None, compute_ns, fetch_ns)."""
        t0 = time.perf_counter_ns()
        x = self._get(x_ref)
        fetch_ns = time.perf_counter_ns() - t0
        t, ns = self.heads_compute(layer, heads, x, start_pos)
        store_put(self.store, out, t)
        return None, ns, fetch_ns

    def proj(
        self, layer: int, parts: list[tuple[Ref, list[int]]], x_ref: Ref, out: str
    ) -> tuple[None, int, int]:
        """(rpc control) The gather: pull every head worker's outputs and X, then Z = X + proj(heads
        in order), stored as ``out``."""
        t0 = time.perf_counter_ns()
        pulled = [(self._get(ref), hs) for ref, hs in parts]
        x = self._get(x_ref)
        fetch_ns = time.perf_counter_ns() - t0
        z, ns = self.proj_compute(layer, pulled, x)
        store_put(self.store, out, z)
        return None, ns, fetch_ns

    def ffn(self, layer: int, z_ref: Ref, out: str) -> tuple[float, int, int]:
        """(rpc control) X = Z + FFN(Z), stored as ``out``; returns ||FFN(Z)|| / ||Z||."""
        t0 = time.perf_counter_ns()
        z = self._get(z_ref)
        fetch_ns = time.perf_counter_ns() - t0
        x, ratio, ns = self.ffn_compute(layer, z)
        store_put(self.store, out, x)
        return ratio, ns, fetch_ns

    # -- dataflow control (headsplit.dataflow)
    def configure(self, plan: dataflow.Plan) -> tuple[None, int]:
        """The routes to follow from the next step on (sent whenever the placement changes)."""
        t0 = time.perf_counter_ns()
        if self.node is None:
            self.node = dataflow.Node(self, plan)
        else:
            self.node.plan = plan
        return None, time.perf_counter_ns() - t0

    def deliver(
        self, msg: dataflow.Msg, push: Callable[[dataflow.Msg], None] | None = None
    ) -> list[dataflow.Msg]:
        """One pushed message in; the messages this worker pushes on (to other processes) pushed
        with ``push`` as each is produced, else returned (``dataflow.Node.deliver``)."""
        if self.node is None:
            raise RuntimeError(f"{self.name}: a dataflow message before configure")
        return self.node.deliver(msg, push)

    def report(self, step: int) -> tuple[tuple[int, list[dict[str, Any]]], int]:
        """Between tokens: the bytes held (as ``nbytes``) and this worker's stage records of ``step``."""
        t0 = time.perf_counter_ns()
        n, _ = self.nbytes()
        recs = self.node.records(step) if self.node is not None else []
        return (n, recs), time.perf_counter_ns() - t0

    def nbytes(self) -> tuple[int, int]:
        """Bytes held: unit weights + KV copies (weights and cache)."""
        t0 = time.perf_counter_ns()
        n = sum(_nbytes(t) for w in self.units.values() for t in w.values())
        n += sum(s.nbytes() for s in self.slots.values())
        return n, time.perf_counter_ns() - t0


def slots_needed(cfg: ModelConfig, units: Iterable[Unit]) -> set[SlotKey]:
    """KV slots a worker must hold: one copy of each KV head of which it holds a query head."""
    return {(u.layer, cfg.kv_head_of(u.head)) for u in units if u.kind == "head"}


def share_tensor_names(cfg: ModelConfig, units: Iterable[Unit]) -> set[str]:
    us = list(units)
    names = {n for u in us for n in model.unit_tensor_names(cfg, u)}
    names |= {n for (layer, _) in slots_needed(cfg, us) for n in model.kv_tensor_names(cfg, layer)}
    return names


def share_from(
    cfg: ModelConfig, src: model.TensorSource, units: Iterable[Unit]
) -> tuple[dict[str, model.Weights], dict[SlotKey, tuple[model.Weights, torch.Tensor, torch.Tensor]]]:
    """The weights a worker needs for ``units``, read from ``src`` one unit (and KV copy) at a time, in
    ``WorkerState.load``'s format (empty caches): nothing but what it keeps is ever whole in memory."""
    us = sorted(units)  # a layer's heads in order: consecutive rows of its Wq
    unit_w = {u.key(): model.unit_weights_from(cfg, src, u) for u in us}
    slots = {
        (layer, kvh): (model.kv_weights_from(cfg, src, layer, kvh), torch.empty(0), torch.empty(0))
        for layer, kvh in sorted(slots_needed(cfg, us))
    }
    return unit_w, slots


def build_share(
    cfg: ModelConfig, w: model.Weights, units: Iterable[Unit]
) -> tuple[dict[str, model.Weights], dict[SlotKey, tuple[model.Weights, torch.Tensor, torch.Tensor]]]:
    """:func:`share_from` weights already in memory (which hold at least ``share_tensor_names``)."""
    return share_from(cfg, model.WeightsSource(w), units)


def load_share(
    cfg: ModelConfig, checkpoint: Mapping[str, str] | None, units: Iterable[Unit]
) -> tuple[dict[str, model.Weights], dict[SlotKey, tuple[model.Weights, torch.Tensor, torch.Tensor]]]:
    """A worker's set-up: its units' seeded weights, or the checkpoint verified by its SHA-256 and then
    read unit by unit (:class:`headsplit.model.CheckpointSource`)."""
    if not checkpoint:
        return share_from(cfg, model.SeededSource(cfg), units)
    path = Path(checkpoint["path"])
    ckpt.verify(path, checkpoint["sha256"])
    return share_from(cfg, model.CheckpointSource(cfg, path), units)


#: Seconds :func:`time_unit_steps` spends at least: five periods of a CFS quota (100 ms), so that a
#: worker under a CPU share is timed at the rate it sustains, stalls included.
UNIT_STEPS_S = 0.5
UNIT_STEPS_MIN_ROUNDS = 4  # the first warms up: at least 3 timed


def time_unit_steps(
    cfg: ModelConfig, context_tokens: int, seconds: float = UNIT_STEPS_S
) -> tuple[float, float, float]:
    """Seconds this process takes for one decode step of a layer's heads (every query head and KV
    copy of the layer, as ``heads_compute`` runs them on one worker), of its projection and of its
    FFN, at ``context_tokens`` tokens of context: the calls a worker makes per token, on the model's
    own shapes, so per-call dispatch is in the time as it is in a run (a 64-wide head's decode step is
    a dozen small kernels: timed by one large matmul's rate, it looks 20-60 times cheaper than it is).

    The three run in turn, round after round, for at least ``seconds``: under a CPU quota a stall
    lands on each kind in proportion to its time, not all on whichever ran last."""
    layer = [u for u in all_units(cfg) if u.layer == 0]
    st = WorkerState("bench", cfg)
    st.load(*share_from(cfg, model.FilledSource(cfg), layer))
    past = max(context_tokens - 1, 0)
    cache = torch.full((past, cfg.head_dim), model.INIT_STD)
    heads = list(range(cfg.n_heads))
    x = torch.randn((1, cfg.hidden), generator=torch.Generator().manual_seed(cfg.seed))
    spent = [0, 0, 0]
    rounds, t0 = 0, time.perf_counter()
    while rounds < UNIT_STEPS_MIN_ROUNDS or time.perf_counter() - t0 < seconds:
        for slot in st.slots.values():  # the caches as the step before left them (heads appends one)
            slot.k, slot.v = cache, cache
        out, heads_ns = st.heads_compute(0, heads, x, past)
        z, proj_ns = st.proj_compute(0, [(out, heads)], x)
        _, _, ffn_ns = st.ffn_compute(0, z)
        if rounds:  # the first round warms the kernels and the allocator up
            spent = [spent[0] + heads_ns, spent[1] + proj_ns, spent[2] + ffn_ns]
        rounds += 1
    return (spent[0] * 1e-9 / (rounds - 1), spent[1] * 1e-9 / (rounds - 1), spent[2] * 1e-9 / (rounds - 1))


def units_of(placement: Placement, worker: str) -> list[Unit]:
    return sorted(u for u, w in placement.items() if w == worker)


def check_placement(cfg: ModelConfig, placement: Placement, workers: Iterable[str]) -> None:
    names = set(workers)
    missing = [u.key() for u in all_units(cfg) if u not in placement]
    if missing:
        raise ValueError(
            f"placement: units without a worker: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    unknown = sorted({w for w in placement.values() if w not in names})
    if unknown:
        raise ValueError(
            f"placement: unknown worker(s) {', '.join(unknown)}; workers are {', '.join(sorted(names))}"
        )


# ------------------------------------------------------------------------------ in-process transport


@dataclass
class Done:
    """A call already executed in this process."""

    value: Any
    issued_ns: int
    finished_ns: int

    def result(self) -> Any:
        return self.value

    @property
    def done_ns(self) -> int:
        return self.finished_ns


class InProcessTransport:
    """Workers as objects in this process; calls run when issued (one after another)."""

    def __init__(self, states: Mapping[str, WorkerState]) -> None:
        self.states = dict(states)
        self.store: dict[str, torch.Tensor] = {}
        for st in self.states.values():
            st.fetch = self.fetch

    def publish(self, key: str, t: torch.Tensor) -> None:
        store_put(self.store, key, t)

    def fetch(self, owner: str, key: str) -> torch.Tensor:
        return self.store[key] if owner == CONTROLLER else self.states[owner].store[key]

    @classmethod
    def from_weights(
        cfg_cls, cfg: ModelConfig, w: model.Weights, placement: Placement, workers: Iterable[str]
    ) -> InProcessTransport:
        states = {}
        for name in workers:
            st = WorkerState(name, cfg)
            st.load(*build_share(cfg, w, units_of(placement, name)))
            states[name] = st
        return cfg_cls(states)

    def call(self, worker: str, method: str, *args: Any) -> Pending:
        t0 = time.perf_counter_ns()
        value = getattr(self.states[worker], method)(*args)
        return Done(value, t0, time.perf_counter_ns())

    def send(self, msg: dataflow.Msg) -> None:
        """One pushed message between processes (a counting transport overrides it; ``delivering`` is
        the message whose delivery sent it, None for the controller's start)."""
        self._queue.append(msg)

    def next_message(self) -> dataflow.Msg:
        """The message delivered next: the oldest (a test may deliver them in another order)."""
        return self._queue.popleft()

    def run_step(self, msgs: list[dataflow.Msg]) -> dataflow.Msg:
        """The workers' pushes run here one message at a time, in the order they were sent."""
        self._queue: deque[dataflow.Msg] = deque()
        self.delivering: dataflow.Msg | None = None
        for m in msgs:
            self.send(m)
        last: dataflow.Msg | None = None
        while self._queue:
            m = self.delivering = self.next_message()
            if m.dst == CONTROLLER:
                last = m
                continue
            self.states[m.dst].deliver(m, self.send)
        if last is None:
            raise RuntimeError("dataflow: the step ended without its last X reaching the controller")
        return last


# ----------------------------------------------------------------------------------------- engine

MemoryCheck = Callable[[int, str, int, int], bool]  # (token, worker, bytes, limit) -> re-place?
Replan = Callable[[Placement, int], Placement]  # (current, tokens so far) -> new placement


def threshold_check(threshold: float = 0.85) -> MemoryCheck:
    """The default re-placement trigger: a worker above ``threshold`` of its limit (0 = no limit)."""

    def check(token: int, worker: str, used: int, limit: int) -> bool:
        return limit > 0 and used > threshold * limit

    return check


@dataclass
class EngineOptions:
    speculation: bool = False
    tau: float = DEFAULT_TAU
    speculate_layers: frozenset[int] | None = None  # source layers l of l -> l+1; None: every one
    memory_limits: dict[str, int] = field(default_factory=dict)  # worker -> bytes; 0/absent: none
    memory_check: MemoryCheck = field(default_factory=threshold_check)
    replan: Replan | None = None
    # "dataflow": one start message per token, the workers push to each other (headsplit.dataflow);
    # "rpc": the controller calls every stage of every layer and waits (kept for comparison)
    control: str = "dataflow"


@dataclass
class EngineResult:
    tokens: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    replacements: list[dict[str, Any]] = field(default_factory=list)
    oom: dict[str, Any] | None = None
    replacement_errors: list[dict[str, Any]] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class Perplexity:
    """A teacher-forced pass over a paragraph: ``tokens`` predictions (token t + 1 given tokens <= t), the
    sum of their negative log-likelihoods (nats), and the speculation it went through."""

    tokens: int
    nll_sum: float
    speculated: int
    accepted: int

    @property
    def nll_mean(self) -> float:
        return self.nll_sum / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_mean)


class _Token:
    """Accumulates one token's timings and bytes."""

    def __init__(self) -> None:
        self.t = dict.fromkeys(
            (
                "attention_ns",
                "projection_ns",
                "ffn_ns",
                "gather_ns",
                "broadcast_ns",
                "reexec_ns",
                "speculative_ns",
                "zforward_ns",
                "control_ns",
                "controller_ns",
                "critical_ns",
                "comm_ns",
            ),
            0,
        )
        self.hops = 0  # dataflow: the messages on the token's longest chain
        self.bytes: dict[str, int] = {}
        self.speculated: list[int] = []
        self.accepted: list[int] = []
        self.rejected: list[int] = []
        self.ratios: dict[str, float] = {}

    def send(self, src: str, dst: str, n: int) -> None:
        if src != dst and n:
            key = f"{src}>{dst}"
            self.bytes[key] = self.bytes.get(key, 0) + n


class Engine:
    def __init__(
        self,
        cfg: ModelConfig,
        transport: Transport,
        placement: Placement,
        controller_weights: model.Weights,
        options: EngineOptions | None = None,
    ) -> None:
        self.cfg = cfg
        self.transport = transport
        self.options = options or EngineOptions()
        self.w = controller_weights
        self.workers = sorted(set(placement.values()) | set(self.options.memory_limits))
        check_placement(cfg, placement, self.workers)
        self.placement = dict(placement)
        self.result = EngineResult()
        self.migration_bytes: dict[str, int] = {}
        self._step = 0  # forward passes so far: the prefix of activation keys
        if self.options.control not in dataflow.CONTROLS:
            raise ValueError(f"control: one of {', '.join(dataflow.CONTROLS)}, got {self.options.control!r}")
        self._plan: dataflow.Plan | None = None  # dataflow: the routes the workers have (None: send them)

    # -- placement lookups
    def _head_workers(self, layer: int) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for h in range(self.cfg.n_heads):
            out.setdefault(self.placement[Unit(layer, "head", h)], []).append(h)
        return out

    def _speculates(self, layer: int) -> bool:
        o = self.options
        if not o.speculation or layer + 1 >= self.cfg.n_layers:
            return False
        return o.speculate_layers is None or layer in o.speculate_layers

    # -- one layer's attention
    def _issue_heads(
        self, layer: int, x_ref: Ref, start: int, name: str
    ) -> list[tuple[Ref, list[int], Pending]]:
        out = []
        for w, hs in self._head_workers(layer).items():
            key = f"{self._step}:{name}@{w}"
            out.append(((w, key), hs, self.transport.call(w, "heads", layer, hs, x_ref, start, key)))
        return out

    def _collect_heads(
        self, pend: list[tuple[Ref, list[int], Pending]], tok: _Token, compute_field: str
    ) -> tuple[list[tuple[Ref, list[int]]], int]:
        """Wait for a layer's head calls: the slowest worker's compute goes to ``compute_field``, the
        slowest pull of X to broadcast_ns; returns the parts for the gather and that compute."""
        slowest = fetch = control = 0
        for _, _, p in pend:
            _, ns, fns = p.result()
            slowest, fetch = max(slowest, ns), max(fetch, fns)
            control = max(control, p.done_ns - p.issued_ns - ns - fns)
        tok.t[compute_field] += slowest
        tok.t["broadcast_ns"] += fetch
        tok.t["control_ns"] += max(control, 0)
        return [(ref, hs) for ref, hs, _ in pend], slowest

    def _send_x(self, tok: _Token, src: str, layer: int, n: int, heads_too: bool) -> None:
        """Account X (``n`` bytes) going from its holder to layer ``layer``'s projection worker (and
        head workers)."""
        dsts = {self.placement[Unit(layer, "proj")]}
        if heads_too:
            dsts |= set(self._head_workers(layer))
        for d in dsts:
            tok.send(src, d, n)

    def _timed(self, p: Pending, tok: _Token, compute_field: str, fetch_field: str) -> Any:
        value, ns, fns = p.result()
        tok.t[compute_field] += ns
        tok.t[fetch_field] += fns
        tok.t["control_ns"] += max(p.done_ns - p.issued_ns - ns - fns, 0)
        return value

    def step(self, ids: list[int], start: int) -> tuple[torch.Tensor, _Token]:
        """One forward pass over ``ids`` at positions start.. (the prefill, or one new token)."""
        if self.options.control == "dataflow":
            return self._step_dataflow(ids, start)
        return self._step_rpc(ids, start)

    def _configure(self) -> dataflow.Plan:
        """Send the routes of the current placement to every worker (before the first token and after
        a re-placement: between tokens)."""
        if self._plan is None:
            plan = dataflow.make_plan(self.cfg, self.placement, self._speculates, self.options.tau)
            for p in [self.transport.call(w, "configure", plan) for w in self.workers]:
                p.result()
            self._plan = plan
        return self._plan

    def _step_dataflow(self, ids: list[int], start: int) -> tuple[torch.Tensor, _Token]:
        cfg, tok = self.cfg, _Token()
        plan = self._configure()
        self._step += 1
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            x0 = model.embed(cfg, self.w, ids, start)
        t1 = time.perf_counter_ns()
        msgs = [
            dataflow.Msg("x", self._step, 0, start, 0, CONTROLLER, w, x0)
            for w in dataflow.first_consumers(plan)
        ]
        for m in msgs:
            tok.send(CONTROLLER, m.dst, m.nbytes())
        t2 = time.perf_counter_ns()
        last = self.transport.run_step(msgs)
        t3 = time.perf_counter_ns()
        assert last.t is not None  # its bytes are in the FFN worker's records (fold_records)
        with torch.no_grad():
            logits = model.lm_logits(cfg, self.w, last.t[-1])
        t4 = time.perf_counter_ns()
        tok.t["controller_ns"] = (t1 - t0) + (t4 - t3)
        tok.t["control_ns"] = t2 - t1
        tok.t["critical_ns"] = last.path_ns
        tok.hops = last.hops
        for layer, ratio, kept in last.verdicts:
            tok.speculated.append(layer)
            tok.ratios[str(layer)] = ratio
            (tok.accepted if kept else tok.rejected).append(layer)
        return logits, tok

    def _step_rpc(self, ids: list[int], start: int) -> tuple[torch.Tensor, _Token]:
        cfg, tok = self.cfg, _Token()
        self._step += 1
        key = f"{self._step}:x-1"
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            self.transport.publish(key, model.embed(cfg, self.w, ids, start))
        tok.t["controller_ns"] += time.perf_counter_ns() - t0
        x_ref: Ref = (CONTROLLER, key)
        row_bytes = len(ids) * cfg.hidden * 4  # X and Z: [tokens of this step, hidden] float32
        head_bytes = len(ids) * cfg.head_dim * 4
        self._send_x(tok, CONTROLLER, 0, row_bytes, heads_too=True)
        parts: list[tuple[Ref, list[int]]] | None = None
        for layer in range(cfg.n_layers):
            pw = self.placement[Unit(layer, "proj")]
            fw = self.placement[Unit(layer, "ffn")]
            if parts is None:
                parts, ns = self._collect_heads(
                    self._issue_heads(layer, x_ref, start, f"h{layer}"), tok, "attention_ns"
                )
                tok.t["critical_ns"] += ns
            before = tok.t["projection_ns"]
            for (w, _), hs in parts:
                tok.send(w, pw, len(hs) * head_bytes)
            z_ref: Ref = (pw, f"{self._step}:z{layer}")
            self._timed(
                self.transport.call(pw, "proj", layer, parts, x_ref, z_ref[1]),
                tok,
                "projection_ns",
                "gather_ns",
            )
            tok.send(pw, fw, row_bytes)
            tok.t["critical_ns"] += tok.t["projection_ns"] - before
            before = tok.t["ffn_ns"]
            spec = self._speculates(layer)
            fp = self.transport.call(fw, "ffn", layer, z_ref, f"{self._step}:x{layer}")
            spec_pend: list[tuple[Ref, list[int], Pending]] = []
            if spec:
                spec_pend = self._issue_heads(layer + 1, z_ref, start, f"s{layer + 1}")
                for w in self._head_workers(layer + 1):
                    tok.send(pw, w, row_bytes)
            ratio = float(self._timed(fp, tok, "ffn_ns", "zforward_ns"))
            x_ref = (fw, f"{self._step}:x{layer}")
            parts = None
            ffn_ns = tok.t["ffn_ns"] - before
            tok.t["critical_ns"] += ffn_ns
            if spec:
                tok.speculated.append(layer)
                tok.ratios[str(layer)] = ratio
                spec_parts, spec_ns = self._collect_heads(spec_pend, tok, "speculative_ns")
                # the speculative heads ran beside the FFN: the longer of the two is on the path
                tok.t["critical_ns"] += max(spec_ns - ffn_ns, 0)
                if ratio < self.options.tau:
                    tok.accepted.append(layer)
                    tok.t["attention_ns"] += spec_ns
                    parts = spec_parts
                    self._send_x(tok, fw, layer + 1, row_bytes, heads_too=False)
                else:
                    tok.rejected.append(layer)
                    self._send_x(tok, fw, layer + 1, row_bytes, heads_too=True)
                    parts, ns = self._collect_heads(
                        self._issue_heads(layer + 1, x_ref, start, f"h{layer + 1}"), tok, "reexec_ns"
                    )
                    tok.t["critical_ns"] += ns
            elif layer + 1 < cfg.n_layers:
                self._send_x(tok, fw, layer + 1, row_bytes, heads_too=True)
        x = self.transport.fetch(*x_ref)
        tok.send(x_ref[0], CONTROLLER, row_bytes)
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            logits = model.lm_logits(cfg, self.w, x[-1])
        tok.t["controller_ns"] += time.perf_counter_ns() - t0
        return logits, tok

    # -- migration
    def migrate(self, new: Placement) -> dict[str, int]:
        """Move units (weights) and KV slots (weights + cache) to match ``new``; returns counts."""
        check_placement(self.cfg, new, self.workers)
        t0 = time.perf_counter_ns()
        cfg, old = self.cfg, self.placement
        moved = [u for u in all_units(cfg) if old[u] != new[u]]
        old_slots = {w: slots_needed(cfg, units_of(old, w)) for w in self.workers}
        new_slots = {w: slots_needed(cfg, units_of(new, w)) for w in self.workers}
        # (src, dst) -> (unit keys, slot keys)
        plan: dict[tuple[str, str], tuple[list[str], list[SlotKey]]] = {}
        for u in moved:
            plan.setdefault((old[u], new[u]), ([], []))[0].append(u.key())
        for dst in self.workers:
            for s in sorted(new_slots[dst] - old_slots[dst]):
                layer, kvh = s
                srcs = [old[Unit(layer, "head", h)] for h in range(cfg.n_heads) if cfg.kv_head_of(h) == kvh]
                src = next(w for w in srcs if w != dst)
                plan.setdefault((src, dst), ([], []))[1].append(s)
        nbytes = 0
        for (src, dst), (ukeys, skeys) in sorted(plan.items()):
            payload, _ = self.transport.call(src, "export", ukeys, skeys).result()
            self.transport.call(dst, "load", *payload).result()
            n = _tree_bytes(payload)
            nbytes += n
            self.migration_bytes[f"{src}>{dst}"] = self.migration_bytes.get(f"{src}>{dst}", 0) + n
        for w in self.workers:
            keep_u = [u.key() for u in units_of(new, w)]
            self.transport.call(w, "retain", keep_u, sorted(new_slots[w])).result()
        self.placement = dict(new)
        self._plan = None  # the workers get the new routes before the next token (dataflow)
        return {"moved_units": len(moved), "migration_ns": time.perf_counter_ns() - t0, "bytes": nbytes}

    # -- memory
    def _samples(self, tok: _Token) -> dict[str, int]:
        """Every worker's bytes after the token. Dataflow: one ``report`` call to every worker at once
        (between tokens, off the token's path), whose stage records give the token's timings; rpc: a
        ``nbytes`` call to each worker in turn."""
        if self.options.control == "rpc":
            return {w: int(self.transport.call(w, "nbytes").result()[0]) for w in self.workers}
        pend = {w: self.transport.call(w, "report", self._step) for w in self.workers}
        samples, records = {}, {}
        for w, p in pend.items():
            (n, recs), _ = p.result()
            samples[w], records[w] = int(n), recs
        dataflow.fold_records(records, tok.t, tok.send)
        return samples

    def _memory(self, index: int, samples: dict[str, int]) -> tuple[str, int, int] | None:
        """Record the samples; re-place if a worker needs it; return (worker, bytes, limit) on OOM."""
        for w, n in samples.items():
            self.result.memory.append({"token": index, "worker": w, "bytes": n})
        limits = self.options.memory_limits
        for w, n in samples.items():
            if limits.get(w, 0) and n > limits[w]:
                return w, n, limits[w]
        due = [w for w, n in samples.items() if self.options.memory_check(index, w, n, limits.get(w, 0))]
        if due and self.options.replan is not None:
            t0 = time.perf_counter_ns()
            try:
                new = self.options.replan(self.placement, index + 1)
            except ValueError as exc:  # no feasible placement: keep this one (an OOM may follow)
                self.result.replacement_errors.append({"token": index, "worker": due[0], "error": str(exc)})
                return None
            planning = time.perf_counter_ns() - t0
            if new != self.placement:
                info = self.migrate(new)
                self.result.replacements.append(
                    {"token": index, "worker": due[0], "planning_ns": planning, **info}
                )
        return None

    # -- quality
    def perplexity(self, ids: list[int]) -> Perplexity:
        """The teacher-forced perplexity of ``ids`` as this engine runs: token t is fed as one decode
        step at position t (placement, workers and speculation at tau exactly as a generated token sees
        them: one speculation decision per layer transition per token), and the step's logits give the
        log-probability of token t + 1. Starts the KV caches again from position 0 (a generation before
        it is over); no memory sampling or re-placement. perplexity = exp(mean negative log-likelihood).
        """
        if len(ids) < 2:
            raise ValueError(f"perplexity: at least 2 tokens are needed, got {len(ids)}")
        model.check_positions(self.cfg, len(ids) - 1, 1)
        nll, speculated, accepted = 0.0, 0, 0
        for t in range(len(ids) - 1):
            logits, tok = self.step([ids[t]], t)
            with torch.no_grad():
                logp = torch.log_softmax(logits.double(), dim=-1)
            nll -= float(logp[ids[t + 1]])
            speculated += len(tok.speculated)
            accepted += len(tok.accepted)
        return Perplexity(len(ids) - 1, nll, speculated, accepted)

    # -- the loop
    def generate(self, prompt_ids: list[int], n_tokens: int) -> EngineResult:
        model.check_positions(self.cfg, len(prompt_ids), n_tokens)
        res = self.result
        ids, start = list(prompt_ids), 0
        for index in range(n_tokens):
            t0 = time.perf_counter_ns()
            logits, tok = self.step(ids, start)
            nxt = int(torch.argmax(logits))
            total = time.perf_counter_ns() - t0
            oom = self._memory(index, self._samples(tok))
            tok.t["comm_ns"] = max(total - tok.t["critical_ns"] - tok.t["controller_ns"], 0)
            if oom is not None:
                res.oom = {"token": index, "worker": oom[0], "bytes": oom[1], "limit_bytes": oom[2]}
                break
            res.generated.append(nxt)
            res.logits.append(logits)
            rec: dict[str, Any] = {"index": index, "token_id": nxt, "total_ns": total, **tok.t}
            rec.update(
                speculated=tok.speculated,
                accepted=tok.accepted,
                rejected=tok.rejected,
                ratios=tok.ratios,
                bytes=tok.bytes,
            )
            if self.options.control == "dataflow":
                rec["critical_messages"] = tok.hops
            res.tokens.append(rec)
            start += len(ids)
            ids = [nxt]
        return res
