"""The discrete-event simulation of decoder-only generation over N heterogeneous devices (SimPy).

One token at a time (autoregressive decoding: token ``t + 1`` needs token ``t``), each layer as HeadSplit
runs it:

1. **broadcast** - every device holding a query head of layer ``l`` receives the layer input X
   (``4 * hidden`` bytes) from the device of the previous layer's FFN (the controller for layer 0);
2. **attention** - each such device computes its heads of the layer one after the other, and once per
   (layer, KV head) group the k and v of the new token (grouped-query attention replicates the KV head on
   every device holding a head of its group);
3. **gather** - each head device sends its heads' outputs (``4 * head_dim`` bytes each) to the device of
   the layer's projection, which also receives X for the residual; the projection starts when all arrived;
4. **projection**, Z (``4 * hidden`` bytes) to the FFN's device, **FFN**; the last FFN's output goes back
   to the controller, which closes the token.

That is ``control = "dataflow"``, HeadSplit's dataflow design (DESIGN.md section 9): each stage pushes
its output to its consumers, one way, and the FFN's worker decides a speculation (its verdict travels
with X). A token's critical path then holds W + 1 messages layer-wise over W workers, and head-level
over L layers 3 a layer at most (X to the head workers, head outputs to the projection's worker, Z to
the FFN's) plus the last X home, 3L + 1 (the design's bound is 3L + 2); an accepted speculation takes
one a layer off it. :attr:`SimResult.messages` and ``critical_messages`` count them.
``control = "rpc"`` is how HeadSplit's
controller runs it (``headsplit.engine.Engine.step``): it calls every stage by RPC and waits for it (a
round trip to the worker each), the callee pulls its inputs by RPC from their holders (a round trip to
each: the projection pulls the other workers' head outputs and X one after the other), a worker runs one
call at a time, pulls included (the worker's call lock), and the controller fetches the last X. Per
layer: one heads call per worker holding a head of it, one projection call, one FFN call; speculating,
the next layer's heads calls go out with the FFN's, on Z. :attr:`SimResult.calls` and ``pulls`` count
them.

Costs. A unit's compute time on device ``w`` is its FLOPs at the token's context length (HeadSplit's
:func:`headsplit.placement.unit_flops`, :func:`~headsplit.placement.kv_flops`) over ``w``'s
``flops_per_s``, plus ``w``'s ``call_overhead_s`` once per call (one call per device per stage). A
message of ``b`` bytes from ``a`` to ``c`` costs, pushed (dataflow), half the link's round trip, and
pulled (an RPC's pull, a migration), the whole round trip, plus ``b`` over the link's bandwidth; the
bandwidth part holds the directed link (two messages on one link queue), the latency does not. A
device computes one unit at a time. Under a CPU quota (``Device.cpu_quota_s`` per ``cpu_period_s``, a
local run's cgroup ``cpu_share``) those times are CPU time, and the device's wall time follows from its
quota (:meth:`_Run.busy`).

Memory: after each token, every device's bytes at the new context length
(:func:`headsplit.placement.bytes_by_worker`: weights, one KV copy per group it holds, the cache growing
one token per step). Over ``threshold * memory_bytes`` with re-placement on, HeadSplit's
:func:`~headsplit.placement.replace` moves units and the migration's bytes cross the links before the
next token; over ``memory_bytes`` without it, generation stops there (out of memory), as a real run would.
"""

from __future__ import annotations

import math
import random
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import simpy

from dit.sim.placement_model import (
    DTYPE_BYTES,
    ModelConfig,
    Placement,
    PlacementError,
    bytes_by_worker,
    kv_flops,
    migration_bytes,
    moves,
    replace,
    unit,
    unit_flops,
    worker_spec,
)

CONTROLLER = "controller"
KINDS = ("head", "proj", "ffn")
CONTROLS = ("dataflow", "rpc")
WORKER_RTTS = ("mean", "sum")


