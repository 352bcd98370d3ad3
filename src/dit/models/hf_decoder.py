"""Hugging Face decoder-only language models at decoder-layer granularity, attention head-wise.

Stages (N = num_layers + 2): ``1`` the token embedding (plus GPT-2's learned positions), ``2 ..
L+1`` one decoder layer each, ``L+2`` the final norm + language-model head, whose output is the
next-token logits of the last position. Stage 0 is the prompt, ``int64`` token ids ``[1, T]``;
every cut in between carries the hidden states ``float32 [1, T, hidden]``. :meth:`run_stage` is
stateless (a prefill of the whole sequence, positions ``0..T-1``), which is what a partitioned
inference through the edge service runs; :meth:`generate` produces tokens greedily with a
per-layer KV cache, stage by stage.

Models are built from a config (``transformers.<Family>Config``) with the seeded weights of
:mod:`dit.models.weights` (uniform with the standard deviation of the family's
``initializer_range``, norms at their constant initial value): nothing is downloaded.

The family table (:data:`FAMILIES`) says where the parts are: the q/k/v/o projections (or GPT-2's
fused ``c_attn`` / ``c_proj``, whose ``Conv1D`` weights are stored ``[in, out]``), the MLP modules,
the grouped-query mapping (query head ``h`` reads KV head ``h // (heads / kv_heads)``) and the head
dimension (the attention module's ``head_dim``, which Gemma sets independently of the width).
:func:`head_outputs` decomposes an attention module head by head: each head's q/k/v slices,
rotary embedding, scores, softmax, weighted values and its slice of the output projection are
computed (and timed) on their own; the sum of the per-head outputs plus the output bias once
equals the fused module's output (tested for every family).
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dit.device.threads import configure_torch
from dit.models.catalogue import entry, expected_sha256
from dit.models.common import (
    ArraySpec,
    ArrayStageModel,
    input_kind,
    input_seed,
    positive_int,
    spec_params,
    to_numpy,
)
from dit.models.weights import TensorSpec, WeightsRecord, ensure_weights, weights_dir


@dataclass(frozen=True)
class Family:
    """Where a Hugging Face decoder family keeps its parts (module names relative to a layer)."""

    name: str
    config_class: str
    model_class: str
    base: str  # attribute of the CausalLM holding the decoder stack
    layers: str  # ModuleList of decoder layers inside ``base``
    embed: str  # token embedding inside ``base``
    positions: str | None  # learned absolute positions inside ``base`` (GPT-2), else None
    final_norm: str  # inside ``base``
    attn: str  # attention module inside a layer
    q: str | None  # separate projections (Llama & co) ...
    k: str | None
    v: str | None
    qkv: str | None  # ... or one fused projection (GPT-2's c_attn: [q | k | v] along the output)
    o: str  # output projection inside the attention module
    mlp: str  # feed-forward module inside a layer
    mlp_modules: tuple[str, ...]  # its linear parts
    conv1d: bool  # weights stored [in, out] (GPT-2's Conv1D) instead of nn.Linear's [out, in]
    rotary: bool
    norm_init: float  # initial value of norm weights (Gemma stores w for (1 + w): 0)
    tiny: Mapping[str, Any] = field(default_factory=dict)  # a small config for tests


def _llama_like(name: str, prefix: str, norm_init: float, tiny: Mapping[str, Any]) -> Family:
    return Family(
        name=name,
        config_class=f"{prefix}Config",
        model_class=f"{prefix}ForCausalLM",
        base="model",
        layers="layers",
        embed="embed_tokens",
        positions=None,
        final_norm="norm",
        attn="self_attn",
        q="q_proj",
        k="k_proj",
        v="v_proj",
        qkv=None,
        o="o_proj",
        mlp="mlp",
        mlp_modules=("gate_proj", "up_proj", "down_proj"),
        conv1d=False,
        rotary=True,
        norm_init=norm_init,
        tiny={"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "max_position_embeddings": 64, **tiny},
    )  # fmt: skip


FAMILIES: dict[str, Family] = {
    "gpt2": Family(
        name="gpt2",
        config_class="GPT2Config",
        model_class="GPT2LMHeadModel",
        base="transformer",
        layers="h",
        embed="wte",
        positions="wpe",
        final_norm="ln_f",
        attn="attn",
        q=None,
        k=None,
        v=None,
        qkv="c_attn",
        o="c_proj",
        mlp="mlp",
        mlp_modules=("c_fc", "c_proj"),
        conv1d=True,
        rotary=False,
        norm_init=1.0,
        tiny={
            "vocab_size": 256,
            "n_positions": 64,
            "n_embd": 64,
            "n_head": 4,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    ),
    "llama": _llama_like("llama", "Llama", 1.0, {"num_key_value_heads": 2, "attention_bias": True}),
    "mistral": _llama_like("mistral", "Mistral", 1.0, {"num_key_value_heads": 1, "sliding_window": 64}),
    "qwen2": _llama_like("qwen2", "Qwen2", 1.0, {"num_key_value_heads": 2}),
    "gemma": _llama_like("gemma", "Gemma", 0.0, {"num_key_value_heads": 1, "head_dim": 32}),
}

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def import_torch() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    configure_torch(torch)  # hardware.<device>.threads: intra- and inter-op pools
    return torch


def _get(module: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


# --------------------------------------------------------------------------------------------
# building


def make_config(family: Family, overrides: Mapping[str, Any], num_layers: int) -> Any:
    import transformers

    bad = [k for k in overrides if k in LAYER_KEYS]
    if bad:
        raise ValueError(f"model.params.config.{bad[0]}: set the depth with model.params.num_layers")
    cls = getattr(transformers, family.config_class)
    layer_key = getattr(cls, "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")
    cfg = cls(**{**dict(overrides), layer_key: num_layers})
    cfg.use_cache = False
    return cfg


def build_torch_model(family: Family, config: Any, attn_implementation: str) -> Any:
    torch = import_torch()
    import transformers

    config._attn_implementation = attn_implementation
    cls = getattr(transformers, family.model_class)
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: initialise, then overwrite
        model = cls(config)
    else:
        with no_init_weights():  # (which also skips tying the embeddings: tie them here)
            model = cls(config)
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
    model.eval()
    torch.set_grad_enabled(False)
    return model


def torch_tensor_specs(model: Any, family: Family, std: float, dtype: str) -> list[TensorSpec]:
    """How each parameter is generated: uniform with standard deviation ``std`` (matrices,
    embeddings, biases), the family's constant for norm weights. Tied parameters appear once."""
    limit = std * math.sqrt(3.0)
    specs = []
    for name, p in model.named_parameters():
        shape = tuple(int(d) for d in p.shape)
        if p.dim() >= 2 or name.endswith("bias"):
            specs.append(TensorSpec(name, shape, dtype, limit=limit))
        else:
            specs.append(TensorSpec(name, shape, dtype, constant=family.norm_init))
    return specs


