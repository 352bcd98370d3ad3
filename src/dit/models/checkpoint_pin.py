"""The pin of a real model checkpoint (HeadSplit's definition, docs/headsplit.md), shared by the
conversions that make checkpoints (:mod:`dit.models.convert`) and the mirror that carries them
(:mod:`dit.mirror.checkpoints`).

The pin of a file is its SHA-256; of a directory, the SHA-256 of its manifest: ``<sha256>  <name>\\n``
per member (``config.json``, ``model.safetensors.index.json`` when present, every top-level
``*.safetensors``), sorted by name. A directory's copy carries that manifest as ``SHA256SUMS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from dit.models.weights import sha256_file

MEMBERS: Final = ("config.json", "model.safetensors.index.json")
SUMS: Final = "SHA256SUMS"


def manifest(directory: Path) -> dict[str, str]:
    """``{member name: its SHA-256}`` of a checkpoint directory."""
    names = sorted(
        [p.name for p in directory.glob("*.safetensors") if p.is_file()]
        + [n for n in MEMBERS if (directory / n).is_file()]
    )
    return {n: sha256_file(directory / n) for n in names}


def manifest_text(sums: dict[str, str]) -> str:
    """The manifest's text, whose SHA-256 is the directory's pin."""
    return "".join(f"{sums[n]}  {n}\n" for n in sorted(sums))