@dataclass(frozen=True)
class Device:
    """One worker: its speed, its memory limit, its access link."""

    name: str
    flops_per_s: float
    memory_bytes: int
    rtt_s: float  # round trip to the controller
    bandwidth_bytes_per_s: float
    call_overhead_s: float = 0.0  # fixed cost of one call (framework, RPC handling), per stage
    # (head, proj, ffn) FLOP/s measured per unit kind (a profile run's heads.csv, headsplit.profile_costs);
    # None: flops_per_s for every kind. A head's KV copy runs at the head rate (as HeadSplit costs it).
    unit_flops_per_s: tuple[float, float, float] | None = None
    # a CFS bandwidth quota (the cgroup CPU quota of a local run's cpu_share): at most cpu_quota_s of CPU
    # time per cpu_period_s, after which the device waits for the next period (the budget is refilled to
    # the quota at every multiple of the period, unused time expires). None: no quota. With a quota, the
    # compute times (FLOPs over the rates) and the per-call cost are CPU time, and a device's wall time
    # follows from its quota: short work runs at the core's speed while the period's budget lasts,
    # longer work at about quota / period of it.
    cpu_quota_s: float | None = None
    cpu_period_s: float = 0.0
    # control "dataflow": the one-way latency of a message this device pushes, whatever its destination
    # (a link emulator or netem delays what a device sends, not what it receives: a local run's or the
    # emulated rack's device-to-device ping reads the sum of the two devices' delays). None: half the
    # link's round trip, the same both ways.
    send_s: float | None = None

    def rate(self, kind: str, positions: int = 1) -> float:
        """The FLOP/s a unit of ``kind`` (head, proj or ffn) runs at on this device in a pass over
        ``positions`` tokens. The per-kind rates are measured on one-token decode steps, where a small
        unit's time is mostly per-call cost; a prefill over many positions does not pay it per position
        and runs at ``flops_per_s``."""
        if self.unit_flops_per_s is None or positions > 1:
            return self.flops_per_s
        return self.unit_flops_per_s[KINDS.index(kind)]


@dataclass(frozen=True)
class Link:
    """A measured or assumed link between two endpoints (a device or the controller), both directions."""

    a: str
    b: str
    rtt_s: float
    bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class Network:
    """Round trip and bandwidth between any two endpoints: an explicit :class:`Link` where there is one,
    else the devices' access links (worker to worker through one access point: the mean of their round
    trips, the smaller bandwidth; HeadSplit's placement assumes the same)."""

    devices: Mapping[str, Device]
    links: Mapping[frozenset[str], Link] = field(default_factory=dict)
    controller_bandwidth_bytes_per_s: float = math.inf
    # between two workers without a link: "mean" of their round trips to the controller (every endpoint
    # behind one access point), or "sum" (the controller at the hub: a's access link, then b's)
    worker_rtt: str = "mean"

    def rtt_s(self, a: str, b: str) -> float:
        link = self.links.get(frozenset((a, b)))
        if link is not None:
            return link.rtt_s
        if a == CONTROLLER:
            return self.devices[b].rtt_s
        if b == CONTROLLER:
            return self.devices[a].rtt_s
        both = self.devices[a].rtt_s + self.devices[b].rtt_s
        return both if self.worker_rtt == "sum" else both / 2

    def bandwidth(self, a: str, b: str) -> float:
        link = self.links.get(frozenset((a, b)))
        if link is not None:
            return link.bandwidth_bytes_per_s
        ends = [self.devices[x].bandwidth_bytes_per_s for x in (a, b) if x != CONTROLLER]
        return min([*ends, self.controller_bandwidth_bytes_per_s])


@dataclass(frozen=True)
class SimConfig:
    model: ModelConfig
    devices: Sequence[Device]
    placement: Placement
    tokens: int  # tokens generated (token 0, the prompt's prefill, included when prompt_tokens > 0)
    prompt_tokens: int = 0
    links: Sequence[Link] = ()
    replacement: bool = False
    threshold: float = 0.85
    controller_bandwidth_bytes_per_s: float = math.inf
    # cross-layer speculation: layer l + 1's heads start on layer l's Z while l's FFN runs, and are
    # kept with probability acceptance[l + 1] (cycled when shorter than the model), else re-executed
    speculation: bool = False
    acceptance: Sequence[float] = (1.0,)
    seed: int = 0
    partitioning: str = "headsplit"  # or "galaxy" (dit.sim.galaxy, which ignores ``placement``)
    # "dataflow": each stage pushes its output to the next stage (one way: half a round trip);
    # "rpc": as HeadSplit's controller runs it (headsplit.engine.Engine.step): one RPC from the
    # controller per stage (heads per worker, projection, FFN), each callee pulling its inputs by RPC
    # (the projection one part after the other), stages in turn, and the last X fetched by the controller
    control: str = "dataflow"
    worker_rtt: str = "mean"  # Network.worker_rtt
    # the one-way latency of the controller's pushes (Device.send_s); None: half the link's round trip
    controller_send_s: float | None = None
    # per token (index as token_s), the controller's own compute on the token's path (embedding before
    # it starts the token, LM head after the last X): HeadSplit's controller_ns; none: free
    controller_s: Sequence[float] = ()
    # per token, (head, proj, ffn) FLOP/s of every device in that decode step, in place of the devices'
    # own rates (a replay of a run's own per-token compute times); none or None: the devices' rates
    token_rates: Sequence[tuple[float, float, float] | None] = ()


