"""The decoder: seeded or checkpoint weights, per-unit compute functions, a single-process reference.

Weights live in one flat ``dict[str, Tensor]`` with this package's own names (``L3.q.weight``, ...,
``nn.Linear`` layout: ``[out, in]``). Placement units never see whole layers: ``unit_weights`` cuts the
tensors a unit owns (a query head's Wq rows, its norm copy; a projection; an FFN) as contiguous
copies, and ``kv_weights`` cuts one KV head. The reference ``generate`` runs exactly these per-unit
functions on exactly these cuts, in one process, so that the distributed engine -- which runs the same
functions on the same cuts on other workers -- reproduces it bit for bit (a matmul on a slice may round
differently from the slice of a full matmul; using the same cuts everywhere takes that off the table).
``batched_generate`` is the textbook all-heads-at-once formulation, kept to check the decomposition
against (agreement within float32 rounding, not bit-identity).

Seeded weights: every tensor has its own ``torch.Generator`` seeded from ``cfg.seed`` and the tensor's
name (CRC32), so a worker materialises only the tensors its units need, in any order, and gets the same
values as every other process. A worker never holds more: ``unit_weights_from`` builds a unit from a
``TensorSource`` that yields just the rows it keeps -- ``SeededSource`` draws them (the whole tensor's
values), ``CheckpointSource`` reads only their bytes from the safetensors files.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import torch
import torch.nn.functional as F

from headsplit import checkpoint as ckpt
from headsplit.checkpoint import CheckpointError, checkpoint_sha256, sha256_file
from headsplit.config import ModelConfig
from headsplit.units import DTYPE_BYTES, Unit

Weights = dict[str, torch.Tensor]
__all__ = ["CheckpointError", "checkpoint_sha256", "sha256_file"]  # re-exported from headsplit.checkpoint

INIT_STD = 0.02  # GPT-2's initialiser


# --------------------------------------------------------------------------------------------- names


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model in this package's layout, name -> shape."""
    d, f, hd = cfg.hidden, cfg.ffn_hidden, cfg.head_dim
    kv = cfg.n_kv_heads * hd
    gpt2 = cfg.family == "gpt2"
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (cfg.vocab, d)}
    if gpt2:
        shapes["pos.weight"] = (cfg.max_positions, d)
    for i in range(cfg.n_layers):
        p = f"L{i}."
        for norm in ("attn_norm", "ffn_norm"):
            shapes[p + norm + ".weight"] = (d,)
            if gpt2:
                shapes[p + norm + ".bias"] = (d,)
        for name, rows in (("q", d), ("k", kv), ("v", kv), ("o", d)):
            shapes[p + name + ".weight"] = (rows, d)
            if gpt2:
                shapes[p + name + ".bias"] = (rows,)
        if gpt2:
            shapes.update(
                {p + "fc.weight": (f, d), p + "fc.bias": (f,), p + "fc2.weight": (d, f), p + "fc2.bias": (d,)}
            )
        else:
            shapes.update({p + "gate.weight": (f, d), p + "up.weight": (f, d), p + "down.weight": (d, f)})
    shapes["final_norm.weight"] = (d,)
    if gpt2:
        shapes["final_norm.bias"] = (d,)
    else:
        shapes["lm_head.weight"] = (cfg.vocab, d)  # TinyLlama does not tie; GPT-2 ties to embed
    return shapes


def _generator(cfg: ModelConfig, name: str) -> torch.Generator:
    return torch.Generator().manual_seed((cfg.seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))


def _std(cfg: ModelConfig, name: str) -> float:
    if name.endswith(("o.weight", "fc2.weight", "down.weight")):
        return INIT_STD / math.sqrt(2 * cfg.n_layers)  # GPT-2's scaling of residual projections
    if name == "pos.weight":
        return INIT_STD / 2
    return INIT_STD


