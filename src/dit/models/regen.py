"""Regenerate the catalogue's weights and print (or write) their SHA-256.

``python -m dit.models.regen [NAME ...] [--write] [--dir DIR]`` builds each catalogue model with
its default parameters in ``DIR`` (default: a fresh temporary directory), ignoring the recorded
checksum, and prints ``name sha256 bytes file``. With ``--write`` the results are stored in
``catalogue.json``. Run it when a model's architecture or the generator changes; the slow tests
check that every recorded checksum still reproduces.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from dit.device.common import build_model
from dit.models import catalogue


def regenerate(name: str, directory: Path) -> dict[str, Any]:
    e = catalogue.BUILTIN[name]
    catalogue.BUILTIN[name] = dataclasses.replace(e, sha256=None)
    try:
        model: Any = build_model(
            {"name": name, "builder": e.builder, "params": {"weights_dir": str(directory)}, "seed": 0}
        )
    finally:
        catalogue.BUILTIN[name] = e
    rec = model.weights
    return {
        "seed": e.weights_seed,
        "file": rec.path.name,
        "bytes": rec.path.stat().st_size,
        "sha256": rec.sha256,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dit.models.regen", description=__doc__)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--write", action="store_true", help="store the checksums in catalogue.json")
    ap.add_argument("--dir", type=Path, default=None, help="weights directory (default: a temporary one)")
    args = ap.parse_args(argv)
    path = Path(catalogue.__file__).with_name(catalogue.CATALOGUE_FILE)
    raw = json.loads(path.read_text(encoding="utf-8"))
    names = args.names or [n for n, m in raw["models"].items() if "weights" in m]
    with tempfile.TemporaryDirectory(prefix="dit-weights-") as tmp:
        directory = args.dir or Path(tmp)
        for name in names:
            w = regenerate(name, directory)
            print(name, w["sha256"], w["bytes"], w["file"], flush=True)
            raw["models"][name]["weights"] = w
            if args.write:
                path.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