@dataclass(frozen=True)
class Migration:
    token: int
    moved_units: int
    bytes: int
    seconds: float


@dataclass
class SimResult:
    token_s: list[float]  # simulated latency of each token (token 0: the prefill when there is a prompt)
    memory: list[dict[str, int]]  # each device's bytes after each token
    migrations: list[Migration]
    oom: str | None  # the device that ran out of memory, and when; None when all tokens were generated
    events: int  # simulated events (computations and messages)
    placement: Placement
    speculated: int = 0  # layers whose heads started on the previous layer's Z
    reexecuted: int = 0  # of those, rejected and run again on the true X
    calls: int = 0  # control "rpc": the controller's calls to workers and its fetches of the last X
    pulls: int = 0  # control "rpc": inputs pulled by RPC from another endpoint (each a round trip)
    messages: int = 0  # control "dataflow": messages pushed from one endpoint to another (each one way)
    # control "dataflow", per token: the compute on its longest compute chain (each stage adds its compute
    # to the most of its inputs'), as HeadSplit's critical_ns; the controller's own compute not included
    critical_s: list[float] = field(default_factory=list)
    # control "dataflow", per token: the messages on its critical path (its longest chain of messages,
    # each sent once the one before it arrived, from the controller's start to the last X's return)
    critical_messages: list[int] = field(default_factory=list)
    # control "rpc": after each token, the controller's memory sample (one call to each worker in turn),
    # outside the token's latency as HeadSplit times it, inside its wall time
    between_s: list[float] = field(default_factory=list)
    # per token, the compute (wall) time HeadSplit would record per stage kind: heads (per heads stage the
    # slowest worker's), projections, FFNs; the per-call cost and pulls excluded, as HeadSplit's
    # attention_ns, projection_ns and ffn_ns (+ reexec_ns + speculative_ns: under control "rpc" a kept
    # speculation's heads count twice there, in speculative_ns and attention_ns, and so here; under
    # "dataflow" once)
    stage_s: list[tuple[float, float, float]] = field(default_factory=list)
    # decode steps: per (device, kind) the FLOPs computed and the wall seconds they took ("call": the
    # calls' per-call cost, its FLOPs the number of calls)
    work: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.token_s) + sum(self.between_s)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_s) / self.total_s if self.total_s > 0 else math.inf


class SimError(ValueError):
    """A simulation input that cannot be simulated; the message names the field."""


def _check(cfg: SimConfig) -> dict[str, Device]:
    devices: dict[str, Device] = {}
    for i, d in enumerate(cfg.devices):
        if d.name in devices or d.name == CONTROLLER:
            raise SimError(f"devices[{i}].name: {d.name!r} is used twice or is the controller's name")
        for attr in ("flops_per_s", "bandwidth_bytes_per_s"):
            if not getattr(d, attr) > 0:
                raise SimError(f"devices[{i}].{attr}: must be > 0, got {getattr(d, attr)}")
        if d.rtt_s < 0 or d.call_overhead_s < 0 or d.memory_bytes <= 0:
            raise SimError(f"devices[{i}]: rtt_s and call_overhead_s must be >= 0 and memory_bytes > 0")
        if d.cpu_quota_s is not None and not 0 < d.cpu_quota_s <= d.cpu_period_s:
            raise SimError(
                f"devices[{i}].cpu_quota_s: must be > 0 and <= cpu_period_s ({d.cpu_period_s}), got {d.cpu_quota_s}"
            )
        devices[d.name] = d
    for u, w in cfg.placement.items():
        if w not in devices:
            raise SimError(f"placement: {u.key()} is on {w!r}, not one of the devices {sorted(devices)}")
    if cfg.tokens < 1:
        raise SimError(f"tokens: must be >= 1, got {cfg.tokens}")
    if not cfg.acceptance or any(not 0 <= a <= 1 for a in cfg.acceptance):
        raise SimError(f"acceptance: each probability must be in [0, 1], got {list(cfg.acceptance)}")
    if cfg.control not in CONTROLS:
        raise SimError(f"control: one of {', '.join(CONTROLS)}, got {cfg.control!r}")
    if cfg.worker_rtt not in WORKER_RTTS:
        raise SimError(f"worker_rtt: one of {', '.join(WORKER_RTTS)}, got {cfg.worker_rtt!r}")
    for i, d in enumerate(cfg.devices):
        if d.unit_flops_per_s is not None and (
            len(d.unit_flops_per_s) != len(KINDS) or not all(r > 0 for r in d.unit_flops_per_s)
        ):
            raise SimError(
                f"devices[{i}].unit_flops_per_s: (head, proj, ffn), each > 0, got {d.unit_flops_per_s}"
            )
    return devices


