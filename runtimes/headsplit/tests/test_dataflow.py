"""Dataflow control over in-process workers: the messages on a token's critical path, where the
speculation test is decided, the re-run after a rejection, and identity with rpc control."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from test_engine import PROMPT, WORKERS, crafted, layerwise, spread  # noqa: E402

from headsplit import dataflow, engine, model  # noqa: E402
from headsplit.config import ModelConfig, preset  # noqa: E402
from headsplit.units import Unit, all_units  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class Counting(engine.InProcessTransport):
    """Records every message between processes and its depth: 1 + the deepest message its sender had
    received in the step before sending it (an upper bound of the causal chain that led to it, taken
    from the order of deliveries only, not from the messages' own ``hops``). Counts the controller's
    calls too."""

    def __init__(self, states: dict[str, engine.WorkerState]) -> None:
        super().__init__(states)
        self.steps: list[list[tuple[dataflow.Msg, int]]] = []
        self.calls: list[tuple[str, str]] = []
        self._seen: dict[str, int] = {}

    def run_step(self, msgs: list[dataflow.Msg]) -> dataflow.Msg:
        self.steps.append([])
        self._seen = {}
        return super().run_step(msgs)

    def send(self, msg: dataflow.Msg) -> None:
        parent = self.delivering
        if parent is not None:
            self._seen[parent.dst] = max(self._seen.get(parent.dst, 0), self._depth(parent))
        depth = 1 + (self._seen.get(msg.src, 0) if parent is not None else 0)
        self.steps[-1].append((msg, depth))
        super().send(msg)

    def _depth(self, msg: dataflow.Msg) -> int:
        return next(d for m, d in self.steps[-1] if m is msg)

    def call(self, worker: str, method: str, *args: Any) -> engine.Pending:
        self.calls.append((worker, method))
        return super().call(worker, method, *args)

    def critical(self, step: int) -> int:
        """The depth of the step's message to the controller."""
        return next(d for m, d in self.steps[step] if m.dst == engine.CONTROLLER)


def run(
    cfg: ModelConfig,
    w: model.Weights,
    placement: engine.Placement,
    workers: list[str],
    tokens: int,
    transport: type[engine.InProcessTransport] = Counting,
    **opts: Any,
) -> tuple[engine.InProcessTransport, engine.EngineResult]:
    tr = transport.from_weights(cfg, w, placement, workers)
    eng = engine.Engine(cfg, tr, placement, w, engine.EngineOptions(**opts))
    return tr, eng.generate(PROMPT, tokens)


def eight_layers() -> ModelConfig:
    return ModelConfig("llama-8", "llama", 8, 8, 2, 64, 176, 512, 256)


@pytest.mark.parametrize("n_workers", [2, 4])
def test_layerwise_token_is_w_plus_1_messages(n_workers: int) -> None:
    """Layer-wise over W workers: the start, W - 1 hand-overs and the last X, one chain: W + 1."""
    cfg = eight_layers()
    workers = [f"worker{i}" for i in range(1, n_workers + 1)]
    tr, res = run(cfg, model.seeded_weights(cfg), layerwise(cfg, workers), workers, 3)
    assert isinstance(tr, Counting)
    for i, tok in enumerate(res.tokens):
        msgs = tr.steps[i]
        assert len(msgs) == n_workers + 1  # every message of the token is on its one chain
        assert [(m.src, m.dst) for m, _ in msgs] == list(
            zip([engine.CONTROLLER, *workers], [*workers, engine.CONTROLLER], strict=True)
        )
        assert tr.critical(i) == n_workers + 1
        assert tok["critical_messages"] == n_workers + 1


@pytest.mark.parametrize(
    ("speculation", "tau", "per_layer"), [(False, 0.0, 3), (True, 0.0, 3), (True, 1e9, 2)]
)
def test_head_level_token_is_at_most_3l_plus_1_messages(
    speculation: bool, tau: float, per_layer: int
) -> None:
    """Heads of every layer on 3 workers, projection and FFN on two others: per layer X to the heads,
    the heads to the projection, Z to the FFN -- 3L + 1 with the last X, also when every speculation is
    rejected (the FFN worker's X re-runs the heads: still one message). Every speculation kept: Z goes to
    the next layer's heads while the FFN runs, 2 per layer after the first, 2L + 2. rpc control over
    the same placement makes L * (3 head calls + 2) controller calls per token, each a round trip."""
    cfg = preset("gpt2-tiny")
    L = cfg.n_layers
    w = model.seeded_weights(cfg)
    tr, res = run(cfg, w, spread(cfg, WORKERS), WORKERS, 3, speculation=speculation, tau=tau)
    assert isinstance(tr, Counting)
    want = 3 * L + 1 if per_layer == 3 else 2 * L + 2
    assert want <= 3 * L + 2
    for i, tok in enumerate(res.tokens):
        assert tr.critical(i) == want
        assert tok["critical_messages"] == want
        if speculation:
            assert (tok["accepted"] if tau else tok["rejected"]) == list(range(L - 1))
    tr_rpc, _ = run(cfg, w, spread(cfg, WORKERS), WORKERS, 1, control="rpc")
    assert isinstance(tr_rpc, Counting)
    steps = [c for c in tr_rpc.calls if c[1] in ("heads", "proj", "ffn")]
    assert len(steps) == L * (3 + 2)


def test_speculation_is_decided_at_the_ffn_worker_and_travels_with_x() -> None:
    """The crafted model keeps transitions 0 and 2 and rejects 1: each verdict is on the X that
    layer l's FFN worker sends, equal to its own ||FFN(Z)|| / ||Z|| < tau, and nothing reaches the
    controller but the last X (it sends only the start)."""
    cfg, w = crafted("gpt2-tiny")
    # every layer's FFN on a worker other than the next layer's projection: X crosses to it
    placement = {u: WORKERS[u.head % 3 if u.kind == "head" else (u.layer + (u.kind == "ffn") * 2) % 3]
                 for u in all_units(cfg)}  # fmt: skip
    tr, res = run(cfg, w, placement, WORKERS, 3, speculation=True, tau=0.05)
    assert isinstance(tr, Counting)
    for i, tok in enumerate(res.tokens):
        msgs = [m for m, _ in tr.steps[i]]
        from_ctl = [m for m in msgs if m.src == engine.CONTROLLER]
        to_ctl = [m for m in msgs if m.dst == engine.CONTROLLER]
        assert {m.kind for m in from_ctl} == {"x"} and {m.layer for m in from_ctl} == {0}
        assert len(to_ctl) == 1 and to_ctl[0].layer == cfg.n_layers
        for layer, kept in ((0, True), (1, False), (2, True)):
            xs = [m for m in msgs if m.kind == "x" and m.layer == layer + 1]
            assert xs and all(m.src == placement[Unit(layer, "ffn")] for m in xs)
            assert all(m.verdict is kept for m in xs)
            ratio = tok["ratios"][str(layer)]
            assert (ratio < 0.05) is kept
            # kept: X goes to the projection only (the heads keep what they computed on Z); to the FFN
            # worker's own stages it is no message
            heads = {
                wk
                for wk, _ in dataflow.make_plan(cfg, placement, lambda _: True, 0.05).layers[layer + 1].heads
            }
            got = {m.dst for m in xs}
            want = {placement[Unit(layer + 1, "proj")]} | (set() if kept else heads)
            assert got == want - {placement[Unit(layer, "ffn")]}
        assert tok["accepted"] == [0, 2] and tok["rejected"] == [1]


def test_a_rejected_speculation_reruns_the_heads() -> None:
    """Transition 1 is rejected: layer 2's head workers computed on Z, then again on the true X (the
    ``heads`` record marked rerun), and the projection used the re-run's outputs: the token and its
    logits are exact. Kept transitions (0, 2) run no exact heads of layers 1 and 3."""
    cfg, w = crafted("llama-tiny")
    ref = model.generate_trace(cfg, w, PROMPT, 4)
    tr, res = run(cfg, w, spread(cfg, WORKERS), WORKERS, 4, speculation=True, tau=0.05)
    for tok in res.tokens:
        assert tok["rejected"] == [1] and tok["reexec_ns"] > 0 and tok["speculative_ns"] > 0
    step = tr.states["worker1"].node
    assert step is not None
    recs = [r for st in tr.states.values() for r in st.report(step.cur.key[0])[0][1]]
    by = {(r["stage"], r["layer"], r.get("rerun", False)) for r in recs if r["stage"] in ("heads", "spec")}
    assert ("spec", 2, False) in by and ("heads", 2, True) in by
    assert not any(k[0] == "heads" and k[1] in (1, 3) for k in by)
    assert ("heads", 0, False) in by  # layer 0 has no speculation before it
    assert res.generated == ref.ids
    assert torch.equal(torch.stack(res.logits), ref.logits)


class SendOrder(engine.InProcessTransport):
    """Records, for every X a worker sends to another worker, whether the sender had already run its
    own heads of that layer when it sent it."""

    def __init__(self, states: dict[str, engine.WorkerState]) -> None:
        super().__init__(states)
        self.x_sent: list[tuple[str, str, int, bool]] = []

    def send(self, msg: dataflow.Msg) -> None:
        if msg.kind == "x" and msg.src in self.states and msg.dst in self.states:
            node = self.states[msg.src].node
            assert node is not None
            self.x_sent.append((msg.src, msg.dst, msg.layer, ("heads", msg.layer) in node.cur.done))
        super().send(msg)


def test_the_ffn_worker_pushes_x_before_it_runs_its_own_heads() -> None:
    """The FFN's worker of layer l also holds heads of layer l + 1 (``spread``): its X must reach the
    other head workers before it computes its own share, or the layer's heads run one after another
    (the FFN worker's first, then everyone else's) instead of at once. It used to return its messages
    only after its whole cascade of local stages had run."""
    cfg = preset("gpt2-tiny")
    w = model.seeded_weights(cfg)
    placement = spread(cfg, WORKERS)
    tr, res = run(cfg, w, placement, WORKERS, 2, SendOrder)
    assert isinstance(tr, SendOrder)
    assert len(res.generated) == 2
    crossing = [s for s in tr.x_sent if s[2] < cfg.n_layers]
    own_heads = {(placement[Unit(layer - 1, "ffn")], layer) for layer in range(1, cfg.n_layers)
                 if any(placement[Unit(layer, "head", h)] == placement[Unit(layer - 1, "ffn")]
                        for h in range(cfg.n_heads))}  # fmt: skip
    assert own_heads, "the placement must give an FFN worker heads of the next layer"
    assert {(src, layer) for src, _, layer, _ in crossing} >= own_heads
    assert [s for s in crossing if s[3]] == []  # no X sent after its sender's own heads of that layer


class Shuffled(engine.InProcessTransport):
    """Delivers the pending messages in a random (seeded) order: a speculative Z may arrive after the
    rejection, a head worker's outputs before the projection's X."""

    seed = 0

    def next_message(self) -> dataflow.Msg:
        if not hasattr(self, "_rng"):
            self._rng = random.Random(self.seed)
        i = self._rng.randrange(len(self._queue))
        self._queue.rotate(-i)
        return self._queue.popleft()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_any_delivery_order_gives_rpc_controls_outcome(seed: int) -> None:
    cfg, w = crafted("llama-tiny")
    Shuffled.seed = seed
    _, got = run(cfg, w, spread(cfg, WORKERS), WORKERS, 5, Shuffled, speculation=True, tau=0.05)
    _, want = run(cfg, w, spread(cfg, WORKERS), WORKERS, 5, speculation=True, tau=0.05, control="rpc")
    assert got.generated == want.generated
    assert torch.equal(torch.stack(got.logits), torch.stack(want.logits))
    assert [t["accepted"] for t in got.tokens] == [t["accepted"] for t in want.tokens]


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
@pytest.mark.parametrize("strategy", ["spread", "layerwise"])
def test_tau_zero_ids_identical_under_both_controls(name: str, strategy: str) -> None:
    """tau = 0 with every transition speculating: both controls give single-process generation's ids
    and logits, bit for bit."""
    cfg = preset(name)
    w = model.seeded_weights(cfg)
    p = spread(cfg, WORKERS) if strategy == "spread" else layerwise(cfg, WORKERS)
    ref_ids, ref_logits = model.generate(cfg, w, PROMPT, 6)
    for control in dataflow.CONTROLS:
        _, res = run(cfg, w, p, WORKERS, 6, speculation=True, tau=0.0, control=control)
        assert res.generated == ref_ids, control
        assert torch.equal(torch.stack(res.logits), ref_logits), control


def test_timing_fields_under_dataflow() -> None:
    """Every timing field is present; the compute on the critical path, the controller's own work and
    the rest (comm_ns) add up to the token's time; bytes per link are the messages' payloads."""
    cfg = preset("gpt2-tiny")
    w = model.seeded_weights(cfg)
    tr, res = run(cfg, w, spread(cfg, WORKERS), WORKERS, 3, speculation=True, tau=0.0)
    assert isinstance(tr, Counting)
    for i, tok in enumerate(res.tokens):
        for key in ("attention_ns", "projection_ns", "ffn_ns", "reexec_ns", "speculative_ns",
                    "critical_ns", "controller_ns"):  # fmt: skip
            assert tok[key] > 0, key
        assert tok["critical_ns"] + tok["controller_ns"] + tok["comm_ns"] == tok["total_ns"]
        assert tok["critical_ns"] >= tok["projection_ns"] + tok["ffn_ns"]
        links: dict[str, int] = {}
        for m, _ in tr.steps[i]:
            links[f"{m.src}>{m.dst}"] = links.get(f"{m.src}>{m.dst}", 0) + m.nbytes()
        assert tok["bytes"] == links


def test_plan_follows_a_migration() -> None:
    """After a re-placement the workers get the new routes before the next token: still exact."""
    cfg = preset("llama-tiny")
    w = model.seeded_weights(cfg)
    start = spread(cfg, WORKERS)
    tr = Counting.from_weights(cfg, w, start, WORKERS)
    eng = engine.Engine(cfg, tr, start, w, engine.EngineOptions(speculation=True, tau=0.0))
    eng.generate(PROMPT, 2)
    new = {u: ("worker3" if u.kind == "head" else wk) for u, wk in start.items()}
    eng.migrate(new)
    res = eng.generate(PROMPT, 3)  # again from position 0
    assert ("worker1", "configure") in tr.calls[len(WORKERS) :]
    ref_ids, _ = model.generate(cfg, w, PROMPT, 3)
    assert res.generated[-3:] == ref_ids
    assert all(u.kind != "head" or wk == "worker3" for u, wk in eng.placement.items() if u in all_units(cfg))


def test_a_step_waits_its_timeout_per_position_before_it_is_taken_for_stalled() -> None:
    """The prompt's prefill computes a decode token per position: a fixed 30 s retried TinyLlama's
    round-robin prefill on 25 % boards at +15 ms until it failed (issue 47)."""
    prefill = [dataflow.Msg("x", 0, 0, 0, 0, "controller", w, torch.zeros(46, 8)) for w in ("w1", "w2")]
    decode = [dataflow.Msg("x", 1, 0, 46, 0, "controller", "w1", torch.zeros(1, 8))]
    assert dataflow.step_timeout_s(30.0, prefill) == 30.0 * 46
    assert dataflow.step_timeout_s(30.0, decode) == 30.0
    assert dataflow.step_timeout_s(30.0, []) == 30.0
