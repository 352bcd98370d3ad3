"""``mirror/build``: the one command that talks to a package index.

Layout of the mirror directory (what ``roles/mirror_serve`` serves and ``roles/provision_*`` read)::

    manifest.json                  every other file: path, sha256, size, kind and origin
    locks/<lock>.txt               the lock files the wheels were downloaded for
    wheels/<arch>/*.whl            x86_64 | aarch64, the wheels of every lock for that arch
    debs/<debian arch>/*.deb       amd64 | arm64, flat apt repository (Packages, Packages.gz, Release)
    sources/<name>.git/            bare clones of external runtimes at their pinned commit
    runtimes/<name>-<pin12>/       an external runtime's wheel built at its pin, requirements-<arch>.txt
                                   (its lock plus the wheel, every line hashed) and runtime.json
    sdists/<project>-<ver>.tar.gz  source archives pinned by version + SHA-256 (llama.cpp's binaries)
    weights/*.safetensors          the model catalogue's weights
    checkpoints/<sha256>/<name>    real checkpoints pinned in the sources file (a file, or a Hugging Face
                                   directory with its SHA256SUMS): dit.mirror.checkpoints

A build may cover a subset (``--arch``, ``--lock``, ``--skip-*``): what an earlier build put in
the directory stays, keeps its origin from the previous manifest, and is re-hashed into the new one.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.mirror import checkpoints, debs, locks, runtimes, sdists, sources, weights, wheels
from dit.mirror.manifest import MANIFEST, ManifestError, read_manifest, walk, write_manifest

DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


class BuildError(RuntimeError):
    """The mirror cannot be built (the message says which part failed and why)."""


@dataclass(frozen=True)
class BuildOptions:
    out: Path
    repo: Path
    archs: tuple[str, ...] = ()  # empty: every architecture
    lock_names: tuple[str, ...] = ()  # empty: every lock in locks.LOCKS; names or paths
    skip_wheels: bool = False
    skip_debs: bool = False
    skip_sources: bool = False
    skip_weights: bool = False
    skip_runtimes: bool = False
    skip_checkpoints: bool = False
    skip_sdists: bool = False
    sdists_from: tuple[Path, ...] = ()  # local directories searched before the index
    runtime_names: tuple[str, ...] = ()  # empty: every runtime of the sources file
    sources_file: Path | None = None
    source_locations: Mapping[str, str] = field(default_factory=dict)
    weights_from: Path | None = None
    models: tuple[str, ...] = ()  # empty: every catalogue model with fixed weights
    index_url: str = locks.PYPI_SIMPLE


def host_arch() -> str:
    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)


def resolve_locks(options: BuildOptions) -> list[tuple[locks.LockFile, str]]:
    """``[(lock, arch)]`` for the locks this build serves, filtered by ``--arch``."""
    names = list(options.lock_names) or [spec.name for spec in locks.LOCKS]
    out: list[tuple[locks.LockFile, str]] = []
    for name in names:
        path = options.repo / "requirements" / f"{name}.txt" if name in locks.LOCKS_BY_NAME else Path(name)
        if not path.is_file():
            raise BuildError(f"lock {name}: {path} does not exist")
        try:
            lock = locks.read_lock(path)
        except locks.LockError as exc:
            raise BuildError(str(exc)) from exc
        if lock.unhashed:
            raise BuildError(f"{path}: requirements without a hash: {', '.join(lock.unhashed)}")
        arch = lock.arch or host_arch()
        if arch not in locks.PLATFORMS:
            raise BuildError(f"{path}: architecture {arch!r} is not one of {', '.join(locks.PLATFORMS)}")
        if not options.archs or arch in options.archs:
            out.append((lock, arch))
    return out


def _git_commit(repo: Path) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def _previous_origins(out: Path) -> dict[str, dict[str, Any]]:
    if not (out / MANIFEST).exists():
        return {}
    try:
        doc = read_manifest(out)
    except ManifestError as exc:
        raise BuildError(
            f"the existing manifest cannot be read ({exc}); remove it or use a new --out"
        ) from exc
    skip = {"path", "sha256", "size"}
    return {str(f["path"]): {k: v for k, v in f.items() if k not in skip} for f in doc["files"]}


def _build_wheels(
    options: BuildOptions, origins: dict[str, dict[str, Any]], log: Callable[[str], None]
) -> list[str]:
    done: list[str] = []
    for lock, arch in resolve_locks(options):
        dest = options.out / "wheels" / arch
        try:
            files = wheels.download_lock(
                lock, locks.PLATFORMS[arch], dest, options.index_url, options.source_locations, log
            )
        except wheels.WheelError as exc:
            raise BuildError(str(exc)) from exc
        for wheel in files.values():
            rel = wheel.path.relative_to(options.out).as_posix()
            previous = origins.get(rel, {})
            owners = sorted({*previous.get("locks", []), lock.name})
            origins[rel] = {
                "kind": "wheel",
                "arch": arch,
                "package": wheel.name,
                "version": wheel.version,
                "locks": owners,
            }
        copy = options.out / "locks" / f"{lock.name}.txt"
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(lock.path.read_bytes())
        origins[copy.relative_to(options.out).as_posix()] = {"kind": "lock", "arch": arch, "lock": lock.name}
        done.append(f"{lock.name}/{arch}: {len(files)} wheels")
    return done


def _build_debs(
    options: BuildOptions,
    srcs: sources.Sources,
    origins: dict[str, dict[str, Any]],
    log: Callable[[str], None],
) -> list[str]:
    wanted = {DEBIAN_ARCH[a] for a in options.archs} if options.archs else None
    done: list[str] = []
    for arch, packages in sorted(srcs.packages.items()):
        if wanted is not None and arch not in wanted:
            continue
        dest = options.out / "debs" / arch
        with tempfile.TemporaryDirectory(prefix=f"dit-apt-{arch}-") as work:
            try:
                found = debs.download_debs(packages, arch, dest, Path(work), srcs.archive, log)
                index = debs.write_index(dest, arch)
            except debs.DebError as exc:
                raise BuildError(str(exc)) from exc
        for deb in found:
            origins[deb.path.relative_to(options.out).as_posix()] = {
                "kind": "deb",
                "arch": arch,
                "package": deb.package,
                "version": deb.version,
                "requested": deb.package in packages,
            }
        for path in index:
            origins[path.relative_to(options.out).as_posix()] = {"kind": "apt-index", "arch": arch}
        done.append(f"debs/{arch}: {len(found)} packages ({len(packages)} requested)")
    return done


def _build_sources(
    options: BuildOptions,
    srcs: sources.Sources,
    origins: dict[str, dict[str, Any]],
    log: Callable[[str], None],
) -> list[str]:
    done: list[str] = []
    root = options.out / "sources"
    for src in srcs.git:
        try:
            repo = sources.clone_source(src, root, log)
        except sources.SourcesError as exc:
            raise BuildError(str(exc)) from exc
        count = _record_clone(options, repo, src, origins)
        done.append(f"sources/{src.name}.git at {src.commit[:12]}: {count} files")
    return done


def _record_clone(
    options: BuildOptions, repo: Path, src: sources.GitSource, origins: dict[str, dict[str, Any]]
) -> int:
    prefix = repo.relative_to(options.out).as_posix() + "/"
    for rel in [r for r in origins if r.startswith(prefix)]:
        del origins[rel]
    count = 0
    for rel in walk(repo):
        origins[prefix + rel] = {"kind": "source", "source": src.name, "url": src.url, "commit": src.commit}
        count += 1
    return count


def _build_runtimes(
    options: BuildOptions,
    declared: tuple[runtimes.RuntimeSource, ...],
    origins: dict[str, dict[str, Any]],
    log: Callable[[str], None],
) -> list[str]:
    wanted = set(options.runtime_names)
    unknown = sorted(wanted - {r.name for r in declared})
    if unknown:
        raise BuildError(f"runtime(s) {', '.join(unknown)} not declared in the sources file")
    archs = options.archs or tuple(locks.PLATFORMS)
    # the runtimes' build backends (setuptools, wheel) from the mirror's own pinned wheels for this
    # machine, built in the wheels step before this one: nothing of dit's environment is needed
    backend_wheels = options.out / "wheels" / host_arch()
    done: list[str] = []
    for src in declared:
        if wanted and src.name not in wanted:
            continue
        git = sources.GitSource(src.name, src.git or "", src.commit or "")

        def clone(git: sources.GitSource = git) -> Path:
            repo = sources.clone_source(git, options.out / "sources", log)
            _record_clone(options, repo, git, origins)
            return repo

        try:
            built = runtimes.build_runtime(
                src, options.out, archs, log, clone if src.git else None, backend_wheels
            )
        except (runtimes.RuntimeSourceError, sources.SourcesError) as exc:
            raise BuildError(str(exc)) from exc
        prefix = built.directory.relative_to(options.out).as_posix() + "/"
        for rel in [r for r in origins if r.startswith(prefix)]:
            del origins[rel]
        for rel in walk(built.directory):
            origins[prefix + rel] = {"kind": "runtime", "runtime": src.name, "pin": built.pin}
        origins[built.wheel.relative_to(options.out).as_posix()].update(
            kind="runtime-wheel", package=built.distribution, version=built.version
        )
        wheel_count = 0
        for arch, lock in built.locks.items():
            if lock is None or not lock.pins:
                continue
            dest = options.out / "wheels" / arch
            try:
                files = wheels.download_lock(
                    lock, locks.PLATFORMS[arch], dest, options.index_url, options.source_locations, log
                )
            except wheels.WheelError as exc:
                raise BuildError(f"runtime {src.name}: {exc}") from exc
            owner = f"runtime:{src.name}"
            for wheel in files.values():
                rel = wheel.path.relative_to(options.out).as_posix()
                previous = origins.get(rel, {})
                origins[rel] = {
                    "kind": "wheel",
                    "arch": arch,
                    "package": wheel.name,
                    "version": wheel.version,
                    "locks": sorted({*previous.get("locks", []), owner}),
                }
            wheel_count += len(files)
        done.append(
            f"runtimes/{built.directory.name}: {built.wheel.name} (sha256 {built.wheel_sha256[:12]}), "
            f"{wheel_count} requirement wheels for {', '.join(built.requirements) or 'no architecture'}"
        )
    return done


def _build_sdists(
    options: BuildOptions,
    declared: tuple[sdists.Sdist, ...],
    origins: dict[str, dict[str, Any]],
    log: Callable[[str], None],
) -> list[str]:
    done: list[str] = []
    for sdist in declared:
        try:
            path = sdists.fetch_sdist(
                sdist, options.out / "sdists", options.index_url, options.sdists_from, log
            )
        except sdists.SdistError as exc:
            raise BuildError(str(exc)) from exc
        origins[path.relative_to(options.out).as_posix()] = {
            "kind": "sdist",
            "package": sdist.name,
            "version": sdist.version,
            "sha256": sdist.sha256,
        }
        done.append(f"sdists/{path.name} (sha256 {sdist.sha256[:12]})")
    return done


def _build_weights(
    options: BuildOptions, origins: dict[str, dict[str, Any]], log: Callable[[str], None]
) -> list[str]:
    try:
        fetched = weights.fetch_weights(
            options.out / "weights", options.weights_from, log, list(options.models) or None
        )
    except weights.WeightsMirrorError as exc:
        raise BuildError(str(exc)) from exc
    for path, want in fetched:
        origins[path.relative_to(options.out).as_posix()] = {
            "kind": "weights",
            "model": want.model,
            "catalogue_sha256": want.sha256,
        }
    return [f"{len(fetched)} files in weights/"]


def _build_checkpoints(
    options: BuildOptions, sources_file: Path, origins: dict[str, dict[str, Any]], log: Callable[[str], None]
) -> list[str]:
    if not sources_file.is_file():
        return []
    done: list[str] = []
    try:
        for src in checkpoints.load_checkpoints(sources_file):
            files = checkpoints.copy_checkpoint(src, options.out, log)
            for path in files:
                origins[path.relative_to(options.out).as_posix()] = {
                    "kind": "checkpoint",
                    "checkpoint": src.name,
                    "pin": src.sha256,
                    "source": str(src.path),
                }
            done.append(f"checkpoints/{src.sha256[:12]}…/{src.path.name}: {src.name}, {len(files)} files")
    except checkpoints.CheckpointMirrorError as exc:
        raise BuildError(str(exc)) from exc
    return done


def _need(srcs: sources.Sources | None) -> sources.Sources:
    if srcs is None:  # pragma: no cover - guarded by the skip flags
        raise BuildError("no sources list loaded")
    return srcs


def build_mirror(options: BuildOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build (or extend) the mirror in ``options.out`` and write its manifest; returns the manifest."""
    started = time.monotonic()
    options.out.mkdir(parents=True, exist_ok=True)
    origins = _previous_origins(options.out)
    sources_file = options.sources_file or options.repo / "mirror" / "sources.yaml"
    srcs: sources.Sources | None = None
    if not (options.skip_debs and options.skip_sources):
        try:
            srcs = sources.load_sources(sources_file)
        except sources.SourcesError as exc:
            raise BuildError(str(exc)) from exc
    declared: tuple[runtimes.RuntimeSource, ...] = ()
    if not options.skip_runtimes and sources_file.is_file():  # no sources file: no runtimes declared
        try:
            declared = runtimes.load_runtimes(sources_file)
        except runtimes.RuntimeSourceError as exc:
            raise BuildError(str(exc)) from exc
    declared_sdists: tuple[sdists.Sdist, ...] = ()
    if not options.skip_sdists and sources_file.is_file():
        try:
            declared_sdists = sdists.load_sdists(sources_file)
        except sdists.SdistError as exc:
            raise BuildError(str(exc)) from exc
    parts: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    steps: list[tuple[str, bool, Callable[[], list[str]]]] = [
        ("wheels", options.skip_wheels, lambda: _build_wheels(options, origins, log)),
        ("debs", options.skip_debs or srcs is None, lambda: _build_debs(options, _need(srcs), origins, log)),
        (
            "sources",
            options.skip_sources or srcs is None,
            lambda: _build_sources(options, _need(srcs), origins, log),
        ),
        ("runtimes", options.skip_runtimes, lambda: _build_runtimes(options, declared, origins, log)),
        ("sdists", options.skip_sdists, lambda: _build_sdists(options, declared_sdists, origins, log)),
        ("weights", options.skip_weights, lambda: _build_weights(options, origins, log)),
        (
            "checkpoints",
            options.skip_checkpoints,
            lambda: _build_checkpoints(options, sources_file, origins, log),
        ),
    ]
    for name, skip, step in steps:
        if skip:
            continue
        begun = time.monotonic()
        parts[name] = step()
        seconds[name] = round(time.monotonic() - begun, 1)
    for part, lines in parts.items():
        for line in lines:
            log(f"{part}: {line} ({seconds[part]} s for {part})")
    pip_version = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    info = {
        "command": "mirror/build",
        "options": {
            "archs": list(options.archs),
            "locks": list(options.lock_names),
            "models": list(options.models),
            "runtimes": list(options.runtime_names),
            "skipped": [
                name
                for name, skip in (
                    ("wheels", options.skip_wheels),
                    ("debs", options.skip_debs),
                    ("sources", options.skip_sources),
                    ("weights", options.skip_weights),
                    ("runtimes", options.skip_runtimes),
                    ("checkpoints", options.skip_checkpoints),
                    ("sdists", options.skip_sdists),
                )
                if skip
            ],
            "index_url": options.index_url,
            "source_locations": dict(options.source_locations),
        },
        "dit_git": _git_commit(options.repo),
        "python": sys.version.split()[0],
        "pip": pip_version[1] if len(pip_version) > 1 else None,
        "host_arch": host_arch(),
        "finished_unix": int(time.time()),
        "duration_s": round(time.monotonic() - started, 1),
        "parts": parts,
        "part_seconds": seconds,
    }
    try:
        manifest = write_manifest(options.out, origins, json.loads(json.dumps(info)))
    except ManifestError as exc:
        raise BuildError(str(exc)) from exc
    return manifest