# torch's CPU normal sampler draws 16 values at a time (Box-Muller over a block of 16 uniforms) and
# redraws the last 16 of a request whose size is not a multiple of 16: requests of whole rows, each a
# multiple of 16 values, consume the generator exactly as one request of the whole tensor does, so rows
# drawn in pieces are the whole tensor's rows bit for bit (test_model.py checks it on every preset).
NORMAL_BLOCK = 16
SKIP_ELEMENTS = 1 << 20  # rows not kept are drawn and dropped in pieces of at most this many values


class TensorSource(Protocol):
    """Rows of this package's tensors (``tensor_shapes`` names and layout), float32 and contiguous, one
    request at a time: a worker builds its units one by one from it and never holds a whole tensor it
    does not keep."""

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor: ...


def _span(shape: tuple[int, ...], start: int, stop: int | None) -> int:
    stop = shape[0] if stop is None else stop
    if not 0 <= start <= stop <= shape[0]:
        raise ValueError(f"rows {start}:{stop} outside a tensor of {shape[0]} rows")
    return stop


class SeededSource:
    """Seeded weights (``cfg.seed``), drawn per request: every tensor has its own generator (seed and the
    tensor's CRC32), so a worker draws only the rows its units keep, in any order, and gets the values
    every other process gets for the whole tensor. Rows after one request continue the same generator
    (a worker's heads of one layer are consecutive row blocks of Wq: drawn once, not from the start each)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.shapes = tensor_shapes(cfg)
        self._streams: dict[str, tuple[torch.Generator, int]] = {}  # name -> generator, next row

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        shape = self.shapes[name]
        stop = _span(shape, start, stop)
        out_shape = (stop - start, *shape[1:])
        if name.endswith("norm.weight"):
            return torch.ones(out_shape)
        if "norm" in name:
            return torch.zeros(out_shape)
        cols = math.prod(shape[1:])
        std = _std(self.cfg, name)
        if (start, stop) == (0, shape[0]) or cols % NORMAL_BLOCK:
            # the whole tensor; rows of one whose rows are not whole blocks (1-D biases) are cut from it
            whole = torch.randn(shape, generator=_generator(self.cfg, name), dtype=torch.float32).mul_(std)
            return whole if stop - start == shape[0] else whole[start:stop].clone()
        gen, at = self._streams.pop(name, (None, 0))
        if gen is None or at > start:
            gen, at = _generator(self.cfg, name), 0
        step = max(1, SKIP_ELEMENTS // cols)
        while at < start:
            n = min(step, start - at)
            torch.randn((n, cols), generator=gen, dtype=torch.float32)
            at += n
        out = torch.randn((stop - start, cols), generator=gen, dtype=torch.float32).mul_(std)
        if stop < shape[0]:
            self._streams[name] = (gen, stop)
        return out.reshape(out_shape)


class WeightsSource:
    """Rows cut from weights already in memory (the single-process reference), as contiguous copies."""

    def __init__(self, w: Weights) -> None:
        self.w = w

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        t = self.w[name]
        stop = _span(tuple(t.shape), start, stop)
        return t[start:stop].clone()


class FilledSource:
    """Rows of one value (norm weights 1, biases 0): the shapes without the cost of drawing them, for
    timing a unit's kernels (their speed does not depend on the values; drawing TinyLlama's FFN alone
    takes longer than timing it)."""

    def __init__(self, cfg: ModelConfig, value: float = INIT_STD) -> None:
        self.shapes = tensor_shapes(cfg)
        self.value = value

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        shape = self.shapes[name]
        out_shape = (_span(shape, start, stop) - start, *shape[1:])
        if name.endswith("norm.weight"):
            return torch.ones(out_shape)
        return torch.zeros(out_shape) if name.endswith(".bias") else torch.full(out_shape, self.value)


def seeded_weights(cfg: ModelConfig, names: Iterable[str] | None = None) -> Weights:
    """Deterministic weights from ``cfg.seed``; only ``names`` if given (a worker's share)."""
    src = SeededSource(cfg)
    return {n: src.rows(n) for n in (src.shapes if names is None else names)}


def unit_tensor_names(cfg: ModelConfig, unit: Unit) -> list[str]:
    """The full tensors a unit is cut from (a worker needs only these)."""
    p = f"L{unit.layer}."
    shapes = tensor_shapes(cfg)
    if unit.kind == "head":
        stems = ["attn_norm", "q"]
    elif unit.kind == "proj":
        stems = ["o"]
    else:
        stems = ["ffn_norm", "fc", "fc2"] if cfg.family == "gpt2" else ["ffn_norm", "gate", "up", "down"]
    return [n for s in stems for n in (p + s + ".weight", p + s + ".bias") if n in shapes]


def kv_tensor_names(cfg: ModelConfig, layer: int) -> list[str]:
    p = f"L{layer}."
    shapes = tensor_shapes(cfg)
    return [n for s in ("k", "v") for n in (p + s + ".weight", p + s + ".bias") if n in shapes]


def controller_tensor_names(cfg: ModelConfig) -> list[str]:
    """Embedding, positions, final norm, LM head: they stay on the controller."""
    return [n for n in tensor_shapes(cfg) if not n.startswith("L")]


def unit_weights_from(cfg: ModelConfig, src: TensorSource, unit: Unit) -> Weights:
    """The tensors a unit owns (short keys), read from ``src``: a query head's Wq rows and its norm copy,
    a projection, an FFN. Each is its own contiguous tensor."""
    p = f"L{unit.layer}."
    if unit.kind == "head":
        hd = cfg.head_dim
        a, b = unit.head * hd, (unit.head + 1) * hd
        out = {"norm.weight": src.rows(p + "attn_norm.weight"), "q.weight": src.rows(p + "q.weight", a, b)}
        if cfg.family == "gpt2":
            out["norm.bias"] = src.rows(p + "attn_norm.bias")
            out["q.bias"] = src.rows(p + "q.bias", a, b)
        return out
    return {n[len(p) :]: src.rows(n) for n in unit_tensor_names(cfg, unit)}


def kv_weights_from(cfg: ModelConfig, src: TensorSource, layer: int, kv_head: int) -> Weights:
    """One KV head's Wk/Wv rows (and biases), read from ``src``."""
    p = f"L{layer}."
    a, b = kv_head * cfg.head_dim, (kv_head + 1) * cfg.head_dim
    return {n[len(p) :]: src.rows(n, a, b) for n in kv_tensor_names(cfg, layer)}


def unit_weights(cfg: ModelConfig, w: Weights, unit: Unit) -> Weights:
    """The tensors a unit owns, cut from full weights as contiguous copies (short keys)."""
    return unit_weights_from(cfg, WeightsSource(w), unit)


def kv_weights(cfg: ModelConfig, w: Weights, layer: int, kv_head: int) -> Weights:
    """One KV head's Wk/Wv rows (and biases), contiguous copies."""
    return kv_weights_from(cfg, WeightsSource(w), layer, kv_head)


# ---------------------------------------------------------------------------------------- checkpoint


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files a checkpoint path stands for (see ``headsplit.checkpoint``)."""
    return ckpt.weight_files(path)


_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


@dataclass(frozen=True)
class _Stored:
    """Where one tensor of a safetensors file is: its dtype code, shape and absolute byte offset."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int


def _index(files: Iterable[Path]) -> dict[str, _Stored]:
    """Every tensor of the files, from their headers alone (8-byte size, JSON header): nothing is read
    beyond them until a tensor's rows are asked for. GPT-2's ``transformer.`` prefix is dropped."""
    out: dict[str, _Stored] = {}
    for path in files:
        with path.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, _ = meta["data_offsets"]
            stored = _Stored(path, str(meta["dtype"]), tuple(int(d) for d in meta["shape"]), 8 + n + start)
            out[name.removeprefix("transformer.")] = stored
    return out


@dataclass(frozen=True)
class _From:
    """Where rows of one of this package's tensors are stored: the stored tensor, whether this package's
    rows are its columns (GPT-2's Conv1D ``[in, out]``), and the offset of row 0 along that axis (q, k
    and v side by side in GPT-2's fused ``c_attn``)."""

    stored: str
    transposed: bool = False
    offset: int = 0
    parts: int = 1  # how many of this package's tensors the stored one holds side by side


class CheckpointSource:
    """Rows of this package's tensors read from a checkpoint's safetensors files (this package's names,
    or Hugging Face names of GPT2LMHeadModel / GPT2Model / LlamaForCausalLM): only the bytes of the
    rows asked for are read (a seek into the file, as safetensors' ``get_slice`` does), so a worker
    holds its units' slices and never a whole model. The checkpoint is not verified here
    (:func:`load_checkpoint`, :func:`headsplit.engine.load_share` do that first)."""

    def __init__(self, cfg: ModelConfig, path: Path) -> None:
        self.cfg = cfg
        self.path = path
        self.shapes = tensor_shapes(cfg)
        self.stored = _index(checkpoint_files(path))
        # this package's names (a per-worker shard has no embedding); lm_head.weight is also Llama's HF name
        own = any(k in self.shapes and k != "lm_head.weight" for k in self.stored)
        self._hf = None if own else _hf_names(cfg)

    def _from(self, name: str) -> _From | None:
        if self._hf is None:
            return _From(name) if name in self.stored else None
        if self.cfg.family == "gpt2":
            layer, _, rest = name.partition(".")
            stem, _, kind = rest.partition(".")
            if layer.startswith("L") and stem in ("q", "k", "v"):
                offset = "qkv".index(stem) * self.cfg.hidden
                return _From(f"h.{layer[1:]}.attn.c_attn.{kind}", kind == "weight", offset, 3)
        theirs = self._hf.get(name)
        if theirs in self.stored:
            transposed = self.cfg.family == "gpt2" and theirs.endswith(("c_proj.weight", "c_fc.weight"))
            return _From(theirs, transposed)
        if name == "lm_head.weight" and self.cfg.family == "llama":
            return self._from("embed.weight")  # tied llama checkpoints
        return None

    def rows(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        need = self.shapes[name]
        stop = _span(need, start, stop)
        where = self._from(name)
        if where is None:
            raise CheckpointError(f"checkpoint {self.path}: tensor {name} (model {self.cfg.name}) is missing")
        st = self.stored[where.stored]
        shape = st.shape[::-1] if where.transposed else st.shape
        if where.parts == 1 and shape != need:
            raise CheckpointError(
                f"checkpoint {self.path}: tensor {name} has shape {shape}, model {self.cfg.name} needs {need}"
            )
        if where.parts > 1 and (shape[0] != where.parts * need[0] or shape[1:] != need[1:]):
            raise CheckpointError(
                f"checkpoint {self.path}: tensor {where.stored} has shape {st.shape}, model {self.cfg.name} "
                f"needs {where.parts} tensors of {need} side by side in it ({name} one of them)"
            )
        dtype = _ST_DTYPES.get(st.dtype)
        if dtype is None:
            raise CheckpointError(
                f"{st.file}: tensor {where.stored} has dtype {st.dtype}; readable: {', '.join(_ST_DTYPES)}"
            )
        n = stop - start
        item = dtype.itemsize
        with st.file.open("rb") as fh:
            if not where.transposed:
                row = math.prod(shape[1:])
                fh.seek(st.offset + (where.offset + start) * row * item)
                raw = _read(fh, n * row * item, st.file, where.stored)
                t = _from_bytes(raw, dtype).reshape(n, *need[1:])
            else:  # this package's rows are columns of the stored [in, out]: one run of bytes per stored row
                rows_in, cols = st.shape
                raw = bytearray(rows_in * n * item)
                for r in range(rows_in):
                    fh.seek(st.offset + (r * cols + where.offset + start) * item)
                    raw[r * n * item : (r + 1) * n * item] = _read(fh, n * item, st.file, where.stored)
                t = _from_bytes(raw, dtype).reshape(rows_in, n).t()
        return t.to(torch.float32).contiguous()


def _read(fh: BinaryIO, n: int, file: Path, name: str) -> bytearray:
    raw = bytearray(fh.read(n))
    if len(raw) != n:
        raise CheckpointError(
            f"{file}: tensor {name} is cut short ({len(raw)} of {n} bytes): the file is truncated"
        )
    return raw


def _from_bytes(raw: bytearray, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)


def write_safetensors(path: Path, tensors: Weights) -> None:
    """Write float32 tensors as a safetensors file (tests, and exporting seeded weights)."""
    src = WeightsSource(tensors)
    write_rows(path, {n: tuple(t.shape) for n, t in tensors.items()}, src.rows)


def write_rows(path: Path, shapes: dict[str, tuple[int, ...]], read: Callable[[str], torch.Tensor]) -> None:
    """Write a float32 safetensors file of the tensors ``shapes`` names, each read (``read(name)``) and
    written in turn: a per-worker shard of a whole checkpoint holds one tensor at a time in memory."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in shapes.items():
        size = DTYPE_BYTES * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(head)))
        fh.write(head)
        for name, shape in shapes.items():
            t = read(name).detach().to(torch.float32).contiguous()
            if tuple(t.shape) != shape:
                raise ValueError(f"{path}: tensor {name} has shape {tuple(t.shape)}, the header says {shape}")
            fh.write(t.numpy().tobytes())


def _hf_names(cfg: ModelConfig) -> dict[str, str]:
    """This package's name -> the Hugging Face name, for the two families (GPT2LMHeadModel without
    its ``transformer.`` prefix, which is stripped on reading; LlamaForCausalLM)."""
    m: dict[str, str] = {}
    if cfg.family == "gpt2":
        m.update({"embed.weight": "wte.weight", "pos.weight": "wpe.weight"})
        m.update({"final_norm.weight": "ln_f.weight", "final_norm.bias": "ln_f.bias"})
        for i in range(cfg.n_layers):
            p, h = f"L{i}.", f"h.{i}."
            for ours, theirs in (
                ("attn_norm", "ln_1"),
                ("ffn_norm", "ln_2"),
                ("o", "attn.c_proj"),
                ("fc", "mlp.c_fc"),
                ("fc2", "mlp.c_proj"),
            ):
                m[p + ours + ".weight"] = h + theirs + ".weight"
                m[p + ours + ".bias"] = h + theirs + ".bias"
            # q, k, v come fused in attn.c_attn: CheckpointSource reads them from it
        return m
    m.update(
        {
            "embed.weight": "model.embed_tokens.weight",
            "final_norm.weight": "model.norm.weight",
            "lm_head.weight": "lm_head.weight",
        }
    )
    for i in range(cfg.n_layers):
        p, h = f"L{i}.", f"model.layers.{i}."
        pairs = (
            ("attn_norm", "input_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
            ("q", "self_attn.q_proj"),
            ("k", "self_attn.k_proj"),
            ("v", "self_attn.v_proj"),
            ("o", "self_attn.o_proj"),
            ("gate", "mlp.gate_proj"),
            ("up", "mlp.up_proj"),
            ("down", "mlp.down_proj"),
        )
        for ours, theirs in pairs:
            m[p + ours + ".weight"] = h + theirs + ".weight"
    return m


def load_checkpoint(
    cfg: ModelConfig, path: str | Path, sha256: str, names: Iterable[str] | None = None
) -> Weights:
    """Verify the checkpoint's SHA-256 (``checkpoint_sha256``), then read it.

    ``path``: a safetensors file or a Hugging Face-format directory (``headsplit.checkpoint``: its pin,
    its shards). Accepted layouts: this package's own names (``tensor_shapes``; per-worker shards), or
    Hugging Face names of GPT2LMHeadModel / GPT2Model (with or without ``transformer.``) and
    LlamaForCausalLM. safetensors only (no pickled ``.bin``). ``names``: only these of this package's
    tensors are read (a worker's share; the controller's embedding and LM head), nothing else.
    """
    p = Path(path)
    ckpt.verify(p, sha256)
    src = CheckpointSource(cfg, p)
    return {n: src.rows(n) for n in (src.shapes if names is None else names)}


def to_hf(cfg: ModelConfig, w: Weights) -> Weights:
    """This package's weights in Hugging Face layout (tests of the name mapping; exporting)."""
    out: Weights = {}
    for ours, theirs in _hf_names(cfg).items():
        if ours in w:
            t = w[ours]
            if cfg.family == "gpt2" and theirs.endswith(("c_proj.weight", "c_fc.weight")):
                t = t.t().contiguous()
            out[theirs] = t
    if cfg.family == "gpt2":
        for i in range(cfg.n_layers):
            out[f"h.{i}.attn.c_attn.weight"] = (
                torch.cat([w[f"L{i}.{s}.weight"] for s in "qkv"]).t().contiguous()
            )
            out[f"h.{i}.attn.c_attn.bias"] = torch.cat([w[f"L{i}.{s}.bias"] for s in "qkv"])
    return out


# ------------------------------------------------------------------------------------------- compute


def norm(cfg: ModelConfig, w: Weights, prefix: str, x: torch.Tensor) -> torch.Tensor:
    if cfg.family == "gpt2":
        return F.layer_norm(x, (cfg.hidden,), w[prefix + ".weight"], w[prefix + ".bias"], cfg.norm_eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w[prefix + ".weight"]


def _rotary(cfg: ModelConfig, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the Hugging Face Llama convention (rotate_half)."""
    hd = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    half = hd // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * emb.cos() + rotated * emb.sin()


def _linear(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


@dataclass
class KVSlot:
    """One copy of one KV head of one layer on one worker: its Wk/Wv rows and its cache."""

    weights: Weights
    k: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    v: torch.Tensor = field(default_factory=lambda: torch.empty(0))

    @property
    def length(self) -> int:
        return int(self.k.shape[0]) if self.k.dim() == 2 else 0

    def truncate(self, n: int) -> None:
        if self.length > n:
            self.k, self.v = self.k[:n].clone(), self.v[:n].clone()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.weights.values(), self.k, self.v))


def positions_for(start_pos: int, n: int) -> torch.Tensor:
    return torch.arange(start_pos, start_pos + n)


def kv_project(
    cfg: ModelConfig, kvw: Weights, xn: torch.Tensor, start_pos: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one KV head for the (normed) rows of ``xn`` at positions start_pos.. (rotary on K)."""
    k = _linear(kvw, "k", xn)
    v = _linear(kvw, "v", xn)
    if cfg.family == "llama":
        k = _rotary(cfg, k, positions_for(start_pos, xn.shape[0]))
    return k, v


def head_attend(
    cfg: ModelConfig, hw: Weights, xn: torch.Tensor, start_pos: int, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """One query head: q from the normed rows, causal attention over the cache (K, V up to now)."""
    q = _linear(hw, "q", xn)
    n = xn.shape[0]
    if cfg.family == "llama":
        q = _rotary(cfg, q, positions_for(start_pos, n))
    scores = (q @ k.t()) / math.sqrt(cfg.head_dim)
    q_pos = positions_for(start_pos, n)[:, None]
    k_pos = torch.arange(k.shape[0])[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def heads_forward(
    cfg: ModelConfig, head_ws: dict[int, Weights], slots: dict[int, KVSlot], x: torch.Tensor, start_pos: int
) -> dict[int, torch.Tensor]:
    """A worker's share of one layer's attention: the norm once, each needed KV head once (its cache is
    cut back to ``start_pos`` first, which makes the call idempotent: a retry or a re-execution after a
    rejected speculation replaces the entries instead of appending twice), then every query head."""
    if not head_ws:
        return {}
    first = head_ws[min(head_ws)]
    xn = norm(cfg, first, "norm", x)
    for kvh in sorted({cfg.kv_head_of(h) for h in head_ws}):
        slot = slots[kvh]
        if slot.length < start_pos:
            raise RuntimeError(
                f"KV head {kvh}: cache holds {slot.length} positions, call starts at {start_pos}"
            )
        slot.truncate(start_pos)
        k, v = kv_project(cfg, slot.weights, xn, start_pos)
        if slot.length == 0:
            slot.k, slot.v = k, v
        else:
            slot.k, slot.v = torch.cat((slot.k, k)), torch.cat((slot.v, v))
    return {
        h: head_attend(cfg, hw, xn, start_pos, slots[cfg.kv_head_of(h)].k, slots[cfg.kv_head_of(h)].v)
        for h, hw in sorted(head_ws.items())
    }


def head(cfg: ModelConfig, hw: Weights, slot: KVSlot, x: torch.Tensor, start_pos: int) -> torch.Tensor:
    """One query head on the residual stream ``x`` with its own KV slot (a single-head ``heads_forward``)."""
    return heads_forward(cfg, {0: hw}, {0: slot}, x, start_pos)[0]


def proj(cfg: ModelConfig, pw: Weights, concat: torch.Tensor) -> torch.Tensor:
    """The layer's output projection of the concatenated head outputs (``[T, hidden]``)."""
    return _linear(pw, "o", concat)


def ffn(cfg: ModelConfig, fw: Weights, z: torch.Tensor) -> torch.Tensor:
    """The FFN's additive term on the post-attention stream Z (X = Z + ffn(Z))."""
    zn = norm(cfg, fw, "ffn_norm", z)
    if cfg.family == "gpt2":
        return _linear(fw, "fc2", F.gelu(_linear(fw, "fc", zn), approximate="tanh"))
    return _linear(fw, "down", F.silu(_linear(fw, "gate", zn)) * _linear(fw, "up", zn))


def embed(cfg: ModelConfig, w: Weights, ids: list[int], start_pos: int) -> torch.Tensor:
    idx = torch.tensor(ids, dtype=torch.long)
    x = F.embedding(idx, w["embed.weight"])
    if cfg.family == "gpt2":
        x = x + F.embedding(positions_for(start_pos, len(ids)), w["pos.weight"])
    return x


def lm_logits(cfg: ModelConfig, w: Weights, x_last: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head on the last position's residual stream (``[hidden]`` -> ``[vocab]``)."""
    head_w = w.get("lm_head.weight", w["embed.weight"])
    return F.linear(norm(cfg, w, "final_norm", x_last), head_w)


def ffn_ratio(delta: torch.Tensor, z: torch.Tensor) -> float:
    """||FFN(Z)|| / ||Z|| over the whole step (all rows), the speculation test."""
    zn = float(torch.linalg.vector_norm(z))
    dn = float(torch.linalg.vector_norm(delta))
    if zn == 0.0:
        return 0.0 if dn == 0.0 else math.inf
    return dn / zn


def check_positions(cfg: ModelConfig, n_prompt: int, n_tokens: int) -> None:
    if n_prompt < 1:
        raise ValueError("prompt: at least one token is needed")
    if n_tokens < 1:
        raise ValueError("tokens: must be >= 1")
    if n_prompt + n_tokens - 1 > cfg.max_positions:
        raise ValueError(
            f"prompt ({n_prompt}) + tokens ({n_tokens}) exceed model {cfg.name}'s max_positions {cfg.max_positions}"
        )


@dataclass
class Reference:
    """Result of the single-process reference: generated ids, logits per step, and per step per layer
    the FFN/Z norm ratio (what the speculation test would have seen)."""

    ids: list[int]
    logits: torch.Tensor  # [n_tokens, vocab]
    ratios: list[list[float]]


def generate_trace(cfg: ModelConfig, w: Weights, prompt_ids: list[int], n_tokens: int) -> Reference:
    """Greedy generation with KV caches, one process, through the per-unit functions (exact path)."""
    check_positions(cfg, len(prompt_ids), n_tokens)
    heads = {
        (u.layer, u.head): unit_weights(cfg, w, u)
        for u in (Unit(i, "head", h) for i in range(cfg.n_layers) for h in range(cfg.n_heads))
    }
    projs = [unit_weights(cfg, w, Unit(i, "proj")) for i in range(cfg.n_layers)]
    ffns = [unit_weights(cfg, w, Unit(i, "ffn")) for i in range(cfg.n_layers)]
    slots = [
        {kvh: KVSlot(kv_weights(cfg, w, i, kvh)) for kvh in range(cfg.n_kv_heads)}
        for i in range(cfg.n_layers)
    ]
    ids: list[int] = []
    logits: list[torch.Tensor] = []
    ratios: list[list[float]] = []
    step_ids, start = list(prompt_ids), 0
    with torch.no_grad():
        for _ in range(n_tokens):
            x = embed(cfg, w, step_ids, start)
            step_ratios: list[float] = []
            for i in range(cfg.n_layers):
                outs = heads_forward(cfg, {h: heads[(i, h)] for h in range(cfg.n_heads)}, slots[i], x, start)
                z = x + proj(cfg, projs[i], torch.cat([outs[h] for h in range(cfg.n_heads)], dim=-1))
                delta = ffn(cfg, ffns[i], z)
                step_ratios.append(ffn_ratio(delta, z))
                x = z + delta
            lg = lm_logits(cfg, w, x[-1])
            nxt = int(torch.argmax(lg))
            ids.append(nxt)
            logits.append(lg)
            ratios.append(step_ratios)
            start += len(step_ids)
            step_ids = [nxt]
    return Reference(ids, torch.stack(logits), ratios)


def generate(
    cfg: ModelConfig, w: Weights, prompt_ids: list[int], n_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """The single-process reference: ``n_tokens`` greedy ids (the first from the prompt's prefill) and
    their logits ``[n_tokens, vocab]``."""
    ref = generate_trace(cfg, w, prompt_ids, n_tokens)
    return ref.ids, ref.logits


def batched_generate(
    cfg: ModelConfig, w: Weights, prompt_ids: list[int], n_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """The textbook formulation: all heads at once with full Q/K/V matrices, GQA by repeating KV heads.
    Agrees with ``generate`` within float32 rounding; used only to check the decomposition."""
    check_positions(cfg, len(prompt_ids), n_tokens)
    nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    caches: list[tuple[torch.Tensor, torch.Tensor]] = [
        (torch.empty(nkv, 0, hd), torch.empty(nkv, 0, hd)) for _ in range(cfg.n_layers)
    ]
    ids: list[int] = []
    logits: list[torch.Tensor] = []
    step_ids, start = list(prompt_ids), 0
    with torch.no_grad():
        for _ in range(n_tokens):
            x = embed(cfg, w, step_ids, start)
            t = x.shape[0]
            pos = positions_for(start, t)
            for i in range(cfg.n_layers):
                p = f"L{i}."
                xn = norm(cfg, w, p + "attn_norm", x)
                q = _linear(w, p + "q", xn).view(t, nh, hd).transpose(0, 1)
                k = _linear(w, p + "k", xn).view(t, nkv, hd).transpose(0, 1)
                v = _linear(w, p + "v", xn).view(t, nkv, hd).transpose(0, 1)
                if cfg.family == "llama":
                    q, k = _rotary(cfg, q, pos), _rotary(cfg, k, pos)
                kc, vc = torch.cat((caches[i][0], k), 1), torch.cat((caches[i][1], v), 1)
                caches[i] = (kc, vc)
                kr, vr = kc.repeat_interleave(cfg.group_size, 0), vc.repeat_interleave(cfg.group_size, 0)
                mask = torch.arange(kc.shape[1])[None, :] <= pos[:, None]
                a = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)
                z = x + _linear(w, p + "o", a.transpose(0, 1).reshape(t, cfg.hidden))
                x = z + ffn(cfg, {k_[len(p) :]: v_ for k_, v_ in w.items() if k_.startswith(p)}, z)
            lg = lm_logits(cfg, w, x[-1])
            nxt = int(torch.argmax(lg))
            ids.append(nxt)
            logits.append(lg)
            start += len(step_ids)
            step_ids = [nxt]
    return ids, torch.stack(logits)


def tokenize(text: str, cfg: ModelConfig) -> list[int]:
    """Byte-level tokenisation: token id = byte % vocab (the project has no tokenizer files)."""
    return [b % cfg.vocab for b in text.encode("utf-8")]
