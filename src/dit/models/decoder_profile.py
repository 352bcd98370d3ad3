"""Per-token profiles of decoder LMs: per-head attention, projection and feed-forward times.

:func:`profile_decoder` generates tokens with :meth:`HFDecoderModel.generate` (greedy, KV cache,
stage by stage) and captures, through forward hooks on every decoder layer, per token:

* ``attention``: the fused attention module (pre-hook to hook; ``with_kwargs=True`` because the
  Llama-style families pass ``hidden_states`` and ``position_embeddings`` by keyword);
* ``projection``: its output projection (``o_proj``, GPT-2's ``c_proj``);
* ``ffn``: the MLP module;
* ``head`` (one row per head): that head alone, computed by :func:`head_outputs` from the hidden
  states and position embeddings the hook captured, with its own KV cache: q/k/v slices, rotary
  embedding, scores, softmax, weighted values;
* ``head_proj`` (one row per head): the head's slice of the output projection;
* ``layer``: the decoder layer, minus the time the head-wise decomposition itself took;
* ``stage`` (``layer`` column = stage number, head -1): each stage of the generation step.

The head-wise recomputation runs inside the attention hook *after* the fused module's time was
taken, so it does not inflate ``attention``; the sum of the per-head outputs (+ the output bias
once) is compared with the fused output on every call and the largest difference is in the
summary (``headwise_max_abs_diff``). Token 0 is the prefill of the prompt (``kv_len`` = prompt
length), later tokens attend over ``kv_len`` cached positions. Warm-up repetitions are run, not
recorded, and counted in the summary.

``heads.csv`` columns: :data:`HEAD_COLUMNS`. Stage rows of a prefill profile keep the stdlib
profiler's ``layers.csv`` format (:func:`dit.device.profiler.profile_model`).

:func:`time_generation` times the same generation *without* hooks (what a user of the model waits
for): per token the sum of its stage times and its start on the monotonic clock, for ``tokens.csv``
(columns :data:`TOKEN_COLUMNS`) and the energy per token.
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dit.models.hf_decoder import HFDecoderModel, head_outputs, headwise_sum

HEAD_COLUMNS = ("rep", "token", "layer", "unit", "head", "latency_ns", "ops", "kv_len")
TOKEN_COLUMNS = ("rep", "token", "start_ns", "latency_ns", "kv_len")


@dataclass(frozen=True)
class HeadRecord:
    rep: int
    token: int
    layer: int
    unit: str
    head: int
    latency_ns: int
    ops: int
    kv_len: int


@dataclass
class DecoderProfile:
    model: str
    tokens: int
    warmup: int
    repetitions: int
    heads: int
    kv_heads: int
    layers: int
    records: list[HeadRecord] = field(default_factory=list)
    headwise_max_abs_diff: float = 0.0
    generated: list[list[int]] = field(default_factory=list)

    def mean_ns(self, unit: str, *, decode_only: bool = True) -> float:
        rows = [r.latency_ns for r in self.records if r.unit == unit and (r.token > 0 or not decode_only)]
        return float(np.mean(rows)) if rows else 0.0

    def summary(self) -> dict[str, Any]:
        units = ("head", "head_proj", "attention", "projection", "ffn", "layer")
        return {
            "model": self.model,
            "tokens": self.tokens,
            "warmup": self.warmup,
            "repetitions": self.repetitions,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "headwise_max_abs_diff": self.headwise_max_abs_diff,
            "mean_decode_ns": {u: self.mean_ns(u) for u in units},
            "mean_prefill_ns": {
                u: float(np.mean([r.latency_ns for r in self.records if r.unit == u and r.token == 0] or [0]))
                for u in units
            },
        }


class _Hooks:
    """Forward hooks on every decoder layer of ``model`` that time its parts and its heads."""

    def __init__(self, model: HFDecoderModel, clock: Callable[[], int]) -> None:
        self.m = model
        self.clock = clock
        self.rep = 0
        self.token = 0
        self.recording = False
        self.records: list[HeadRecord] = []
        self.max_diff = 0.0
        self.handles: list[Any] = []
        self.t: dict[tuple[str, int], int] = {}
        self.spent: dict[int, int] = {}
        self.past: list[list[tuple[Any, Any]]] = []
        self.cur: dict[int, tuple[int, int]] = {}
        self.captured: tuple[Any, Any] = (None, None)
        fam = model.family
        for i, layer in enumerate(model.layers):
            attn = getattr(layer, fam.attn)
            parts = {
                "layer": layer,
                "attention": attn,
                "projection": getattr(attn, fam.o),
                "ffn": getattr(layer, fam.mlp),
            }
            for unit, mod in parts.items():
                self.handles.append(mod.register_forward_pre_hook(self._pre(unit, i), with_kwargs=True))
                self.handles.append(mod.register_forward_hook(self._post(unit, i), with_kwargs=True))
        self.reset()

    def reset(self) -> None:
        self.past = [[(None, None)] * self.m.heads for _ in self.m.layers]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def _pre(self, unit: str, layer: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any) -> None:
            if unit == "layer":
                self.spent[layer] = 0
            if unit == "attention":
                hidden = args[0] if args else kwargs["hidden_states"]
                self.captured = (hidden, kwargs.get("position_embeddings"))
                tq = int(hidden.shape[1])
                self.cur[layer] = (tq, self._kv_len(layer) + tq)
            self.t[(unit, layer)] = self.clock()

        return hook

    def _post(self, unit: str, layer: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            t1 = self.clock()
            elapsed = t1 - self.t[(unit, layer)]
            tq, kv_len = self.cur[layer]
            c = self.m.layer_op_counts(tq, kv_len)
            if unit == "layer":
                elapsed -= self.spent.get(layer, 0)
                total = self.m.heads * c["head"] + c["projection"] + c["ffn"] + c["other"]
                self._add(layer, "layer", -1, elapsed, total, kv_len)
            elif unit == "projection":
                self._add(layer, "projection", -1, elapsed, c["projection"], kv_len)
            elif unit == "ffn":
                self._add(layer, "ffn", -1, elapsed, c["ffn"], kv_len)
            elif unit == "attention":
                self._add(layer, "attention", -1, elapsed, self.m.heads * c["head"] + c["projection"], kv_len)
                self._heads(layer, output[0] if isinstance(output, tuple) else output)
                self.spent[layer] = self.spent.get(layer, 0) + self.clock() - t1

        return hook

    def _kv_len(self, layer: int) -> int:
        k = self.past[layer][0][0]
        return 0 if k is None else int(k.shape[0])

    def _heads(self, layer: int, fused: Any) -> None:
        hidden, pos = self.captured
        offset = self._kv_len(layer)
        attn = getattr(self.m.layers[layer], self.m.family.attn)
        res = head_outputs(
            self.m.family,
            attn,
            hidden,
            heads=self.m.heads,
            kv_heads=self.m.kv_heads,
            position_embeddings=pos,
            offset=offset,
            past=self.past[layer],
        )
        tq = int(hidden.shape[1])
        counts = self.m.layer_op_counts(tq, offset + tq)
        for h in range(self.m.heads):
            self._add(layer, "head", h, res.head_ns[h], counts["head"], offset + tq)
            self._add(
                layer, "head_proj", h, res.proj_ns[h], counts["projection"] // self.m.heads, offset + tq
            )
        self.past[layer] = list(zip(res.keys, res.values, strict=True))
        diff = float((headwise_sum(res) - fused).abs().max())
        self.max_diff = max(self.max_diff, diff)

    def _add(self, layer: int, unit: str, head: int, ns: int, ops: int, kv_len: int) -> None:
        if self.recording:
            self.records.append(
                HeadRecord(self.rep, self.token, layer, unit, head, int(ns), int(ops), kv_len)
            )


def profile_decoder(
    model: HFDecoderModel,
    *,
    tokens: int,
    repetitions: int = 1,
    warmup: int = 1,
    prompt: Any = None,
    clock: Callable[[], int] = time.monotonic_ns,
) -> DecoderProfile:
    """Generate ``tokens`` tokens ``warmup + repetitions`` times; record the last ``repetitions``."""
    if tokens < 1 or repetitions < 0 or warmup < 0:
        raise ValueError(
            f"tokens ({tokens}) must be >= 1, repetitions ({repetitions}) and warmup ({warmup}) >= 0"
        )
    x = model.make_input() if prompt is None else np.asarray(prompt)
    hooks = _Hooks(model, clock)
    prof = DecoderProfile(
        model.name, tokens, warmup, repetitions, model.heads, model.kv_heads, len(model.layers)
    )

    def on_stage(token: int, stage: int, ns: int) -> None:
        if hooks.recording:
            hooks.records.append(HeadRecord(hooks.rep, token, stage, "stage", -1, ns, model.ops(stage), 0))
        if stage == model.num_stages:
            hooks.token = token + 1

    try:
        for run in range(warmup + repetitions):
            hooks.reset()
            hooks.rep = run - warmup
            hooks.token = 0
            hooks.recording = run >= warmup
            out = model.generate(x, tokens, stage_hook=on_stage)
            if hooks.recording:
                prof.generated.append(out)
    finally:
        hooks.remove()
    prof.records = hooks.records
    prof.headwise_max_abs_diff = hooks.max_diff
    return prof


def write_heads_csv(path: Path, prof: DecoderProfile) -> None:
    """Write ``heads.csv`` (columns :data:`HEAD_COLUMNS`) atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=HEAD_COLUMNS)
        writer.writeheader()
        for r in prof.records:
            writer.writerow(asdict(r))
    os.replace(tmp, path)


