"""Dataflow control (``control: dataflow``): the controller starts a token with one message and
receives its last X; in between every worker pushes what it produces to its consumers as soon as it
exists, and acts when the inputs of one of its stages have all arrived.

Messages (``Msg``), per step (one forward pass) and layer l:

* ``x`` of layer l: the layer's input X (the controller's embedding for l = 0, else X = Z + FFN(Z)
  of layer l - 1, sent by that layer's FFN worker): to l's projection worker (the residual) and to
  l's head workers -- unless the speculation test of transition l - 1 -> l kept the speculative
  heads (``verdict`` True), when the heads need nothing more. ``verdict`` False tells the head
  workers to discard their speculative result and recompute from the true X. The ``x`` of layer L
  (after the last layer) goes to the controller.
* ``h`` of layer l: one head worker's outputs (its heads, in order) to l's projection worker;
  ``spec`` when computed on the previous layer's Z.
* ``z`` of layer l: Z = X + proj(heads) to l's FFN worker and, when transition l -> l + 1
  speculates, to layer l + 1's head workers (their speculative input).

The speculation test ||FFN(Z)|| / ||Z|| < tau is decided where the FFN runs and travels with X.
The projection of layer l + 1 uses the speculative head outputs when the verdict kept them, else
the recomputed ones: the operations, and so the outcome, are rpc control's (the KV entries the
speculative call wrote are replaced by the recomputation: ``heads`` cuts its caches back to the
step's start). A worker never runs a speculative call after the exact one of the same layer (the
speculative input may arrive after the rejection, from another sender).

Each message carries ``hops``: the messages on the longest chain that led to it (a message to a
stage on the same worker is no message), and ``path_ns``: the compute on the longest compute chain
that led to it; the controller reads both off the last X. Each worker records its stages of the step
(compute, waits, bytes sent), returned by ``WorkerState.report`` between tokens.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from headsplit.config import CONTROLS, ModelConfig
from headsplit.units import Unit

if TYPE_CHECKING:
    from headsplit.engine import WorkerState

CONTROLLER = "controller"
__all__ = ["CONTROLS", "LayerRoute", "Msg", "Node", "Plan", "first_consumers", "fold_records", "make_plan"]


@dataclass(frozen=True)
class LayerRoute:
    """Where one layer's units are: (worker, its heads) in worker order, projection, FFN; and whether
    the transition to the next layer speculates."""

    heads: tuple[tuple[str, tuple[int, ...]], ...]
    proj: str
    ffn: str
    speculate: bool

    def head_workers(self) -> tuple[str, ...]:
        return tuple(w for w, _ in self.heads)

    def heads_of(self, worker: str) -> tuple[int, ...]:
        return next((hs for w, hs in self.heads if w == worker), ())


@dataclass(frozen=True)
class Plan:
    """The routes every worker follows (sent to each worker whenever the placement changes)."""

    layers: tuple[LayerRoute, ...]
    tau: float


def make_plan(
    cfg: ModelConfig, placement: dict[Unit, str], speculates: Callable[[int], bool], tau: float
) -> Plan:
    layers = []
    for layer in range(cfg.n_layers):
        by_worker: dict[str, list[int]] = {}
        for h in range(cfg.n_heads):
            by_worker.setdefault(placement[Unit(layer, "head", h)], []).append(h)
        layers.append(
            LayerRoute(
                tuple((w, tuple(hs)) for w, hs in sorted(by_worker.items())),
                placement[Unit(layer, "proj")],
                placement[Unit(layer, "ffn")],
                speculates(layer),
            )
        )
    return Plan(tuple(layers), tau)


def first_consumers(plan: Plan) -> list[str]:
    """The workers the controller's start message goes to: layer 0's projection and head workers."""
    return list(dict.fromkeys((plan.layers[0].proj, *plan.layers[0].head_workers())))


@dataclass
class Msg:
    kind: str  # "x", "h", "z" (module docstring); "error": a worker's failure, to the controller
    step: int
    attempt: int  # a retried step's messages have a higher attempt; a worker drops older ones
    start: int  # the step's first position
    layer: int
    src: str
    dst: str
    t: torch.Tensor | None
    verdict: bool | None = None  # "x" after a speculating transition: kept (True) or re-run (False)
    spec: bool = False  # "h": computed on the previous layer's Z
    hops: int = 1
    path_ns: int = 0
    # (layer, ratio, kept) of every speculating transition before this message: carried to the controller
    verdicts: tuple[tuple[int, float, bool], ...] = ()
    text: str = ""  # "error": what failed

    @property
    def key(self) -> tuple[int, int]:
        return self.step, self.attempt

    def nbytes(self) -> int:
        return 0 if self.t is None else int(self.t.numel() * self.t.element_size())


def step_timeout_s(timeout_s: float, msgs: list[Msg]) -> float:
    """How long the controller waits for a step's last X before taking it for stalled: ``timeout_s``
    per position the step computes (the start messages' rows), so the prompt's prefill of N positions,
    about N decode tokens of work, gets N times a token's wait. A fixed wait retried TinyLlama's
    round-robin prefill on 25 % boards at +15 ms, which takes longer than 30 s, until it failed (each
    retry restarts the whole prefill)."""
    rows = max((m.t.shape[0] for m in msgs if m.t is not None and m.t.dim() >= 2), default=1)
    return timeout_s * max(1, int(rows))


@dataclass
class _Arrived:
    msg: Msg
    at_ns: int


@dataclass
class _StepState:
    key: tuple[int, int]
    start: int
    x: dict[int, _Arrived] = field(default_factory=dict)
    parts: dict[int, dict[tuple[bool, str], _Arrived]] = field(default_factory=dict)
    done: set[tuple[str, int]] = field(default_factory=set)
    records: list[dict[str, Any]] = field(default_factory=list)


class Node:
    """One worker's scheduler: inputs keyed by (step, layer, stage); a stage runs when all of its inputs
    have arrived. ``deliver`` takes one message and returns the messages to send to other processes
    (those to this worker's own stages are delivered here, in order)."""

    def __init__(self, state: WorkerState, plan: Plan) -> None:
        self.state = state
        self.plan = plan
        self.cur = _StepState((0, 0), 0)

    @property
    def name(self) -> str:
        return self.state.name

    def deliver(self, msg: Msg, push: Callable[[Msg], None] | None = None) -> list[Msg]:
        """Run every stage ``msg`` completes, and the stages of this worker those complete in turn.
        With ``push``, a message to another process is pushed the moment its stage has produced it,
        before this worker runs its own next stages: the FFN's worker sends the next layer's X to the
        other head workers before it computes its own share of those heads, so the heads run at once
        (returning them all at the end serialised the FFN worker's heads before everyone else's).
        Without ``push`` they are returned, in the order they were produced."""
        if msg.key < self.cur.key:
            return []  # a retried step's leftovers
        if msg.key > self.cur.key:
            self.cur = _StepState(msg.key, msg.start)
        out: list[Msg] = []
        send = out.append if push is None else push
        work = deque([msg])
        while work:
            for m in self._on(work.popleft()):
                if m.dst == self.name:
                    work.append(m)
                else:
                    send(m)
        return out

    def records(self, step: int) -> list[dict[str, Any]]:
        return list(self.cur.records) if self.cur.key[0] == step else []

    # -- stages
    def _on(self, m: Msg) -> Iterator[Msg]:
        cur, layers, name = self.cur, self.plan.layers, self.name
        arrived = _Arrived(m, time.perf_counter_ns())
        layer = m.layer
        if m.kind == "x":
            cur.x[layer] = arrived
            r = layers[layer]
            if name in r.head_workers() and m.verdict is not True and ("heads", layer) not in cur.done:
                yield from self._heads(layer, arrived, spec=False)
            if name == r.proj:
                yield from self._proj(layer)
        elif m.kind == "z":
            r = layers[layer]
            if name == r.ffn and ("ffn", layer) not in cur.done:
                yield from self._ffn(layer, arrived)
            nxt = layer + 1
            if (
                r.speculate
                and name in layers[nxt].head_workers()
                and ("heads", nxt) not in cur.done
                and ("spec", nxt) not in cur.done
            ):
                yield from self._heads(nxt, arrived, spec=True)
        elif m.kind == "h":
            cur.parts.setdefault(layer, {})[(m.spec, m.src)] = arrived
            if name == layers[layer].proj:
                yield from self._proj(layer)
        else:
            raise ValueError(f"{name}: unknown message kind {m.kind!r}")

    def _send(
        self, record: dict[str, Any], base: Msg, dsts: list[str], kind: str, layer: int, t: torch.Tensor,
        hops: int, path_ns: int, **extra: Any,
    ) -> Iterator[Msg]:  # fmt: skip
        sent: dict[str, int] = record.setdefault("sent", {})
        for dst in dict.fromkeys(dsts):
            msg = Msg(kind, base.step, base.attempt, base.start, layer, self.name, dst, t,
                      hops=hops + (dst != self.name), path_ns=path_ns, **extra)  # fmt: skip
            if dst != self.name:
                sent[dst] = sent.get(dst, 0) + msg.nbytes()
            yield msg

    def _heads(self, layer: int, inp: _Arrived, spec: bool) -> Iterator[Msg]:
        cur, m = self.cur, inp.msg
        assert m.t is not None
        t0 = time.perf_counter_ns()
        out, ns = self.state.heads_compute(
            layer, list(self.plan.layers[layer].heads_of(self.name)), m.t, cur.start
        )
        cur.done.add(("spec" if spec else "heads", layer))
        rec: dict[str, Any] = {"stage": "spec" if spec else "heads", "layer": layer, "compute_ns": ns,
                               "queue_ns": t0 - inp.at_ns, "rerun": m.verdict is False}  # fmt: skip
        cur.records.append(rec)
        yield from self._send(rec, m, [self.plan.layers[layer].proj], "h", layer, out, m.hops,
                              m.path_ns + ns, spec=spec, verdicts=m.verdicts)  # fmt: skip

    def _proj(self, layer: int) -> Iterator[Msg]:
        cur, r = self.cur, self.plan.layers[layer]
        if ("proj", layer) in cur.done or layer not in cur.x:
            return
        x = cur.x[layer]
        kept = x.msg.verdict is True
        got = cur.parts.get(layer, {})
        parts = [got.get((kept, w)) for w in r.head_workers()]
        if any(p is None for p in parts):
            return
        ready = [x, *(p for p in parts if p is not None)]
        t0 = time.perf_counter_ns()
        assert x.msg.t is not None
        z, ns = self.state.proj_compute(
            layer, [(p.msg.t, list(r.heads_of(p.msg.src))) for p in ready[1:] if p.msg.t is not None], x.msg.t
        )
        cur.done.add(("proj", layer))
        arrivals = [a.at_ns for a in ready]
        rec = {"stage": "proj", "layer": layer, "compute_ns": ns, "wait_ns": max(arrivals) - min(arrivals),
               "queue_ns": t0 - max(arrivals)}  # fmt: skip
        cur.records.append(rec)
        dsts = [r.ffn, *(self.plan.layers[layer + 1].head_workers() if r.speculate else ())]
        yield from self._send(rec, x.msg, dsts, "z", layer, z, max(a.msg.hops for a in ready),
                              max(a.msg.path_ns for a in ready) + ns, verdicts=x.msg.verdicts)  # fmt: skip

    def _ffn(self, layer: int, inp: _Arrived) -> Iterator[Msg]:
        cur, r, m = self.cur, self.plan.layers[layer], inp.msg
        assert m.t is not None
        t0 = time.perf_counter_ns()
        x, ratio, ns = self.state.ffn_compute(layer, m.t)
        cur.done.add(("ffn", layer))
        verdict = ratio < self.plan.tau if r.speculate else None
        rec = {"stage": "ffn", "layer": layer, "compute_ns": ns, "queue_ns": t0 - inp.at_ns,
               "ratio": ratio, "verdict": verdict}  # fmt: skip
        cur.records.append(rec)
        verdicts = m.verdicts + (((layer, ratio, bool(verdict)),) if verdict is not None else ())
        nxt = layer + 1
        if nxt == len(self.plan.layers):
            dsts = [CONTROLLER]
        else:
            after = self.plan.layers[nxt]
            dsts = [after.proj, *(() if verdict is True else after.head_workers())]
        yield from self._send(rec, m, dsts, "x", nxt, x, m.hops, m.path_ns + ns, verdict=verdict,
                              verdicts=verdicts)  # fmt: skip


def fold_records(
    records: dict[str, list[dict[str, Any]]], t: dict[str, int], sent: Callable[[str, str, int], None]
) -> None:
    """A token's timing fields (``t``, added to) from every worker's stage records of the step, and its
    bytes per link (``sent(src, dst, n)``). Per layer the slowest head worker counts, as under rpc
    control: attention_ns the heads whose outputs the projection used (exact, or kept speculative),
    speculative_ns every speculative group, reexec_ns the recomputation after a rejection;
    broadcast_ns the slowest head worker's wait between its input's arrival and its start (its other
    stages running), zforward_ns the FFN's; gather_ns the projection's wait from its first input's
    arrival to its last."""
    heads: dict[tuple[str, int], int] = {}  # (stage kind, layer) -> slowest compute
    queue: dict[tuple[str, int], int] = {}
    kept: dict[int, bool] = {}
    for worker, recs in records.items():
        for rec in recs:
            for dst, n in rec.get("sent", {}).items():
                sent(worker, dst, int(n))
            stage, layer, ns = rec["stage"], int(rec["layer"]), int(rec["compute_ns"])
            if stage in ("heads", "spec"):
                kind = "rerun" if rec.get("rerun") else stage
                heads[(kind, layer)] = max(heads.get((kind, layer), 0), ns)
                queue[(kind, layer)] = max(queue.get((kind, layer), 0), int(rec["queue_ns"]))
            elif stage == "proj":
                t["projection_ns"] += ns
                t["gather_ns"] += int(rec["wait_ns"])
            elif stage == "ffn":
                t["ffn_ns"] += ns
                t["zforward_ns"] += int(rec["queue_ns"])
                if rec.get("verdict") is not None:
                    kept[layer + 1] = bool(rec["verdict"])
    for (kind, layer), ns in heads.items():
        if kind == "heads":
            t["attention_ns"] += ns
        elif kind == "rerun":
            t["reexec_ns"] += ns
        else:
            t["speculative_ns"] += ns
            if kept.get(layer):
                t["attention_ns"] += ns
        t["broadcast_ns"] += queue[(kind, layer)]