class Chain(NamedTuple):
    """What led to a message or a stage's output since the token started (control "dataflow", as
    HeadSplit's ``Msg.hops`` and ``Msg.path_ns``): the messages on its longest chain of messages, the
    compute on its longest chain of stages."""

    hops: int
    compute_s: float


def joined(chains: Sequence[Chain]) -> Chain:
    """A stage's inputs joined: the longest of each (the two maxima need not be one chain's)."""
    return Chain(max(c.hops for c in chains), max(c.compute_s for c in chains))


class TokenWork(NamedTuple):
    """What one forward pass over ``positions`` new tokens moves and computes, per unit of each kind."""

    hidden_bytes: float  # one hidden state for the new positions (what a stage sends the next)
    head_flops: float  # one attention head
    kv_flops: float  # one KV group's projections
    proj_flops: float  # the attention output projection
    ffn_flops: float  # the feed-forward block


def token_work(m: ModelConfig, context: int, positions: int) -> TokenWork:
    """:class:`TokenWork` of a pass over ``positions`` new tokens attending to ``context`` keys at the
    last of them, for the model ``m`` (the head-level engine's and Galaxy's cost model alike)."""
    # the prefill's mean context is about half its last one; a decode step's is its own
    mean_ctx = context if positions == 1 else max((context + 1) // 2, 1)
    return TokenWork(
        DTYPE_BYTES * m.hidden * positions,
        unit_flops(m, unit(0, "head", 0), mean_ctx) * positions,
        kv_flops(m) * positions,
        unit_flops(m, unit(0, "proj"), mean_ctx) * positions,
        unit_flops(m, unit(0, "ffn"), mean_ctx) * positions,
    )


class _Run:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.devices = _check(cfg)
        self.net = Network(
            self.devices,
            {frozenset((k.a, k.b)): k for k in cfg.links},
            cfg.controller_bandwidth_bytes_per_s,
            cfg.worker_rtt,
        )
        self.env = simpy.Environment()
        self.cpu = {name: simpy.Resource(self.env, capacity=1) for name in self.devices}
        self.wire: dict[tuple[str, str], simpy.Resource] = {}
        self.events = 0
        self.placement: Placement = dict(cfg.placement)
        self.rng = random.Random(cfg.seed)
        self.speculated = self.reexecuted = 0
        self.calls = self.pulls = 0
        self.messages = 0  # control "dataflow": messages pushed between endpoints
        self.critical: Chain | None = None  # control "dataflow": this token's longest chains
        self.token_index = 0
        # the quota's state per device: when the budget was last updated, the budget then
        self.budget: dict[str, tuple[float, float]] = {}
        self.stage = [0.0, 0.0, 0.0]  # this token's stage compute times (heads, proj, ffn)
        self.decoding = False
        self.work: dict[tuple[str, str], tuple[float, float]] = {}
        self._layout()

    def _layout(self) -> None:
        """Per layer: each head device's heads and groups, the projection's and the FFN's device."""
        m = self.cfg.model
        self.layers: list[tuple[dict[str, tuple[int, int]], str, str]] = []
        for layer in range(m.n_layers):
            heads: dict[str, list[int]] = {}
            for h in range(m.n_heads):
                heads.setdefault(self.placement[unit(layer, "head", h)], []).append(h)
            stage = {w: (len(hs), len({m.kv_head_of(h) for h in hs})) for w, hs in heads.items()}
            self.layers.append(
                (stage, self.placement[unit(layer, "proj")], self.placement[unit(layer, "ffn")])
            )

    # -- primitives ----------------------------------------------------------------------------------
    def busy(self, device: str, cpu_s: float) -> Generator[Any, Any, float]:
        """``device`` runs ``cpu_s`` seconds of CPU time: that long without a quota. With one, CFS
        bandwidth control averaged over the period's phase (a token bucket: the budget refills
        continuously at quota / period, up to the quota): at the core's speed while the budget lasts
        (it drains at 1 - share while running), then at the share. Returns the wall time it took."""
        d = self.devices[device]
        if d.cpu_quota_s is None or cpu_s <= 0:
            if cpu_s > 0:
                yield self.env.timeout(cpu_s)
            return max(cpu_s, 0.0)
        share, now = d.cpu_quota_s / d.cpu_period_s, self.env.now
        last, budget = self.budget.get(device, (now, d.cpu_quota_s))
        budget = min(d.cpu_quota_s, budget + share * (now - last))
        if share >= 1 or cpu_s * (1 - share) <= budget:
            wall, budget = cpu_s, budget - cpu_s * (1 - share)
        else:
            fast = budget / (1 - share)
            wall, budget = fast + (cpu_s - fast) / share, 0.0
        self.budget[device] = (now + wall, budget)
        yield self.env.timeout(wall)
        return wall

    def _account(self, device: str, kind: str, flops: float, seconds: float) -> None:
        if self.decoding:
            f, s = self.work.get((device, kind), (0.0, 0.0))
            self.work[(device, kind)] = (f + flops, s + seconds)

    def rate(self, device: str, kind: str, positions: int) -> float:
        """The FLOP/s of a unit of ``kind`` on ``device`` in this pass: the token's own rates when the
        configuration has them for this decode step (:attr:`SimConfig.token_rates`), else the device's."""
        rates = self.cfg.token_rates
        if positions == 1 and self.token_index < len(rates):
            mine = rates[self.token_index]
            if mine is not None:
                return mine[KINDS.index(kind)]
        return self.devices[device].rate(kind, positions)

    def compute(
        self, device: str, seconds: float, kind: str = "", flops: float = 0.0
    ) -> Generator[Any, Any, float]:
        """``device`` runs one stage: its per-call cost, then ``seconds`` of compute (``flops`` of
        ``kind``). Returns the compute's wall time (what HeadSplit's worker times: through a CPU quota
        longer than ``seconds``), the per-call cost not included."""
        self.events += 1
        with self.cpu[device].request() as slot:
            yield slot
            start = self.env.now
            yield from self.busy(device, self.devices[device].call_overhead_s)
            if kind:
                self._account(device, "call", 1.0, self.env.now - start)
            wall: float = yield from self.busy(device, seconds)
            if kind:
                self._account(device, kind, flops, wall)
        return wall

    def send(self, src: str, dst: str, n_bytes: float) -> Generator[Any, Any, None]:
        if src == dst:
            return
        self.events += 1
        yield self.env.timeout(self.net.rtt_s(src, dst))
        yield from self._wire(src, dst, n_bytes)

    def one_way_s(self, src: str, dst: str) -> float:
        """A pushed message's latency from ``src`` to ``dst``: the sender's own (``send_s``) where it is
        given, else half the link's round trip."""
        own = self.cfg.controller_send_s if src == CONTROLLER else self.devices[src].send_s
        return own if own is not None else self.net.rtt_s(src, dst) / 2

    def push(self, src: str, dst: str, n_bytes: float, chain: Chain) -> Generator[Any, Any, Chain]:
        """A message ``src`` sends ``dst`` unasked (control "dataflow"): one way (:meth:`one_way_s`),
        then its bytes over the link. ``chain``: what led to it since the token started; returns it
        with this message (unchanged when ``src`` is ``dst``: no message)."""
        if src == dst:
            return chain
        self.messages += 1
        self.events += 1
        yield self.env.timeout(self.one_way_s(src, dst))
        yield from self._wire(src, dst, n_bytes)
        return Chain(chain.hops + 1, chain.compute_s)

    def _wire(self, src: str, dst: str, n_bytes: float) -> Generator[Any, Any, None]:
        wire = self.wire.get((src, dst))
        if wire is None:
            wire = self.wire[(src, dst)] = simpy.Resource(self.env, capacity=1)
        with wire.request() as slot:
            yield slot
            yield self.env.timeout(n_bytes / self.net.bandwidth(src, dst))

    # -- one token -----------------------------------------------------------------------------------
    def token(self, context: int, positions: int) -> Generator[Any, Any, None]:
        """One forward pass over ``positions`` new tokens (1 when decoding, the prompt for the prefill)
        attending to ``context`` keys at the last of them."""
        own = self.cfg.controller_s
        if self.token_index < len(own) and own[self.token_index] > 0:
            # the controller's embedding and LM head: before the first message and after the last
            yield self.env.timeout(own[self.token_index])
        if self.cfg.control == "rpc":
            yield from self._token_rpc(context, positions)
            return
        m, env = self.cfg.model, self.env
        hidden_b, head_f, kv_f, proj_f, ffn_f = token_work(m, context, positions)
        # where X is, and what led to it since the token started
        src, src_hops = CONTROLLER, Chain(0, 0.0)
        speculative: list[Any] = []  # this layer's head stages, started early on the previous Z
        spec_s: list[float] = []  # their compute times, each worker's
        accepted = False
        for layer, (stage, proj, ffn) in enumerate(self.layers):
            heads_s: list[float] = []
            if speculative and accepted:
                # the heads ran on Z, but for the FFN's worker's own (it ran its FFN first: they run
                # now, on the true X); the projection needs the true X, and the FFN's verdict travels
                # with it
                parts = list(speculative)
                if src in stage:
                    n, g = stage[src]
                    parts.append(
                        env.process(
                            self._heads(src, src, proj, n, g, head_f, kv_f, positions, src_hops, heads_s)
                        )
                    )
                parts.append(env.process(self.push(src, proj, hidden_b, src_hops)))
            else:
                # no speculation, or rejected: the heads run (again) on the true X
                parts = [
                    env.process(self._heads(src, w, proj, n, g, head_f, kv_f, positions, src_hops, heads_s))
                    for w, (n, g) in stage.items()
                ]
                if speculative:
                    self.reexecuted += 1
                if proj not in stage:  # X for the residual; a head worker has it with its heads' X
                    parts.append(env.process(self.push(src, proj, hidden_b, src_hops)))
            yield simpy.AllOf(env, parts)
            # as HeadSplit times a heads stage: its slowest worker's compute (a kept speculation's
            # workers and the FFN's worker's own heads are one stage); a rejected speculation's heads
            # count as well as their re-execution
            if accepted:
                self.stage[0] += max(spec_s + heads_s, default=0.0)
            else:
                self.stage[0] += max(spec_s, default=0.0) + max(heads_s, default=0.0)
            joined_in = joined([p.value for p in parts])
            proj_s = yield env.process(
                self.compute(proj, proj_f / self.rate(proj, "proj", positions), "proj", proj_f)
            )
            self.stage[1] += proj_s
            hops = Chain(joined_in.hops, joined_in.compute_s + proj_s)
            speculative, spec_s, accepted = [], [], False
            next_stage, next_proj, _ = self.layers[min(layer + 1, len(self.layers) - 1)]
            if (
                self.cfg.speculation
                and positions == 1
                and layer + 1 < len(self.layers)
                and set(next_stage) != {ffn}  # the FFN's own worker has no idle time to fill
            ):
                # cross-layer speculation: the projection's worker pushes Z to the next layer's other
                # head workers too, whose heads start on it while the FFN runs (the FFN's worker
                # runs the FFN, the token's critical path, before its own heads); kept with the
                # layer's acceptance probability
                speculative = [
                    env.process(self._heads(proj, w, next_proj, n, g, head_f, kv_f, positions, hops, spec_s))
                    for w, (n, g) in next_stage.items()
                    if w != ffn
                ]
                accepted = self.rng.random() < self.cfg.acceptance[(layer + 1) % len(self.cfg.acceptance)]
                self.speculated += 1
            at_ffn = yield env.process(self.push(proj, ffn, hidden_b, hops))
            ffn_s = yield env.process(
                self.compute(ffn, ffn_f / self.rate(ffn, "ffn", positions), "ffn", ffn_f)
            )
            self.stage[2] += ffn_s
            src, src_hops = ffn, Chain(at_ffn.hops, at_ffn.compute_s + ffn_s)
        self.critical = yield env.process(self.push(src, CONTROLLER, DTYPE_BYTES * m.hidden, src_hops))

    def _heads(
        self,
        src: str,
        w: str,
        proj: str,
        n: int,
        groups: int,
        head_f: float,
        kv_f: float,
        positions: int,
        hops: Chain,
        compute_s: list[float],
    ) -> Generator[Any, Any, Chain]:
        """One worker's heads of a layer: X pushed from ``src``, the heads (their compute time appended
        to ``compute_s``), their outputs pushed to the projection's worker; returns the chain with them
        (``hops`` before it)."""
        m = self.cfg.model
        got = yield self.env.process(self.push(src, w, DTYPE_BYTES * m.hidden * positions, hops))
        flops = n * head_f + groups * kv_f
        seconds = yield self.env.process(
            self.compute(w, flops / self.rate(w, "head", positions), "head", flops)
        )
        compute_s.append(seconds)
        out: Chain = yield self.env.process(
            self.push(
                w, proj, DTYPE_BYTES * m.head_dim * n * positions, Chain(got.hops, got.compute_s + seconds)
            )
        )
        return out

    # -- one token, driven by the controller's RPCs (control "rpc") -----------------------------------
    def call(
        self,
        w: str,
        pulls: Sequence[tuple[str, float]],
        seconds: float,
        *,
        counted: bool = True,
        kind: str = "",
        flops: float = 0.0,
    ) -> Generator[Any, Any, float]:
        """One controller RPC to worker ``w``: the request (half the round trip), then, holding the
        worker (its calls run one at a time, pulls included), its per-call cost, each of ``pulls``
        ((owner, bytes): a round trip to the owner and the bytes over the link) in turn and ``seconds``
        of compute (``flops`` of ``kind``); the reply (the other half). ``counted``: in
        :attr:`SimResult.calls`. Returns the compute's wall time (what HeadSplit's worker times)."""
        self.calls += counted
        self.events += 1
        half = self.net.rtt_s(CONTROLLER, w) / 2
        yield self.env.timeout(half)
        with self.cpu[w].request() as slot:
            yield slot
            start = self.env.now
            yield from self.busy(w, self.devices[w].call_overhead_s)
            if counted:
                self._account(w, "call", 1.0, self.env.now - start)
            for owner, n_bytes in pulls:
                yield from self.pull(w, owner, n_bytes)
            start = self.env.now
            yield from self.busy(w, seconds)
            wall = self.env.now - start
            if kind:
                self._account(w, kind, flops, wall)
        yield self.env.timeout(half)
        return wall

    def pull(self, w: str, owner: str, n_bytes: float) -> Generator[Any, Any, None]:
        """``w`` fetches ``n_bytes`` held by ``owner`` (a worker or the controller) by RPC."""
        if owner == w:
            return
        self.pulls += 1
        yield from self.send(owner, w, n_bytes)

    def _token_rpc(self, context: int, positions: int) -> Generator[Any, Any, None]:
        """headsplit.engine.Engine.step: per layer the heads calls (one per worker holding a head, in
        parallel, each pulling X from its holder), then the projection's call (pulling every other
        worker's head outputs, then X, one after the other), then the FFN's (pulling Z); speculating,
        the next layer's heads calls are issued with the FFN's, on Z, and the controller waits for
        both; the controller fetches the last X."""
        m, env = self.cfg.model, self.env
        hidden_b, head_f, kv_f, proj_f, ffn_f = token_work(m, context, positions)
        head_out_b = DTYPE_BYTES * m.head_dim * positions
        x_owner = CONTROLLER
        parts: dict[str, tuple[int, int]] | None = None  # the heads the projection gathers, by worker
        for layer, (stage, proj, ffn) in enumerate(self.layers):
            if parts is None:
                heads = self._heads_calls(stage, x_owner, head_f, kv_f, hidden_b, positions)
                yield simpy.AllOf(env, heads)
                self.stage[0] += max(float(p.value) for p in heads)
                parts = stage
            gather: list[tuple[str, float]] = [
                (w, n * head_out_b) for w, (n, _) in parts.items() if w != proj
            ]
            gather += [(x_owner, hidden_b)] if x_owner != proj else []
            proj_call = env.process(
                self.call(
                    proj,
                    gather,
                    proj_f / self.rate(proj, "proj", positions),
                    kind="proj",
                    flops=proj_f,
                )
            )
            self.stage[1] += yield proj_call
            ffn_call = env.process(
                self.call(
                    ffn,
                    [(proj, hidden_b)],
                    ffn_f / self.rate(ffn, "ffn", positions),
                    kind="ffn",
                    flops=ffn_f,
                )
            )
            speculate = self.cfg.speculation and positions == 1 and layer + 1 < len(self.layers)
            early = []
            if speculate:
                next_stage = self.layers[layer + 1][0]
                early = self._heads_calls(next_stage, proj, head_f, kv_f, hidden_b, positions)
            self.stage[2] += yield ffn_call
            x_owner, parts = ffn, None
            if speculate:
                yield simpy.AllOf(env, early)
                early_s = max(float(p.value) for p in early)
                self.stage[0] += early_s  # HeadSplit's speculative_ns
                self.speculated += 1
                if self.rng.random() < self.cfg.acceptance[(layer + 1) % len(self.cfg.acceptance)]:
                    parts = next_stage
                    self.stage[0] += early_s  # kept: HeadSplit adds it to attention_ns too
                else:
                    self.reexecuted += 1  # the next layer's heads run again on the true X
        # the controller's fetch of the last X: one RPC round trip and the bytes
        self.calls += 1
        yield from self.send(x_owner, CONTROLLER, DTYPE_BYTES * m.hidden * positions)

    def sample_memory(self) -> Generator[Any, Any, None]:
        """headsplit.engine.Engine._memory: the controller asks every worker for its bytes, one call
        after the other."""
        for w in self.devices:
            yield from self.call(w, [], 0.0, counted=False)

    def _heads_calls(
        self,
        stage: Mapping[str, tuple[int, int]],
        x_owner: str,
        head_f: float,
        kv_f: float,
        x_bytes: float,
        positions: int,
    ) -> list[Any]:
        return [
            self.env.process(
                self.call(
                    w,
                    [(x_owner, x_bytes)],
                    (n * head_f + g * kv_f) / self.rate(w, "head", positions),
                    kind="head",
                    flops=n * head_f + g * kv_f,
                )
            )
            for w, (n, g) in stage.items()
        ]

    # -- memory --------------------------------------------------------------------------------------
    def memory(self, token: int, context: int, result: SimResult) -> bool:
        """Record the devices' bytes at ``context``; re-place or stop when over. False: out of memory."""
        cfg, m = self.cfg, self.cfg.model
        used = bytes_by_worker(m, self.placement, context)
        result.memory.append({d: used.get(d, 0) for d in self.devices})
        over = [d for d, b in used.items() if b > cfg.threshold * self.devices[d].memory_bytes]
        if cfg.replacement and over and token + 1 < cfg.tokens:
            specs = [
                worker_spec(d.name, d.memory_bytes, d.flops_per_s, round(d.rtt_s * 1e9), d.unit_flops_per_s)
                for d in cfg.devices
            ]
            ahead = max(cfg.prompt_tokens + cfg.tokens - context, 1)
            try:
                new = replace(m, specs, self.placement, tokens_so_far=context, tokens_ahead=ahead)
            except PlacementError as exc:
                worker = getattr(exc, "worker", "a worker")  # HeadSplit's PlacementError names it
                result.oom = f"{worker} at token {token}: re-placement found no room ({exc})"
                return False
            moved = moves(self.placement, new)
            if moved:
                n_bytes = migration_bytes(m, self.placement, new, context)
                start = self.env.now
                # each moved unit's share of the bytes crosses its own link; the links run in parallel
                share = n_bytes / len(moved)
                sends = [self.env.process(self.send(a, b, share)) for _, a, b in moved]
                self.env.run(until=simpy.AllOf(self.env, sends))
                result.migrations.append(Migration(token, len(moved), n_bytes, self.env.now - start))
                self.placement = new
                self._layout()
                used = bytes_by_worker(m, self.placement, context)
        for d, b in used.items():
            if b > self.devices[d].memory_bytes:
                limit_mb = self.devices[d].memory_bytes / 1e6
                result.oom = f"{d} at token {token}: {b / 1e6:.1f} MB over its {limit_mb:.1f} MB"
                return False
        return True


def generate(run: _Run, cfg: SimConfig) -> SimResult:
    """``run`` (the head-level engine or a subclass, e.g. Galaxy's) through ``cfg.tokens`` tokens, token
    0 the prompt's prefill when ``prompt_tokens`` > 0, until they end or memory stops them."""
    result = SimResult([], [], [], None, 0, run.placement)
    for t in range(cfg.tokens):
        prefill = t == 0 and cfg.prompt_tokens > 0
        # keys attended: the prompt and the tokens fed so far (token t feeds the one token t-1 produced)
        context = cfg.prompt_tokens + t if cfg.prompt_tokens > 0 else t + 1
        start = run.env.now
        run.stage, run.decoding, run.critical, run.token_index = [0.0, 0.0, 0.0], not prefill, None, t
        run.env.run(until=run.env.process(run.token(context, cfg.prompt_tokens if prefill else 1)))
        result.token_s.append(run.env.now - start)
        if run.critical is not None:
            result.critical_messages.append(run.critical.hops)
            result.critical_s.append(run.critical.compute_s)
        result.stage_s.append((run.stage[0], run.stage[1], run.stage[2]))
        if cfg.control == "rpc":
            start = run.env.now
            run.env.run(until=run.env.process(run.sample_memory()))
            result.between_s.append(run.env.now - start)
        if not run.memory(t, context, result):
            break
    result.events = run.events
    result.placement = run.placement
    result.work = dict(run.work)
    return result


def simulate(cfg: SimConfig) -> SimResult:
    """Simulate ``cfg.tokens`` tokens with HeadSplit's engine (placement, speculation, re-placement)."""
    run = _Run(cfg)
    result = generate(run, cfg)
    result.speculated, result.reexecuted = run.speculated, run.reexecuted
    result.calls, result.pulls, result.messages = run.calls, run.pulls, run.messages
    return result