@dataclass(frozen=True)
class TokenRecord:
    """One generated token: ``start_ns`` relative to the origin, ``latency_ns`` the sum of its stages."""

    rep: int
    token: int
    start_ns: int
    latency_ns: int
    kv_len: int


def time_generation(
    model: HFDecoderModel,
    *,
    tokens: int,
    repetitions: int = 1,
    warmup: int = 1,
    origin_mono_ns: int = 0,
    prompt: Any = None,
    clock: Callable[[], int] = time.monotonic_ns,
) -> list[TokenRecord]:
    """Generate ``tokens`` tokens ``warmup + repetitions`` times without hooks; the last ``repetitions``.

    Token ``t`` attends over ``prompt_len + t`` positions (token 0 is the prefill of the prompt).
    """
    if tokens < 1 or repetitions < 0 or warmup < 0:
        raise ValueError(
            f"tokens ({tokens}) must be >= 1, repetitions ({repetitions}) and warmup ({warmup}) >= 0"
        )
    x = model.make_input() if prompt is None else np.asarray(prompt)
    prompt_len = int(np.asarray(x).reshape(-1).shape[0])
    out: list[TokenRecord] = []
    start: dict[int, int] = {}
    spent: dict[int, int] = {}

    for run in range(warmup + repetitions):
        start.clear()
        spent.clear()

        def on_stage(token: int, stage: int, ns: int) -> None:
            if stage == 1:
                start[token] = clock() - ns
            spent[token] = spent.get(token, 0) + ns

        model.generate(x, tokens, stage_hook=on_stage)
        if run >= warmup:
            out.extend(
                TokenRecord(run - warmup, t, start[t] - origin_mono_ns, spent[t], prompt_len + t)
                for t in range(tokens)
            )
    return out


