"""Real model checkpoints the user pins in ``mirror/sources.yaml``, carried by the mirror.

::

    checkpoints:
      - name: tinyllama-chat              # a plain name
        path: /data/TinyLlama-1.1B-Chat   # a safetensors file or a Hugging Face-format directory
        sha256: <64 hex>                  # its pin (HeadSplit's definition, docs/headsplit.md)

The pin of a file is its SHA-256; of a directory, the SHA-256 of its manifest: ``<sha256>  <name>\\n``
per member (``config.json``, ``model.safetensors.index.json`` when present, every top-level
``*.safetensors``), sorted by name -- the same definition as ``headsplit.checkpoint`` (a test checks
they agree; the testbed does not import the runtime), in :mod:`dit.models.checkpoint_pin`.
``mirror/build`` checks the source against the pin and copies it to
``checkpoints/<sha256>/<name of file or directory>``; a directory's copy gets its manifest as
``SHA256SUMS``. Every copied file is in the mirror's manifest.json, so ``mirror/verify`` re-hashes it;
nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.mirror.entries import NAME, SHA256_FIELD, Field, entry_values, read_sources
from dit.mirror.manifest import sha256_file
from dit.models.checkpoint_pin import SUMS, manifest, manifest_text

_FIELDS = {"name": Field("is not a plain name", NAME), "path": Field("is not a path"), "sha256": SHA256_FIELD}


class CheckpointMirrorError(RuntimeError):
    """A checkpoint declaration is malformed, or its source does not match its pin."""


@dataclass(frozen=True)
class CheckpointSource:
    name: str
    path: Path
    sha256: str


def parse_checkpoints(entries: Any, base: Path, where: str = "checkpoints") -> tuple[CheckpointSource, ...]:
    """The ``checkpoints:`` list; errors name the entry and field (``checkpoints[0].sha256: ...``)."""
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise CheckpointMirrorError(f"{where}: a list of checkpoints")
    out: list[CheckpointSource] = []
    for i, entry in enumerate(entries):
        name, path, sha = entry_values(entry, f"{where}[{i}]", _FIELDS, CheckpointMirrorError)
        out.append(CheckpointSource(name, (base / path).resolve(), sha))
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CheckpointMirrorError(f"{where}: checkpoint(s) declared twice: {', '.join(twice)}")
    return tuple(out)


def load_checkpoints(sources_file: Path) -> tuple[CheckpointSource, ...]:
    doc = read_sources(sources_file, CheckpointMirrorError)
    if not isinstance(doc, dict):
        raise CheckpointMirrorError(f"{sources_file}: not a mapping")
    return parse_checkpoints(doc.get("checkpoints"), sources_file.parent, f"{sources_file}: checkpoints")


def pin_of(path: Path) -> str:
    """A file's SHA-256, or a directory's manifest hash."""
    if path.is_file():
        return sha256_file(path)
    if path.is_dir():
        sums = manifest(path)
        if not any(n.endswith(".safetensors") for n in sums):
            raise CheckpointMirrorError(f"{path}: no *.safetensors file in the directory")
        return hashlib.sha256(manifest_text(sums).encode()).hexdigest()
    raise CheckpointMirrorError(f"{path}: no such file or directory")


def copy_checkpoint(src: CheckpointSource, out: Path, log: Callable[[str], None]) -> list[Path]:
    """Check ``src`` against its pin and copy it to ``out/checkpoints/<sha256>/``; the files copied."""
    actual = pin_of(src.path)
    if actual != src.sha256:
        raise CheckpointMirrorError(
            f"checkpoint {src.name}: {src.path} has pin {actual}, mirror/sources.yaml pins {src.sha256}"
        )
    dest = out / "checkpoints" / src.sha256 / src.path.name
    if dest.exists() and (dest.is_file() or (dest / SUMS).is_file()) and pin_of(dest) == src.sha256:
        log(f"checkpoints: {src.name} already in the mirror")
    else:
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        dest.parent.mkdir(parents=True, exist_ok=True)
        log(f"checkpoints: {src.name}: copying {src.path}")
        if src.path.is_file():
            shutil.copyfile(src.path, dest)
        else:
            dest.mkdir()
            for name in manifest(src.path):
                shutil.copyfile(src.path / name, dest / name)
        copied = pin_of(dest)
        if copied != src.sha256:
            raise CheckpointMirrorError(
                f"checkpoint {src.name}: the copy {dest} has pin {copied}, expected {src.sha256}"
            )
        if dest.is_dir():
            (dest / SUMS).write_text(manifest_text(manifest(dest)), encoding="utf-8")
    return [dest] if dest.is_file() else sorted(p for p in dest.iterdir() if p.is_file())
