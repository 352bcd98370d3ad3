"""What every real adapter shares: activations as numpy arrays, raw-bytes encoding, input sources.

An activation crossing a cut is a numpy array whose shape and dtype are known per stage (batch
size 1), so :meth:`encode` is ``tobytes()`` of the C-contiguous little-endian array and
:meth:`decode` is ``frombuffer`` + ``reshape``: no pickle, no framing, and ``output_bytes`` is
the exact payload size. Frameworks are imported lazily by the adapters, never here.

Input sources (``spec["input"]``, the scenario's ``model.input``; ``source`` is an alias of ``kind``):

* ``{"kind": "synthetic", "seed": s}`` (default): seeded tensors from ``seed`` (default: the run's
  seed): uniform [0, 1) for images and features, uniform token ids for language models;
* ``{"kind": "npy", "path": "x.npy"}``: a ``.npy`` file, reshaped to the model's input shape;
* ``{"kind": "images", "path": "dir/", "index": 0}``: the ``index``-th image file (sorted
  names) of a directory, decoded with Pillow, resized to the input shape, scaled to [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".webp")


@dataclass(frozen=True)
class ArraySpec:
    """Shape (batch included) and dtype of one activation."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view/copy of a framework tensor or array-like."""
    if isinstance(x, np.ndarray):
        return x
    numpy_attr = getattr(x, "numpy", None)
    if callable(numpy_attr):
        detach = getattr(x, "detach", None)
        arr = detach().numpy() if callable(detach) else numpy_attr()
        return np.asarray(arr)
    return np.asarray(x)


class ArrayStageModel:
    """Base of the real adapters: encode/decode/output_bytes/max_abs_diff from :class:`ArraySpec` s.

    Subclasses set ``name``, ``specs`` (index 0..N: stage 0 is the input) and ``stage_ops``
    (index 0..N, ``stage_ops[0] == 0``) and implement :meth:`run_stage` and :meth:`make_input`.
    """

    name: str
    specs: list[ArraySpec]
    stage_ops: list[int]
    stage_names: list[str]

    @property
    def num_stages(self) -> int:
        return len(self.specs) - 1

    def _check(self, stage: int, low: int) -> None:
        if not low <= stage <= self.num_stages:
            raise ValueError(f"{self.name}: stage {stage} is outside {low}..{self.num_stages}")

    def encode(self, x: Any) -> bytes:
        arr = np.ascontiguousarray(to_numpy(x))
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return arr.tobytes()

    def decode(self, data: bytes, stage: int) -> np.ndarray:
        self._check(stage, 0)
        spec = self.specs[stage]
        if len(data) != spec.nbytes:
            raise ValueError(
                f"{self.name}: output of stage {stage} is {spec.nbytes} bytes {spec.shape}, got {len(data)}"
            )
        return np.frombuffer(data, dtype=np.dtype(spec.dtype).newbyteorder("<")).reshape(spec.shape)

    def output_bytes(self, stage: int) -> int:
        self._check(stage, 0)
        return self.specs[stage].nbytes

    def ops(self, stage: int) -> int:
        self._check(stage, 0)
        return self.stage_ops[stage]

    def max_abs_diff(self, a: Any, b: Any) -> float:
        x = to_numpy(a).astype(np.float64)
        y = to_numpy(b).astype(np.float64)
        if x.shape != y.shape:
            return float("inf")
        if x.size == 0:
            return 0.0
        return float(np.max(np.abs(x - y)))

    def describe(self) -> list[dict[str, Any]]:
        """One row per stage 0..N: name, output shape, dtype, output bytes, ops (for docs and reports)."""
        return [
            {
                "stage": i,
                "name": self.stage_names[i],
                "shape": list(s.shape),
                "dtype": s.dtype,
                "output_bytes": s.nbytes,
                "ops": self.stage_ops[i],
            }
            for i, s in enumerate(self.specs)
        ]


# --------------------------------------------------------------------------------------------
# spec helpers


def spec_params(spec: Mapping[str, Any]) -> dict[str, Any]:
    params = spec.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"model.params: {params!r} is not a mapping")
    return dict(params)


def spec_seed(spec: Mapping[str, Any]) -> int:
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: {seed!r} is not an integer")
    return seed


def int_tuple(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"{where}: {value!r} is not a non-empty list of integers")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{where}[{i}]: {v!r} is not a positive integer")
        out.append(v)
    return tuple(out)


def positive_int(params: Mapping[str, Any], key: str, default: int, where: str = "model.params") -> int:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{where}.{key}: {v!r} is not a positive integer")
    return v


def input_kind(inp: Mapping[str, Any]) -> str:
    """The scenario's ``input.kind`` (``source`` is accepted as an alias)."""
    return str(inp.get("kind", inp.get("source", "synthetic")))


def input_seed(spec: Mapping[str, Any]) -> int:
    """``input.seed`` when the scenario sets one, else the run's seed."""
    inp = spec.get("input") or {}
    seed = inp.get("seed")
    return spec_seed(spec) if seed is None else int(seed)


def make_array_input(spec: Mapping[str, Any], shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """The model input (batch of 1, ``shape`` excludes the batch) from ``spec['input']``."""
    inp = spec.get("input") or {}
    source = input_kind(inp)
    full = (1, *shape)
    if source == "synthetic":
        rng = np.random.default_rng(input_seed(spec))
        return rng.random(full, dtype=np.float32).astype(dtype, copy=False)
    if source == "npy":
        path = Path(str(inp["path"])).expanduser()
        arr = np.load(path, allow_pickle=False)
        if arr.size != int(np.prod(full)):
            raise ValueError(f"input.path: {path} holds {arr.shape}, the model expects {list(shape)}")
        return np.ascontiguousarray(arr.reshape(full).astype(dtype))
    if source == "images":
        return _image_input(inp, shape).astype(dtype)
    raise ValueError(f"input.kind: {source!r} is not one of synthetic, npy, images")


def _image_input(inp: Mapping[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) != 3 or shape[2] not in (1, 3):
        raise ValueError(
            f"input.source images needs an HxWxC input with C 1 or 3, the model has {list(shape)}"
        )
    directory = Path(str(inp["path"])).expanduser()
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"input.path: no image files in {directory}")
    index = int(inp.get("index", 0)) % len(files)
    from PIL import Image

    with Image.open(files[index]) as img:
        img2 = img.convert("L" if shape[2] == 1 else "RGB").resize((shape[1], shape[0]))
        arr = np.asarray(img2, dtype=np.float32) / np.float32(255.0)
    return arr.reshape((1, *shape))
