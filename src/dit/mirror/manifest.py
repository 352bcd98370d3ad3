"""``manifest.json``: every file of the mirror with its SHA-256, size and where it came from.

The manifest is written last by the builder (:func:`write_manifest`) from a walk of the mirror
directory, so it lists exactly what is there. :func:`verify_mirror` walks the directory again and
reports every difference: a file listed but ``MISSING``, a file present but not listed (``EXTRA``),
a different ``SIZE``, a different ``HASH``. Only ``manifest.json`` itself is not listed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Version of the manifest format.
MANIFEST_FORMAT = 1
MANIFEST = "manifest.json"


class ManifestError(RuntimeError):
    """The manifest is missing or malformed."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def walk(root: Path) -> Iterator[str]:
    """Every regular file under ``root`` as a POSIX path relative to it, sorted; not the manifest."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if rel != MANIFEST:
                found.append(rel)
    yield from sorted(found)


def write_manifest(
    root: Path, origins: Mapping[str, Mapping[str, Any]], build_info: Mapping[str, Any]
) -> dict[str, Any]:
    """Hash every file under ``root`` and write ``root/manifest.json``; ``origins`` says where each
    file came from (every file must have one)."""
    files: list[dict[str, Any]] = []
    strays: list[str] = []
    for rel in walk(root):
        origin = origins.get(rel)
        if origin is None:
            strays.append(rel)
            continue
        path = root / rel
        files.append({"path": rel, "sha256": sha256_file(path), "size": path.stat().st_size, **origin})
    if strays:
        raise ManifestError(
            f"{len(strays)} file(s) in {root} came from no build step (remove them or rebuild): "
            + ", ".join(strays[:10])
            + (" ..." if len(strays) > 10 else "")
        )
    doc = {"format": MANIFEST_FORMAT, "build": dict(build_info), "files": files}
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, root / MANIFEST)
    return doc


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest (is this a mirror built by mirror/build?)") from None
    except ValueError as exc:
        raise ManifestError(f"{path}: not JSON: {exc}") from exc
    if (
        not isinstance(doc, dict)
        or doc.get("format") != MANIFEST_FORMAT
        or not isinstance(doc.get("files"), list)
    ):
        raise ManifestError(f"{path}: not a format-{MANIFEST_FORMAT} mirror manifest")
    return doc


def verify_mirror(root: Path) -> tuple[list[str], int, int]:
    """``(problems, files checked, bytes checked)``; one line per problem, naming the file."""
    try:
        doc = read_manifest(root)
    except ManifestError as exc:
        return [f"MANIFEST {exc}"], 0, 0
    listed: dict[str, dict[str, Any]] = {str(f["path"]): f for f in doc["files"]}
    present = set(walk(root))
    problems: list[str] = []
    checked = size_total = 0
    for rel in sorted(set(listed) | present):
        entry = listed.get(rel)
        if entry is None:
            problems.append(f"EXTRA {rel}: not in the manifest")
            continue
        if rel not in present:
            problems.append(f"MISSING {rel}: listed in the manifest (sha256 {entry['sha256']})")
            continue
        path = root / rel
        size = path.stat().st_size
        if size != int(entry["size"]):
            problems.append(f"SIZE {rel}: {size} bytes, the manifest says {entry['size']}")
            continue
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            problems.append(f"HASH {rel}: sha256 {digest}, the manifest says {entry['sha256']}")
            continue
        checked += 1
        size_total += size
    return problems, checked, size_total


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 manifest.py MIRROR_DIR``: the problems, one per line, and exit status 1 if any."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: manifest.py MIRROR_DIR", file=sys.stderr)
        return 2
    root = Path(args[0]).resolve()
    problems, files, size = verify_mirror(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"mirror verify: {len(problems)} problem(s) in {root}", file=sys.stderr)
        return 1
    print(f"mirror verify: ok, {files} files, {size / 1e6:.1f} MB match {root}/{MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
