"""Real checkpoints: what a checkpoint path stands for, its pin, its verification, its model shape.

Torch-free (the testbed's side imports it to read a Hugging Face ``config.json`` at launch).

A checkpoint is either **one safetensors file**, pinned by its SHA-256, or a **Hugging Face-format
directory**: ``config.json``, the weights as ``*.safetensors`` (one file, or shards listed by
``model.safetensors.index.json``). A directory is pinned by the SHA-256 of its *manifest*: one line
``<sha256>  <relative path>\\n`` per member file (``config.json``, ``model.safetensors.index.json`` when
present, every top-level ``*.safetensors``), sorted by path -- exactly what
``sha256sum $(LC_ALL=C ls config.json model.safetensors.index.json *.safetensors)`` prints, so the pin
is ``... | sha256sum`` of that. Other files (tokenizer, README, generation_config.json) are not read
and not pinned. A copy made by this project (the mirror, ``distribute-checkpoint``) carries the manifest
as ``SHA256SUMS`` beside the files, so a tampered file is named with its pinned and actual hashes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headsplit.config import ModelConfig

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SUMS = "SHA256SUMS"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: wrong hash, missing tensor, wrong shape (named in the message)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def members(path: Path) -> list[str]:
    """The pinned files of a checkpoint directory, relative names, sorted."""
    names = [p.name for p in path.glob("*.safetensors") if p.is_file()]
    if not names:
        raise CheckpointError(
            f"checkpoint.path {path}: no *.safetensors file in the directory (only safetensors is read)"
        )
    names += [n for n in (CONFIG, INDEX) if (path / n).is_file()]
    return sorted(names)


def manifest(path: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of a directory's pinned files."""
    return {n: sha256_file(path / n) for n in members(path)}


def manifest_text(sums: Mapping[str, str]) -> str:
    return "".join(f"{sums[n]}  {n}\n" for n in sorted(sums))


def checkpoint_sha256(path: Path) -> str:
    """The pin: a file's SHA-256; a directory's manifest's SHA-256 (see the module's docstring)."""
    if path.is_file():
        return sha256_file(path)
    if path.is_dir():
        return hashlib.sha256(manifest_text(manifest(path)).encode()).hexdigest()
    raise CheckpointError(f"checkpoint.path {path}: no such file or directory")


def write_sums(path: Path) -> str:
    """Write ``SHA256SUMS`` into a checkpoint directory; returns the pin."""
    text = manifest_text(manifest(path))
    (path / SUMS).write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode()).hexdigest()