def assign_torch_weights(model: Any, tensors: Mapping[str, np.ndarray]) -> None:
    torch = import_torch()
    params = dict(model.named_parameters())
    if set(params) != set(tensors):
        missing = sorted(set(params) - set(tensors))[:5]
        extra = sorted(set(tensors) - set(params))[:5]
        raise ValueError(f"weights file does not fit the model (missing {missing}, extra {extra})")
    for name, p in params.items():
        p.data.copy_(torch.from_numpy(np.array(tensors[name], dtype=np.float32)))


# --------------------------------------------------------------------------------------------
# the staged model


class HFDecoderModel(ArrayStageModel):
    """A decoder-only LM split into embedding, decoder layers and head."""

    # The agent profiles a generation with it (dit.device.adapter.GeneratesTokens): named, not imported,
    # so the device code stays stdlib-only and this module needs no import of its profiler.
    generation_profiler = "dit.models.decoder_profile:profile_generation"

    def __init__(
        self,
        name: str,
        family: Family,
        model: Any,
        spec: Mapping[str, Any],
        *,
        prompt_len: int,
        weights: WeightsRecord | None = None,
    ) -> None:
        self.torch = import_torch()
        self.name = name
        self.family = family
        self.model = model
        self.config = model.config
        self.spec = dict(spec)
        self.weights = weights
        self.prompt_len = prompt_len
        self.tokenizer: Any = None  # the model's own tokenizer when it has one (trained models)
        base = getattr(model, family.base)
        self.base = base
        self.embed = getattr(base, family.embed)
        self.wpe = getattr(base, family.positions) if family.positions else None
        self.layers = list(getattr(base, family.layers))
        self.norm = getattr(base, family.final_norm)
        self.head = model.lm_head
        self.rotary_emb: Any = getattr(base, "rotary_emb", None)
        cfg = self.config
        self.hidden = int(cfg.hidden_size)
        self.vocab = int(cfg.vocab_size)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        attn0 = getattr(self.layers[0], family.attn)
        self.head_dim = int(getattr(attn0, "head_dim", self.hidden // self.heads))
        self.intermediate = int(
            getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * self.hidden
        )
        window = getattr(cfg, "sliding_window", None)
        self.max_len = min(int(getattr(cfg, "max_position_embeddings", 1 << 30)), int(window or 1 << 30))
        if prompt_len > self.max_len:
            raise ValueError(f"{name}: prompt_len {prompt_len} exceeds the model's {self.max_len} positions")
        self._cache_kw = _cache_keyword(self.layers[0])
        n = len(self.layers)
        T = prompt_len
        self.specs = [
            ArraySpec((1, T), "int64"),
            *[ArraySpec((1, T, self.hidden), "float32") for _ in range(n + 1)],
            ArraySpec((1, self.vocab), "float32"),
        ]
        self.stage_names = ["prompt", "embedding", *(f"layer{i}" for i in range(n)), "norm_head"]
        self.stage_ops = [0, *self._analytic_ops(T)]

    # ---- analytic operation counts (multiply-accumulates + element-wise) ----

    def layer_op_counts(self, tq: int, tk: int) -> dict[str, int]:
        """Per layer for ``tq`` new tokens attending over ``tk`` positions: per head, projection, FFN."""
        d, H = self.head_dim, self.hidden
        group = self.heads // self.kv_heads
        head = tq * H * d + 2 * tq * H * d // group + 2 * tq * tk * d + 3 * tq * tk
        proj = tq * self.heads * d * H
        ffn_mats = len(self.family.mlp_modules)
        ffn = ffn_mats * tq * H * self.intermediate + 2 * tq * self.intermediate
        norms = 2 * 4 * tq * H + 2 * tq * H  # two norms, two residual additions
        return {"head": head, "projection": proj, "ffn": ffn, "other": norms}

    def _analytic_ops(self, T: int) -> list[int]:
        c = self.layer_op_counts(T, T)
        layer = self.heads * c["head"] + c["projection"] + c["ffn"] + c["other"]
        return [T * self.hidden, *([layer] * len(self.layers)), 4 * self.hidden + self.hidden * self.vocab]

    # ---- execution ----

    def make_input(self) -> np.ndarray:
        inp = self.spec.get("input") or {}
        kind = input_kind(inp)
        if kind not in ("synthetic", "npy"):
            raise ValueError(f"input.kind: {kind!r}: a language model takes synthetic or npy token ids")
        if kind == "npy":
            ids: np.ndarray = (
                np.load(os.path.expanduser(str(inp["path"])), allow_pickle=False)
                .astype(np.int64)
                .reshape(1, -1)
            )
            if ids.shape[1] != self.prompt_len or ids.min() < 0 or ids.max() >= self.vocab:
                raise ValueError(f"input.path: expected {self.prompt_len} token ids in 0..{self.vocab - 1}")
            return ids
        rng = np.random.default_rng(input_seed(self.spec))
        return rng.integers(0, self.vocab, size=(1, self.prompt_len), dtype=np.int64)

    def _mask(self, tq: int, offset: int) -> Any:
        torch = self.torch
        q = torch.arange(offset, offset + tq).unsqueeze(1)
        k = torch.arange(offset + tq).unsqueeze(0)
        mask = torch.zeros(tq, offset + tq, dtype=torch.float32)
        mask.masked_fill_(k > q, torch.finfo(torch.float32).min)
        return mask[None, None]

    def layer_kwargs(self, hidden: Any, offset: int, cache: Any = None) -> dict[str, Any]:
        """The keyword arguments a decoder layer of this family takes for ``hidden`` at ``offset``."""
        torch = self.torch
        tq = int(hidden.shape[1])
        # SDPA applies the causal mask itself (is_causal when no mask is given), the eager
        # implementation needs it spelled out
        mask = None if self.config._attn_implementation == "sdpa" else self._mask(tq, offset)
        kw: dict[str, Any] = {"attention_mask": mask}
        if self.family.rotary:
            pos = torch.arange(offset, offset + tq).unsqueeze(0)
            kw["position_ids"] = pos
            kw["position_embeddings"] = self.rotary_emb(hidden, pos)
        if cache is not None:
            kw[self._cache_kw] = cache
            kw["use_cache"] = True
        return kw

    def _stage(self, stage: int, x: Any, offset: int = 0, cache: Any = None) -> Any:
        torch = self.torch
        n = len(self.layers)
        with torch.inference_mode():
            if stage == 1:
                ids = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x, dtype=np.int64))
                h = self.embed(ids)
                if self.wpe is not None:
                    h = h + self.wpe(torch.arange(offset, offset + ids.shape[1]).unsqueeze(0))
                return h
            h = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x, dtype=np.float32))
            if stage <= n + 1:
                out = self.layers[stage - 2](h, **self.layer_kwargs(h, offset, cache))
                return out[0] if isinstance(out, tuple) else out
            return self.head(self.norm(h[:, -1:, :]))[:, -1, :]

    def run_stage(self, stage: int, x: Any) -> Any:
        self._check(stage, 1)
        return self._stage(stage, x)

    def forward(self, x: Any) -> Any:
        """The unpartitioned Hugging Face forward pass (the reference of the equivalence check)."""
        torch = self.torch
        with torch.inference_mode():
            ids = torch.from_numpy(np.array(x, dtype=np.int64))
            try:
                out = self.model(input_ids=ids, use_cache=False, logits_to_keep=1)
            except TypeError:  # older transformers
                out = self.model(input_ids=ids, use_cache=False)
            return out.logits[:, -1, :]

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.config)
        except TypeError:
            return DynamicCache()

    def generate(self, prompt: Any, max_new_tokens: int, stage_hook: Any = None) -> list[int]:
        """Greedy decoding stage by stage with a KV cache; ``stage_hook(token, stage, seconds)``."""
        torch = self.torch
        cache = self.new_cache()
        ids = torch.from_numpy(np.array(prompt, dtype=np.int64).reshape(1, -1))
        offset = 0
        out: list[int] = []
        for token in range(max_new_tokens):
            x: Any = ids
            for stage in range(1, self.num_stages + 1):
                t0 = time.monotonic_ns()
                x = self._stage(stage, x, offset, cache)
                if stage_hook is not None:
                    stage_hook(token, stage, time.monotonic_ns() - t0)
            offset += int(ids.shape[1])
            nxt = int(torch.argmax(x, dim=-1)[0])
            out.append(nxt)
            ids = torch.tensor([[nxt]], dtype=torch.int64)
        return out

    def reference_generate(self, prompt: Any, max_new_tokens: int) -> list[int]:
        """Greedy decoding with the Hugging Face model in one piece, without a cache."""
        torch = self.torch
        ids = torch.from_numpy(np.array(prompt, dtype=np.int64).reshape(1, -1))
        out: list[int] = []
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                nxt = int(torch.argmax(self.model(input_ids=ids, use_cache=False).logits[0, -1]))
                out.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        return out

    def encode(self, x: Any) -> bytes:
        return super().encode(to_numpy(x))