def write_tokens_csv(path: Path, records: list[TokenRecord]) -> None:
    """Write ``tokens.csv`` (columns :data:`TOKEN_COLUMNS`) atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=TOKEN_COLUMNS)
        writer.writeheader()
        for r in records:
            writer.writerow(asdict(r))
    os.replace(tmp, path)


def profile_generation(
    model: HFDecoderModel,
    *,
    tokens: int,
    repetitions: int,
    warmup: int,
    origin_mono_ns: int,
    results: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The agent's token profile (:class:`dit.device.adapter.GeneratesTokens`): ``tokens.csv`` from a
    generation without hooks (per-token latency, start times for the energy), then ``heads.csv`` from
    the per-head profile; returns the ``generation`` record of ``done.json``."""
    say(f"generating {tokens} tokens, {repetitions} repetitions after {warmup} warm-up")
    timed = time_generation(
        model, tokens=tokens, repetitions=repetitions, warmup=warmup, origin_mono_ns=origin_mono_ns
    )
    write_tokens_csv(results / "tokens.csv", timed)
    say("per-head profile of the generation")
    prof = profile_decoder(model, tokens=tokens, repetitions=repetitions, warmup=warmup)
    write_heads_csv(results / "heads.csv", prof)
    summary = prof.summary()
    return {
        "tokens": tokens,
        "records": len(prof.records),
        "headwise_max_abs_diff": summary["headwise_max_abs_diff"],
        "heads": summary["heads"],
        "layers": summary["layers"],
    }
