"""The pinned llama-cpp-python sdist unpacked where the GGUF converter looks for it, hash-checked.

The converter (:func:`dit_llamacpp.models.vendored`) runs ``vendor/llama.cpp/convert_hf_to_gguf.py`` of
the unpacked sdist, by default ``/var/cache/dit/src/llama_cpp_python-<version>/``. :func:`unpack`
verifies the archive's SHA-256 against the pin, unpacks it into a scratch directory beside the target
(refusing any member outside the sdist's one top directory, links included), checks that the converter
is there, writes :data:`MARKER` (the archive's name and hash) into the tree and renames it into place
last: a tree that holds the marker of the pinned hash is complete, and a second call returns it without
reading the archive. :func:`find_sdist` finds the archive in a mirror (``sdists/``, as ``mirror/build``
writes it), checked against the pin and against the mirror's ``manifest.json``.

Standard library only, like :mod:`dit_llamacpp.build`: the build action copies both to a node, where
``python source.py --archive SDIST`` unpacks beside the build. On the controller::

    python -m dit_llamacpp.source --mirror /srv/dit-mirror        # or --archive PATH; [--dest DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

try:
    from dit_llamacpp.build import SDIST_NAME, SDIST_SHA256, SDIST_VERSION, check_archive, sha256_of
except ImportError:  # on a node: this file beside build.py, which is not a package there
    # imported by name at run time: a static "from build import" would have mypy resolve "build" to
    # whatever it finds (the docs' build/ directory in a checkout, PyPA's build package)
    import importlib

    _beside = importlib.import_module("build")
    SDIST_NAME, SDIST_SHA256, SDIST_VERSION = _beside.SDIST_NAME, _beside.SDIST_SHA256, _beside.SDIST_VERSION
    sha256_of, check_archive = _beside.sha256_of, _beside.check_archive

DEFAULT_DEST = Path("/var/cache/dit/src")
MARKER = ".dit-source.json"
CONVERTER = Path("vendor") / "llama.cpp" / "convert_hf_to_gguf.py"


class SourceError(RuntimeError):
    """The sdist is missing, has another hash, or does not unpack to the converter's source tree."""


def top_name(archive_name: str = SDIST_NAME) -> str:
    """The sdist's one top directory: its file name without ``.tar.gz`` (``llama_cpp_python-0.3.36``)."""
    if not archive_name.endswith(".tar.gz"):
        raise SourceError(f"{archive_name}: not a .tar.gz sdist")
    return archive_name.removesuffix(".tar.gz")


def source_dir(dest: Path = DEFAULT_DEST, archive_name: str = SDIST_NAME) -> Path:
    """Where the unpacked tree lives (``models.DEFAULT_SOURCE`` for the defaults)."""
    return dest / top_name(archive_name)


def unpacked(
    dest: Path = DEFAULT_DEST, sha256: str = SDIST_SHA256, archive_name: str = SDIST_NAME
) -> Path | None:
    """The complete tree of the archive with that hash under ``dest``, or None."""
    tree = source_dir(dest, archive_name)
    try:
        record = json.loads((tree / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("sha256") != sha256 or not (tree / CONVERTER).is_file():
        return None
    return tree


def find_sdist(mirror: Path, sha256: str = SDIST_SHA256, archive_name: str = SDIST_NAME) -> Path:
    """``<mirror>/sdists/<archive_name>``: its SHA-256 is the pin's, and the manifest's entry agrees."""
    rel = f"sdists/{archive_name}"
    path = mirror / rel
    if not path.is_file():
        raise SourceError(
            f"{path}: no such sdist in the mirror (mirror/build writes it: mirror/sources.yaml sdists)"
        )
    manifest = mirror / "manifest.json"
    if manifest.is_file():
        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SourceError(f"{manifest}: unreadable ({exc})") from exc
        files = doc.get("files") if isinstance(doc, dict) else None
        entry = next((f for f in files or [] if isinstance(f, dict) and f.get("path") == rel), None)
        if entry is None:
            raise SourceError(f"{manifest}: does not list {rel} (a file the mirror's build did not write)")
        if entry.get("sha256") != sha256:
            raise SourceError(
                f"{manifest}: lists {rel} with SHA-256 {entry.get('sha256')}, not the pinned {sha256}"
            )
    actual = sha256_of(path)
    if actual != sha256:
        raise SourceError(f"{path}: SHA-256 {actual} is not the pinned {sha256}")
    return path


def _check_members(tar: tarfile.TarFile, top: str, archive: Path) -> None:
    """Every member inside ``top/``: no absolute path, no ``..``, no link that leads out of it."""
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if not parts or parts[0] != top or ".." in parts or Path(member.name).is_absolute():
            raise SourceError(f"{archive}: member {member.name!r} is outside {top}/; refusing to unpack")
        if member.issym() or member.islnk():
            target = Path(member.linkname)
            base = Path(member.name).parent if member.issym() else Path()
            resolved = os.path.normpath(base / target)
            if target.is_absolute() or resolved.split(os.sep)[0] != top:
                raise SourceError(f"{archive}: link {member.name!r} -> {member.linkname!r} leaves {top}/")


def unpack(
    archive: Path,
    dest: Path = DEFAULT_DEST,
    *,
    sha256: str = SDIST_SHA256,
    log: Callable[[str], None] = print,
) -> Path:
    """The converter's source tree of ``archive`` under ``dest`` (see the module docstring)."""
    done = unpacked(dest, sha256, archive.name)
    if done is not None:
        log(f"llamacpp source: already unpacked at {done}")
        return done
    check_archive(archive, sha256, SourceError)
    top = top_name(archive.name)
    target = dest / top
    dest.mkdir(parents=True, exist_ok=True)
    scratch = dest / f".unpack-{sha256[:12]}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                _check_members(tar, top, archive)
                tar.extractall(scratch, filter="data")  # and the stdlib's own refusals besides ours
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise SourceError(f"{archive}: cannot unpack: {exc}") from exc
        tree = scratch / top
        if not (tree / CONVERTER).is_file():
            raise SourceError(f"{archive}: no {CONVERTER} in it (not llama-cpp-python's sdist?)")
        record = {
            "sdist": archive.name,
            "sha256": sha256,
            "version": SDIST_VERSION if archive.name == SDIST_NAME else None,
        }
        (tree / MARKER).write_text(json.dumps(record, sort_keys=True) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)  # a tree without the pinned marker: incomplete or another
        tree.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log(f"llamacpp source: unpacked {archive.name} at {target}")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``python source.py (--archive SDIST | --mirror DIR) [--dest DIR] [--sha256 HEX]``."""
    parser = argparse.ArgumentParser(prog="dit-llamacpp-source", description=main.__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--archive", type=Path, help="the llama-cpp-python sdist")
    where.add_argument("--mirror", type=Path, help="a mirror directory: its sdists/ and manifest.json")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"default {DEFAULT_DEST}")
    parser.add_argument("--sha256", default=SDIST_SHA256, help="the pinned SHA-256 of the sdist")
    args = parser.parse_args(argv)
    try:
        archive = args.archive if args.archive is not None else find_sdist(args.mirror, args.sha256)
        tree = unpack(archive, args.dest, sha256=args.sha256, log=lambda m: print(m, flush=True))
    except SourceError as exc:
        print(f"llamacpp source: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"source": str(tree), "sha256": args.sha256}, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
