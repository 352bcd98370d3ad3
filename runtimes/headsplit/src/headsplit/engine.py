"""The token loop: heads in parallel on their workers, gather at the projection, FFN, broadcast;
cross-layer speculation; migration of units and KV slices; memory per worker per token.

The engine talks to workers only through a ``Transport``: ``call(worker, method, *args)`` returns a
``Pending`` whose ``result()`` is ``(value, compute_ns)`` -- the value of ``WorkerState.<method>`` and
the time the worker spent computing it. ``InProcessTransport`` holds ``WorkerState`` objects in this
process; ``headsplit.rpc.RpcTransport`` reaches the same class in worker processes.

Data path. The controller drives every call, so on the wire tensors go controller <-> worker (a star,
as every frame crosses the access point on the article's WiFi anyway). The per-link byte counts are
the *logical* ones of the article's execution: X from the layer's input holder to every head worker
and the projection worker; head outputs head worker -> projection worker (the gather); Z projection
worker -> FFN worker (and -> the next layer's head workers when speculating); X FFN worker -> next
layer's workers (the broadcast); the last X FFN worker -> controller. Transfers within a worker count
nothing, so a layer-wise placement moves bytes only at its layer boundaries.

Speculation on transition l -> l+1 (layer l's Z forwarded to layer l+1's heads while layer l's FFN
runs): accepted when ||FFN(Z)|| / ||Z|| < tau (strictly: tau = 0 never accepts, so the output is
bit-for-bit the exact one), else layer l+1's heads run again on the exact X; the KV entries written by
the speculative call are replaced (``heads`` cuts its caches back to the step's start position).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from headsplit import model
from headsplit.config import ModelConfig
from headsplit.units import Unit, all_units

Placement = dict[Unit, str]
SlotKey = tuple[int, int]  # (layer, kv head)
CONTROLLER = "controller"


class Pending(Protocol):
    issued_ns: int

    def result(self) -> Any: ...

    @property
    def done_ns(self) -> int: ...


class Transport(Protocol):
    def call(self, worker: str, method: str, *args: Any) -> Pending: ...


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


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

    def __init__(self, name: str, cfg: ModelConfig) -> None:
        self.name = name
        self.cfg = cfg
        self.units: dict[str, model.Weights] = {}
        self.slots: dict[SlotKey, model.KVSlot] = {}

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

    def heads(
        self, layer: int, heads: list[int], x: torch.Tensor, start_pos: int
    ) -> tuple[dict[int, torch.Tensor], int]:
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            hw = {h: self.units[Unit(layer, "head", h).key()] for h in heads}
            slots = {kvh: self.slots[(layer, kvh)] for kvh in {self.cfg.kv_head_of(h) for h in heads}}
            out = model.heads_forward(self.cfg, hw, slots, x, start_pos)
        return out, time.perf_counter_ns() - t0

    def proj(self, layer: int, concat: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Z = X + proj(concat heads)."""
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            z = x + model.proj(self.cfg, self.units[Unit(layer, "proj").key()], concat)
        return z, time.perf_counter_ns() - t0

    def ffn(self, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, int]:
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            d = model.ffn(self.cfg, self.units[Unit(layer, "ffn").key()], z)
        return d, time.perf_counter_ns() - t0

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


def build_share(
    cfg: ModelConfig, w: model.Weights, units: Iterable[Unit]
) -> tuple[dict[str, model.Weights], dict[SlotKey, tuple[model.Weights, torch.Tensor, torch.Tensor]]]:
    """The weights a worker needs for ``units``, cut from ``w`` (which holds at least
    ``share_tensor_names``), in ``WorkerState.load``'s format (empty caches)."""
    us = list(units)
    unit_w = {u.key(): model.unit_weights(cfg, w, u) for u in us}
    slots = {
        (layer, kvh): (model.kv_weights(cfg, w, layer, kvh), torch.empty(0), torch.empty(0))
        for layer, kvh in slots_needed(cfg, us)
    }
    return unit_w, slots


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
    tau: float = 0.05
    speculate_layers: frozenset[int] | None = None  # source layers l of l -> l+1; None: every one
    memory_limits: dict[str, int] = field(default_factory=dict)  # worker -> bytes; 0/absent: none
    memory_check: MemoryCheck = field(default_factory=threshold_check)
    replan: Replan | None = None


