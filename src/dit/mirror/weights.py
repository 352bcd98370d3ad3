"""The model weights of the catalogue, verified against the catalogue's SHA-256.

Each catalogue model with fixed weights names its file, size and SHA-256 (``dit.models.catalogue``).
A file already in a local weights directory is copied when it hashes right; otherwise it is
generated from its seed by :func:`dit.models.regen.regenerate` (which needs the model's framework,
TensorFlow or PyTorch, on the building machine). Either way the result must equal the catalogue's
checksum or the build stops.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dit.mirror.manifest import sha256_file


class WeightsMirrorError(RuntimeError):
    """A catalogue weights file cannot be produced or does not match the catalogue."""


@dataclass(frozen=True)
class CatalogueWeights:
    model: str
    file: str
    sha256: str
    size: int | None


def catalogue_weights() -> list[CatalogueWeights]:
    from dit.models import catalogue

    out: list[CatalogueWeights] = []
    for name, entry in sorted(catalogue.BUILTIN.items()):
        if entry.weights_file and entry.sha256:
            out.append(CatalogueWeights(name, entry.weights_file, entry.sha256, entry.weights_bytes))
    return out


def _check(path: Path, want: CatalogueWeights) -> str | None:
    """None when ``path`` is the catalogue's file, else what is wrong."""
    size = path.stat().st_size
    if want.size is not None and size != want.size:
        return f"{size} bytes, the catalogue says {want.size}"
    digest = sha256_file(path)
    if digest != want.sha256:
        return f"sha256 {digest}, the catalogue says {want.sha256}"
    return None


def fetch_weights(
    dest: Path, source_dir: Path | None, log: Callable[[str], None], models: list[str] | None = None
) -> list[tuple[Path, CatalogueWeights]]:
    """Put every catalogue weights file (or those of ``models``) into ``dest``, verified."""
    from dit.models.weights import weights_dir

    source = source_dir if source_dir is not None else weights_dir()
    dest.mkdir(parents=True, exist_ok=True)
    known = {w.model for w in catalogue_weights()}
    unknown = sorted(set(models or ()) - known)
    if unknown:
        raise WeightsMirrorError(
            f"no catalogue weights for {', '.join(unknown)} (models with weights: {', '.join(sorted(known))})"
        )
    out: list[tuple[Path, CatalogueWeights]] = []
    for want in catalogue_weights():
        if models is not None and want.model not in models:
            continue
        target = dest / want.file
        if target.exists() and _check(target, want) is None:
            out.append((target, want))
            continue
        candidate = source / want.file
        if candidate.is_file() and _check(candidate, want) is None:
            log(f"weights: {want.model}: copying {candidate}")
            shutil.copyfile(candidate, target)
        else:
            log(f"weights: {want.model}: generating from its seed (dit.models.regen)")
            _generate(want, target)
        problem = _check(target, want)
        if problem is not None:
            target.unlink(missing_ok=True)
            raise WeightsMirrorError(f"weights of {want.model} ({want.file}): {problem}")
        out.append((target, want))
    return out


def _generate(want: CatalogueWeights, target: Path) -> None:
    try:
        from dit.models.regen import regenerate
    except ImportError as exc:  # pragma: no cover - depends on the frameworks installed
        raise WeightsMirrorError(
            f"{want.model}: cannot generate weights here ({exc}); use --skip-weights"
        ) from exc
    with tempfile.TemporaryDirectory(prefix="dit-mirror-weights-", dir=target.parent) as tmp:
        try:
            made = regenerate(want.model, Path(tmp))
        except ImportError as exc:
            raise WeightsMirrorError(
                f"{want.model}: its framework is not installed here ({exc}); install it, copy the file "
                "into --weights-from, or use --skip-weights"
            ) from exc
        produced = Path(tmp) / str(made["file"])
        if made["file"] != want.file:
            raise WeightsMirrorError(
                f"{want.model}: generated {made['file']}, the catalogue names {want.file} (catalogue out of date?)"
            )
        shutil.move(str(produced), target)
