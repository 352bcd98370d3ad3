"""Deterministic seeded weights, stored once and verified by SHA-256 on every load.

Why not the frameworks' own seeded initialisers: their random kernels (TensorFlow's Philox ops,
PyTorch's vectorised ``normal_``) are reproducible on one machine but are not promised to be
bit-identical across CPU instruction sets, library builds or versions, and a checksum recorded in
the catalogue must hold on the five boards (aarch64) as well as on the edge server (x86-64). So
the weights are drawn here, with numpy's PCG64 generator, as *uniform* values: a PCG64 stream is
pure integer arithmetic, ``Generator.random(dtype=float32)`` turns 24 of its bits into a float
exactly, and the affine map to ``[-limit, limit)`` is two correctly rounded IEEE operations. The
file is therefore a pure function of (parameter names, shapes, the seed, :data:`GENERATOR`), on any
platform. Every tensor has its own stream, seeded by ``(seed, crc32(name))``, so adding a tensor
does not change the others.

The file format is `safetensors <https://github.com/huggingface/safetensors>`_ (an 8-byte
little-endian header length, a JSON header, then raw little-endian tensors), written and read
here with numpy alone, with sorted keys and no metadata timestamps, so the same tensors always
produce the same bytes.

Where files live: ``$DIT_WEIGHTS_DIR`` if set, else ``~/.cache/dit/weights``; a spec can
override with ``params.weights_dir``. A model whose parameters are the catalogue's defaults is
checked against the SHA-256 in the catalogue; any other parameter set (a shrunk test model, a
different input shape) has no catalogue entry, so its checksum is recorded next to the file
(``<file>.sha256``) when it is generated and checked on every later load.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Version tag of the generation procedure; part of every file name and of the safetensors metadata.
GENERATOR = "dit-uniform-pcg64-v1"

_DTYPES: dict[str, str] = {
    "float32": "F32",
    "float64": "F64",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
_NP_DTYPES = {v: k for k, v in _DTYPES.items()}


class WeightsError(RuntimeError):
    """A weights file is missing, malformed or does not match its recorded checksum."""


class ChecksumMismatch(WeightsError):
    def __init__(self, path: Path, expected: str, actual: str, source: str) -> None:
        super().__init__(
            f"refusing to load weights {path}: SHA-256 is {actual}, but {source} records {expected}. "
            f"The file is corrupt or was produced by another generator; delete it to regenerate "
            f"from the seed, or restore the original."
        )
        self.path = path
        self.expected = expected
        self.actual = actual


def weights_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The weights directory: ``override``, else ``$DIT_WEIGHTS_DIR``, else ``~/.cache/dit/weights``."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("DIT_WEIGHTS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "dit" / "weights"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def params_key(name: str, params: Mapping[str, Any], seed: int) -> str:
    """A short stable key of a model's weight-relevant identity (12 hex digits)."""
    blob = json.dumps(
        {"name": name, "params": dict(params), "seed": seed, "generator": GENERATOR},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------
# deterministic generation


def _stream(seed: int, name: str) -> np.random.Generator:
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFF, zlib.crc32(name.encode())]))
    )


def uniform(seed: int, name: str, shape: tuple[int, ...], limit: float) -> np.ndarray:
    """float32 values uniform in ``[-limit, limit)``, a pure function of ``(seed, name, shape, limit)``."""
    u = _stream(seed, name).random(int(np.prod(shape, dtype=np.int64)), dtype=np.float32)
    out: np.ndarray = (u * np.float32(2.0) - np.float32(1.0)) * np.float32(limit)
    return out.reshape(shape)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to generate: its name, shape, dtype and how to fill it."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"  # the stored dtype (values are drawn in float32, then cast)
    limit: float | None = None  # uniform in [-limit, limit) when set ...
    constant: float | None = None  # ... else every element equal to this constant

    def generate(self, seed: int) -> np.ndarray:
        if self.limit is not None:
            return uniform(seed, self.name, self.shape, self.limit).astype(self.dtype, copy=False)
        return np.full(self.shape, 0.0 if self.constant is None else self.constant, dtype=self.dtype)