@dataclass
class EngineResult:
    tokens: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    replacements: list[dict[str, Any]] = field(default_factory=list)
    oom: dict[str, Any] | None = None
    replacement_errors: list[dict[str, Any]] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


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
                "ffn_comm_ns",
            ),
            0,
        )
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
    def _issue_heads(self, layer: int, x: torch.Tensor, start: int) -> list[tuple[str, Pending]]:
        return [
            (w, self.transport.call(w, "heads", layer, hs, x, start))
            for w, hs in self._head_workers(layer).items()
        ]

    def _collect_heads(
        self, pend: list[tuple[str, Pending]], tok: _Token, compute_field: str
    ) -> dict[int, torch.Tensor]:
        outs: dict[int, torch.Tensor] = {}
        slowest, comm = 0, 0
        for _, p in pend:
            value, ns = p.result()
            outs.update(value)
            slowest = max(slowest, ns)
            comm = max(comm, p.done_ns - p.issued_ns - ns)
        tok.t[compute_field] += slowest
        tok.t["broadcast_ns"] += max(comm, 0)
        return outs

    def _send_x(self, tok: _Token, src: str, layer: int, x: torch.Tensor, heads_too: bool) -> None:
        """Account X going from its holder to layer ``layer``'s projection worker (and head workers)."""
        n = _nbytes(x)
        dsts = {self.placement[Unit(layer, "proj")]}
        if heads_too:
            dsts |= set(self._head_workers(layer))
        for d in dsts:
            tok.send(src, d, n)

    def step(self, ids: list[int], start: int) -> tuple[torch.Tensor, _Token]:
        """One forward pass over ``ids`` at positions start.. (the prefill, or one new token)."""
        cfg, tok = self.cfg, _Token()
        with torch.no_grad():
            x = model.embed(cfg, self.w, ids, start)
        holder = CONTROLLER
        self._send_x(tok, holder, 0, x, heads_too=True)
        outs: dict[int, torch.Tensor] | None = None
        for layer in range(cfg.n_layers):
            pw = self.placement[Unit(layer, "proj")]
            fw = self.placement[Unit(layer, "ffn")]
            if outs is None:
                outs = self._collect_heads(self._issue_heads(layer, x, start), tok, "attention_ns")
            for w, hs in self._head_workers(layer).items():
                tok.send(w, pw, sum(_nbytes(outs[h]) for h in hs))
            concat = torch.cat([outs[h] for h in range(cfg.n_heads)], dim=-1)
            pp = self.transport.call(pw, "proj", layer, concat, x)
            z, ns = pp.result()
            tok.t["projection_ns"] += ns
            tok.t["gather_ns"] += max(pp.done_ns - pp.issued_ns - ns, 0)
            tok.send(pw, fw, _nbytes(z))
            spec = self._speculates(layer)
            fp = self.transport.call(fw, "ffn", layer, z)
            spec_pend: list[tuple[str, Pending]] = []
            if spec:
                spec_pend = self._issue_heads(layer + 1, z, start)
                for w in self._head_workers(layer + 1):
                    tok.send(pw, w, _nbytes(z))
            delta, ns = fp.result()
            tok.t["ffn_ns"] += ns
            tok.t["ffn_comm_ns"] += max(fp.done_ns - fp.issued_ns - ns, 0)
            x = z + delta
            holder = fw
            outs = None
            if spec:
                ratio = model.ffn_ratio(delta, z)
                tok.speculated.append(layer)
                tok.ratios[str(layer)] = ratio
                before = tok.t["attention_ns"]
                spec_outs = self._collect_heads(spec_pend, tok, "attention_ns")
                spec_ns = tok.t["attention_ns"] - before
                tok.t["speculative_ns"] += spec_ns
                if ratio < self.options.tau:
                    tok.accepted.append(layer)
                    outs = spec_outs
                    self._send_x(tok, holder, layer + 1, x, heads_too=False)
                else:
                    tok.rejected.append(layer)
                    tok.t["attention_ns"] -= spec_ns  # wasted: counted in speculative_ns only
                    self._send_x(tok, holder, layer + 1, x, heads_too=True)
                    outs = self._collect_heads(self._issue_heads(layer + 1, x, start), tok, "reexec_ns")
            elif layer + 1 < cfg.n_layers:
                self._send_x(tok, holder, layer + 1, x, heads_too=True)
        tok.send(holder, CONTROLLER, _nbytes(x[-1]))
        with torch.no_grad():
            logits = model.lm_logits(cfg, self.w, x[-1])
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
        return {"moved_units": len(moved), "migration_ns": time.perf_counter_ns() - t0, "bytes": nbytes}

    # -- memory
    def _memory(self, index: int) -> tuple[str, int, int] | None:
        """Sample every worker; re-place if one needs it; return (worker, bytes, limit) on OOM."""
        samples = {w: int(self.transport.call(w, "nbytes").result()[0]) for w in self.workers}
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
            oom = self._memory(index)
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
            res.tokens.append(rec)
            start += len(ids)
            ids = [nxt]
        return res