def _cache_keyword(layer: Any) -> str:
    params = inspect.signature(layer.forward).parameters
    for kw in ("cache", "past_key_values", "past_key_value", "layer_past"):
        if kw in params:
            return kw
    return "cache"


# --------------------------------------------------------------------------------------------
# head-wise attention


@dataclass
class HeadResult:
    outputs: list[Any]  # per head: its contribution to the attention output [1, T, hidden]
    head_ns: list[int]  # per head: q/k/v slices, rotary, scores, softmax, weighted values
    proj_ns: list[int]  # per head: its slice of the output projection
    bias: Any  # the output projection's bias (added once), or None
    keys: list[Any] = field(default_factory=list)  # per head: keys after this call (rotated)
    values: list[Any] = field(default_factory=list)


def _rotate_half(torch: Any, x: Any) -> Any:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def head_outputs(
    family: Family,
    attn: Any,
    hidden: Any,
    *,
    heads: int,
    kv_heads: int,
    position_embeddings: Any = None,
    offset: int = 0,
    past: Sequence[tuple[Any, Any]] | None = None,
) -> HeadResult:
    """Compute an attention module head by head (causal, ``hidden`` at positions ``offset..``).

    ``past[h]`` are head ``h``'s cached (keys, values) of the earlier positions (each head keeps
    its own copy, as it would on its own device; with grouped-query attention, the heads of a
    group hold the same KV head). The sum of ``outputs`` plus ``bias`` is the module's output.
    """
    torch = import_torch()
    d = int(getattr(attn, "head_dim", hidden.shape[-1] // heads))
    scaling = float(getattr(attn, "scaling", d**-0.5))
    group = heads // kv_heads
    o = getattr(attn, family.o)
    tq = int(hidden.shape[1])
    x = hidden[0]  # [T, H]
    if family.qkv is not None:
        w, b = getattr(attn, family.qkv).weight, getattr(attn, family.qkv).bias
        width = heads * d
    res = HeadResult([], [], [], o.bias)
    with torch.inference_mode():
        for h in range(heads):
            t0 = time.monotonic_ns()
            g = h // group
            qs, ks = slice(h * d, (h + 1) * d), slice(g * d, (g + 1) * d)
            if family.qkv is not None:  # Conv1D: x @ W[:, cols] + b[cols]
                q = x @ w[:, qs] + b[qs]
                k = x @ w[:, width + ks.start : width + ks.stop] + b[width + ks.start : width + ks.stop]
                v = (
                    x @ w[:, 2 * width + ks.start : 2 * width + ks.stop]
                    + b[2 * width + ks.start : 2 * width + ks.stop]
                )
            else:
                q = _linear_rows(torch, getattr(attn, family.q or ""), x, qs)
                k = _linear_rows(torch, getattr(attn, family.k or ""), x, ks)
                v = _linear_rows(torch, getattr(attn, family.v or ""), x, ks)
            if family.rotary:
                cos, sin = position_embeddings[0][0], position_embeddings[1][0]  # [T, d]
                q = q * cos + _rotate_half(torch, q) * sin
                k = k * cos + _rotate_half(torch, k) * sin
            if past is not None and past[h][0] is not None:
                k = torch.cat([past[h][0], k], dim=0)
                v = torch.cat([past[h][1], v], dim=0)
            scores = (q @ k.T) * scaling  # [Tq, Tk]
            tk = int(k.shape[0])
            qpos = torch.arange(offset, offset + tq).unsqueeze(1)
            kpos = torch.arange(tk).unsqueeze(0)
            scores = scores.masked_fill(kpos > qpos, float("-inf"))
            a = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v  # [Tq, d]
            t1 = time.monotonic_ns()
            part = a @ o.weight[qs, :] if family.conv1d else a @ o.weight[:, qs].T
            t2 = time.monotonic_ns()
            res.outputs.append(part.unsqueeze(0))
            res.head_ns.append(t1 - t0)
            res.proj_ns.append(t2 - t1)
            res.keys.append(k)
            res.values.append(v)
    return res


def _linear_rows(torch: Any, lin: Any, x: Any, rows: slice) -> Any:
    out = x @ lin.weight[rows, :].T
    if lin.bias is not None:
        out = out + lin.bias[rows]
    return out


def headwise_sum(res: HeadResult) -> Any:
    total = res.outputs[0]
    for part in res.outputs[1:]:
        total = total + part
    return total if res.bias is None else total + res.bias


# --------------------------------------------------------------------------------------------
# builders


def build_decoder(spec: Mapping[str, Any], cat_name: str, family_name: str | None = None) -> HFDecoderModel:
    torch = import_torch()
    cat = entry(cat_name)
    params = cat.defaults(spec_params(spec))
    fam_name = family_name or str(params.get("family", ""))
    family = FAMILIES.get(fam_name)
    if family is None:
        raise ValueError(f"model.params.family: {fam_name!r} is not one of {', '.join(FAMILIES)}")
    params.setdefault("family", fam_name)
    params["config"] = dict(params.get("config") or family.tiny)
    overrides = params["config"]
    num_layers = positive_int(params, "num_layers", 2)
    params["num_layers"] = num_layers
    prompt_len = positive_int(params, "prompt_len", 16)
    wdtype = str(params.setdefault("weights_dtype", "float32"))
    if wdtype not in ("float32", "float16"):
        raise ValueError(f"model.params.weights_dtype: {wdtype!r} is not float32 or float16")
    config = make_config(family, overrides, num_layers)
    seed = int(params.get("weights_seed", 0))
    torch.manual_seed(seed)
    model = build_torch_model(family, config, str(params.get("attn_implementation", "sdpa")))
    std = float(getattr(config, "initializer_range", 0.02))
    identity = cat.weight_identity(params)
    tensors, record = ensure_weights(
        name=cat_name,
        params=identity,
        seed=seed,
        specs=lambda: torch_tensor_specs(model, family, std, wdtype),
        expected_sha256=expected_sha256(cat_name, identity, seed),
        directory=weights_dir(params.get("weights_dir")),
    )
    assign_torch_weights(model, tensors)
    del tensors
    return HFDecoderModel(
        str(spec.get("name", cat_name)), family, model, spec, prompt_len=prompt_len, weights=record
    )


def build(spec: Mapping[str, Any]) -> HFDecoderModel:
    """Builder ``dit.models.hf_decoder:build``: params ``family``, ``config`` (overrides of the
    family's config; default: the family's tiny test config), ``num_layers``, ``prompt_len``."""
    return build_decoder(spec, "hf_decoder")