def generate(specs: list[TensorSpec], seed: int) -> dict[str, np.ndarray]:
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique")
    return {s.name: s.generate(seed) for s in specs}


# --------------------------------------------------------------------------------------------
# safetensors (numpy only)


def save_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """Write ``tensors`` in safetensors format, byte-for-byte deterministic, atomically."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    order = sorted(tensors)
    for key in order:
        arr = tensors[key]
        dt = _DTYPES.get(arr.dtype.name)
        if dt is None:
            raise WeightsError(f"{key}: dtype {arr.dtype} cannot be stored")
        header[key] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    hjson = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(hjson)))
        fh.write(hjson)
        for key in order:
            arr = np.ascontiguousarray(tensors[key])
            fh.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file into numpy arrays (read-only views of one buffer)."""
    return parse_safetensors(path.read_bytes(), path)


def parse_safetensors(data: bytes, path: Path) -> dict[str, np.ndarray]:
    """Parse the bytes of a safetensors file (``path`` only names it in errors)."""
    if len(data) < 8:
        raise WeightsError(f"{path}: not a safetensors file (too short)")
    (hlen,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + hlen])
    except ValueError as exc:
        raise WeightsError(f"{path}: malformed safetensors header: {exc}") from exc
    base = 8 + hlen
    out: dict[str, np.ndarray] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        dtype = np.dtype(_NP_DTYPES[info["dtype"]]).newbyteorder("<")
        start, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dtype, count=(end - start) // dtype.itemsize, offset=base + start)
        out[key] = arr.reshape(info["shape"])
    return out


# --------------------------------------------------------------------------------------------
# the store


@dataclass(frozen=True)
class WeightsRecord:
    path: Path
    sha256: str
    generated: bool  # True when this call generated the file
    source: str  # what the checksum was checked against: "catalogue" or "sidecar"


def ensure_weights(
    *,
    name: str,
    params: Mapping[str, Any],
    seed: int,
    specs: Callable[[], list[TensorSpec]],
    expected_sha256: str | None,
    directory: Path,
) -> tuple[dict[str, np.ndarray], WeightsRecord]:
    """Return the model's weights, generating and storing them on first use, verified every time.

    ``expected_sha256`` is the catalogue's checksum when ``params`` are the catalogue defaults,
    else None (the checksum recorded in the sidecar file at generation is used).
    """
    key = params_key(name, params, seed)
    path = directory / f"{name}-{key}.safetensors"
    sidecar = path.with_name(path.name + ".sha256")
    generated = False
    if not path.exists():
        tensors = generate(specs(), seed)
        meta = {
            "generator": GENERATOR,
            "model": name,
            "seed": str(seed),
            "params": json.dumps(dict(params), sort_keys=True),
        }
        save_safetensors(path, tensors, meta)
        del tensors
        generated = True
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None:
        if digest != expected_sha256:
            what = (
                "the model catalogue (for a file generated just now)" if generated else "the model catalogue"
            )
            raise ChecksumMismatch(path, expected_sha256, digest, what)
        source = "catalogue"
        if generated:
            sidecar.write_text(f"{digest}  {path.name}\n", encoding="ascii")
    elif generated:
        sidecar.write_text(f"{digest}  {path.name}\n", encoding="ascii")
        source = "sidecar"
    else:
        if not sidecar.exists():
            raise WeightsError(
                f"refusing to load weights {path}: no checksum recorded ({sidecar} is missing)"
            )
        recorded = sidecar.read_text(encoding="ascii").split()[0]
        if digest != recorded:
            raise ChecksumMismatch(path, recorded, digest, str(sidecar))
        source = "sidecar"
    return parse_safetensors(data, path), WeightsRecord(path, digest, generated, source)
