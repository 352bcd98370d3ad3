"""Build the device zipapp ``dit-device.pyz`` (deterministic bytes for identical sources).

The archive holds ``dit/__init__.py``, every ``dit/device/**.py`` (and package data: ``*.json``) and,
optionally, further
subpackages of ``dit`` (e.g. ``"dit.models"`` or ``"dit/models"`` for real model adapters, which
import their framework lazily), plus a ``__main__.py`` that calls the device agent::

    python3 dit-device.pyz profile --config profile.json
    python3 dit-device.pyz edge --config edge.json

Determinism: the files are staged into a temporary directory, zipped in sorted order with a fixed
timestamp (1980-01-01 00:00:00), fixed permissions (0644) and deflate, then written with
``zipapp.create_archive`` (which prepends the ``#!/usr/bin/env python3`` line).
"""

from __future__ import annotations

import shutil
import tempfile
import zipapp
import zipfile
from collections.abc import Sequence
from pathlib import Path

import dit

ZIPAPP_NAME = "dit-device.pyz"
DATA_SUFFIXES = (".py", ".json")  # sources and package data (e.g. the model catalogue)
INTERPRETER = "/usr/bin/env python3"
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)
_MAIN = '''"""dit device zipapp entry point."""

from dit.device.agent import main

raise SystemExit(main())
'''


def _package_dir() -> Path:
    return Path(dit.__file__).resolve().parent


def _sources(extra_packages: Sequence[str]) -> list[tuple[str, Path]]:
    """(archive name, source file) pairs."""
    root = _package_dir()
    files: list[tuple[str, Path]] = [("dit/__init__.py", root / "__init__.py")]
    packages = ["device", *(p.replace(".", "/").removeprefix("dit/") for p in extra_packages)]
    for pkg in packages:
        base = root / pkg
        if not (base / "__init__.py").is_file():
            raise ValueError(f"extra package {pkg!r} is not a package under {root}")
        for path in sorted(p for suffix in DATA_SUFFIXES for p in base.rglob(f"*{suffix}")):
            if "__pycache__" in path.parts:
                continue
            files.append((f"dit/{path.relative_to(root).as_posix()}", path))
    return sorted(set(files))


def build_zipapp(dest: Path, extra_packages: Sequence[str] = ()) -> Path:
    """Write ``dit-device.pyz`` into directory ``dest`` (or to ``dest`` if it ends in ``.pyz``)."""
    target = dest if dest.suffix == ".pyz" else dest / ZIPAPP_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dit-zipapp-") as tmp:
        stage = Path(tmp) / "stage"
        stage.mkdir()
        entries = [*_sources(extra_packages), ("__main__.py", None)]
        for arcname, src in entries:
            out = stage / arcname
            out.parent.mkdir(parents=True, exist_ok=True)
            if src is None:
                out.write_text(_MAIN, encoding="utf-8")
            else:
                shutil.copyfile(src, out)
        plain = Path(tmp) / "app.zip"
        with zipfile.ZipFile(plain, "w") as zf:
            for arcname in sorted(a for a, _ in entries):
                info = zipfile.ZipInfo(arcname, date_time=_FIXED_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o100644 << 16
                info.create_system = 3  # unix, whatever the building OS
                zf.writestr(info, (stage / arcname).read_bytes())
        tmp_target = target.with_name(f".{target.name}.tmp")
        zipapp.create_archive(plain, tmp_target, interpreter=INTERPRETER)
        tmp_target.chmod(0o755)
        tmp_target.replace(target)
    return target