def _read_sums(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (path / SUMS).read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        out[name] = digest
    return out


def verify(path: Path, sha256: str) -> None:
    """Check ``path`` against its pin; the error names the file and both hashes."""
    want = sha256.lower()
    if path.is_file():
        actual = sha256_file(path)
        if actual != want:
            raise CheckpointError(f"checkpoint.sha256 mismatch: {path}: pinned {want}, file has {actual}")
        return
    if not path.is_dir():
        raise CheckpointError(f"checkpoint.path {path}: no such file or directory")
    weight_files(path)  # a shard the index lists but the directory lacks is named first
    sums_file = path / SUMS
    if sums_file.is_file():
        recorded = sha256_file(sums_file)
        if recorded != want:
            raise CheckpointError(
                f"checkpoint.sha256 mismatch: {sums_file}: pinned {want}, file has {recorded}"
            )
        listed = _read_sums(path)
        for name in sorted(set(listed) | set(members(path))):
            if name not in listed:
                raise CheckpointError(f"checkpoint {path}: {name} is not in {SUMS} (not part of the pin)")
            if not (path / name).is_file():
                raise CheckpointError(f"checkpoint {path}: {name} is missing (listed in {SUMS})")
            actual = sha256_file(path / name)
            if actual != listed[name]:
                raise CheckpointError(
                    f"checkpoint.sha256 mismatch: {path / name}: pinned {listed[name]}, file has {actual}"
                )
        return
    sums = manifest(path)
    actual = hashlib.sha256(manifest_text(sums).encode()).hexdigest()
    if actual != want:
        files = ", ".join(f"{n} {d}" for n, d in sorted(sums.items()))
        raise CheckpointError(
            f"checkpoint.sha256 mismatch: {path}: pinned {want}, the directory's manifest has {actual} "
            f"(files: {files}; no {SUMS} here to name the changed one)"
        )


def weight_files(path: Path) -> list[Path]:
    """The safetensors files to read: the file; a directory's index's shards (all present), else every
    ``*.safetensors`` of it."""
    if path.is_file():
        return [path]
    index = path / INDEX
    if index.is_file():
        try:
            doc = json.loads(index.read_text(encoding="utf-8"))
            shards = sorted(set(doc["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {index}: weight_map: cannot be read ({exc})") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise CheckpointError(
                f"checkpoint {path}: shard(s) {', '.join(missing)} listed in {INDEX} are missing"
            )
        return [path / s for s in shards]
    return [path / n for n in members(path) if n.endswith(".safetensors")]


# ------------------------------------------------------------------------------------- config.json

# Fields whose value HeadSplit's model does not implement: field -> the values it accepts.
_LLAMA_ONLY: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",),
    "rope_scaling": (None,),
    "attention_bias": (False, None),
    "mlp_bias": (False, None),
    "sliding_window": (None,),
}
_GPT2_ONLY: dict[str, tuple[Any, ...]] = {
    "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
    "scale_attn_weights": (True, None),
    "scale_attn_by_inverse_layer_idx": (False, None),
    "add_cross_attention": (False, None),
}


def _int(doc: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"{where}: {key}: {value!r} is not a positive integer")
    return value


def _num(doc: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = doc.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{where}: {key}: {value!r} is not a positive number")
    return float(value)


def model_config(doc: Mapping[str, Any], name: str, where: str = CONFIG) -> ModelConfig:
    """A Hugging Face ``config.json`` as HeadSplit's ModelConfig; a config it cannot run is refused,
    naming the field."""
    kind = doc.get("model_type")
    accepted = _LLAMA_ONLY if kind == "llama" else _GPT2_ONLY if kind == "gpt2" else None
    if accepted is None:
        raise CheckpointError(f"{where}: model_type: {kind!r} is not one HeadSplit runs (llama, gpt2)")
    for key, values in accepted.items():
        if doc.get(key) not in values:
            shown = ", ".join(repr(v) for v in values if v is not None)
            raise CheckpointError(
                f"{where}: {key}: {doc.get(key)!r} is not supported (HeadSplit runs {shown})"
            )
    try:
        if kind == "llama":
            hidden, heads = _int(doc, "hidden_size", where), _int(doc, "num_attention_heads", where)
            head_dim = doc.get("head_dim")
            if head_dim is not None and head_dim * heads != hidden:
                raise CheckpointError(
                    f"{where}: head_dim: {head_dim} x num_attention_heads {heads} != hidden_size {hidden} "
                    "(HeadSplit needs head_dim = hidden_size / num_attention_heads)"
                )
            return ModelConfig(
                name, "llama", _int(doc, "num_hidden_layers", where), heads,
                _int(doc, "num_key_value_heads", where, heads), hidden, _int(doc, "intermediate_size", where),
                _int(doc, "vocab_size", where), _int(doc, "max_position_embeddings", where),
                norm_eps=_num(doc, "rms_norm_eps", where, 1e-6), rope_theta=_num(doc, "rope_theta", where, 10000.0),
            )  # fmt: skip
        hidden = _int(doc, "n_embd", where)
        inner = doc.get("n_inner")
        return ModelConfig(
            name, "gpt2", _int(doc, "n_layer", where), _int(doc, "n_head", where), _int(doc, "n_head", where),
            hidden, 4 * hidden if inner is None else _int(doc, "n_inner", where), _int(doc, "vocab_size", where),
            _int(doc, "n_positions", where), norm_eps=_num(doc, "layer_norm_epsilon", where, 1e-5),
        )  # fmt: skip
    except CheckpointError:
        raise
    except ValueError as exc:  # ModelConfig's own checks (multiples)
        raise CheckpointError(f"{where}: {exc}") from None


def directory_config(path: Path) -> ModelConfig | None:
    """The ModelConfig of a Hugging Face directory (None for a single file or a directory without
    ``config.json``)."""
    cfg_file = path / CONFIG
    if not path.is_dir() or not cfg_file.is_file():
        return None
    try:
        doc = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{cfg_file}: cannot be read ({exc})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{cfg_file}: not a JSON object")
    return model_config(doc, f"hf-{path.resolve().name}", str(cfg_file))


def main(argv: list[str] | None = None) -> int:
    """``python -m headsplit.checkpoint PATH [--sha256 PIN]``: print the pin, or verify against it."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m headsplit.checkpoint", description=main.__doc__)
    ap.add_argument("path", help="a safetensors file or a Hugging Face-format directory")
    ap.add_argument("--sha256", help="verify against this pin (exit 1 naming the file and both hashes)")
    a = ap.parse_args(argv)
    p = Path(a.path)
    try:
        if a.sha256:
            verify(p, a.sha256)
            print(f"{p}: sha256 {a.sha256.lower()} verified")
        else:
            print(f"{checkpoint_sha256(p)}  {p}")
        cfg = directory_config(p)
    except CheckpointError as exc:
        print(f"headsplit checkpoint: {exc}", file=sys.stderr)
        return 1
    if cfg is not None:
        print(
            f"model: {cfg.family}, {cfg.n_layers} layers, {cfg.n_heads} heads ({cfg.n_kv_heads} KV), "
            f"hidden {cfg.hidden}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
