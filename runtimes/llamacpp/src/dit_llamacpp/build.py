"""Build llama.cpp's RPC binaries from the mirrored llama-cpp-python sdist, offline, cached by its hash.

The sdist (pinned by version and SHA-256 in ``mirror/sources.yaml``, fetched and verified by
``mirror/build``) vendors llama.cpp under ``vendor/llama.cpp``. :func:`build` verifies the archive's
hash, unpacks it into a scratch directory beside the cache, configures CMake (Release, static,
``-DGGML_RPC=ON``, ``-DGGML_NATIVE=OFF`` so the binaries do not depend on the CPU of the machine that
built them, and every option that would reach the network off), builds only :data:`TARGETS`, copies
the binaries to ``<cache>/<sha256[:12]>/bin/`` and writes ``build.json`` (compiler, flags, wall time)
beside them. The directory is renamed into place last, so a cache directory that exists is complete;
a second call with the same archive returns it without building.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path("/var/cache/dit/llamacpp")
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
BUILD_RECORD = "build.json"

# CMake target -> the binary's role. ggml-rpc-server is tools/rpc's target (the binary the issue calls
# rpc-server); llama-completion is the controller (common arguments: --rpc, --tensor-split, -n, -p;
# llama-cli in this version is the chat client linked against the server, llama-simple takes no --rpc).
TARGETS: dict[str, str] = {
    "ggml-rpc-server": "rpc-server",
    "llama-completion": "controller",
    "llama-bench": "benchmark",
    "llama-quantize": "quantizer",
}

# Every option that matters, explicit: nothing reaches the network (no curl/openssl, no prebuilt UI,
# FetchContent disconnected), no native-arch flags, static binaries that can be copied to a node.
CMAKE_OPTIONS: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_SHARED_LIBS": "OFF",
    "GGML_RPC": "ON",
    "GGML_NATIVE": "OFF",
    "GGML_OPENMP": "OFF",
    "LLAMA_CURL": "OFF",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "LLAMA_BUILD_UI": "OFF",
    "LLAMA_USE_PREBUILT_UI": "OFF",
    "LLAMA_BUILD_TOOLS": "ON",
    "LLAMA_BUILD_COMMON": "ON",
    "FETCHCONTENT_FULLY_DISCONNECTED": "ON",
}


class BuildError(RuntimeError):
    """The sdist is missing, has the wrong hash, or the build failed."""


@dataclass(frozen=True)
class Build:
    """A cached build: its directory, binaries by role and the build record."""

    directory: Path
    binaries: dict[str, Path]
    record: dict[str, Any]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_archive(archive: Path, sha256: str, error: type[Exception]) -> None:
    """The sdist ``archive`` exists and has the pinned ``sha256``; else ``error`` saying which."""
    if not archive.is_file():
        raise error(f"{archive}: no such sdist (mirror/build fetches it: mirror/sources.yaml sdists)")
    actual = sha256_of(archive)
    if actual != sha256:
        raise error(f"{archive}: SHA-256 {actual} is not the pinned {sha256}")


def cache_dir(cache: Path, sha256: str) -> Path:
    """Where the build of the archive with this SHA-256 lives."""
    return cache / sha256[:12]


def configure_argv(
    cmake: str, source: Path, build_dir: Path, options: dict[str, str] | None = None
) -> list[str]:
    """``cmake -S source -B build_dir -G ... -D...`` (pure)."""
    opts = CMAKE_OPTIONS if options is None else options
    return [cmake, "-S", str(source), "-B", str(build_dir), *(f"-D{k}={v}" for k, v in sorted(opts.items()))]


def build_argv(cmake: str, build_dir: Path, jobs: int, targets: Sequence[str] = tuple(TARGETS)) -> list[str]:
    """``cmake --build build_dir --config Release -j N --target ...`` (pure)."""
    if jobs < 1:
        raise BuildError(f"jobs: {jobs} must be at least 1")
    return [cmake, "--build", str(build_dir), "--config", "Release", "-j", str(jobs), "--target", *targets]


def lookup(cache: Path = DEFAULT_CACHE, sha256: str = SDIST_SHA256) -> Build | None:
    """The cached build of that archive, or None when it has not been built (or is incomplete)."""
    directory = cache_dir(cache, sha256)
    record_path = directory / BUILD_RECORD
    if not record_path.is_file():
        return None
    record: dict[str, Any] = json.loads(record_path.read_text(encoding="utf-8"))
    binaries = {role: directory / "bin" / target for target, role in TARGETS.items()}
    if not all(p.is_file() for p in binaries.values()):
        return None
    return Build(directory, binaries, record)


def _compiler_version(exe: str) -> str:
    found = shutil.which(exe)
    if found is None:
        return f"{exe}: not found"
    proc = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    return proc.stdout.splitlines()[0] if proc.stdout else f"{exe}: no version"


def _safe_extract(archive: Path, dest: Path) -> Path:
    """Unpack the sdist (refusing members outside ``dest``); return its top directory."""
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise BuildError(f"{archive}: expected one top directory, found {[p.name for p in tops]}")
    return tops[0]


def build(
    archive: Path,
    cache: Path = DEFAULT_CACHE,
    *,
    sha256: str = SDIST_SHA256,
    jobs: int = 2,
    log: Callable[[str], None] = print,
    runner: Callable[[list[str]], int] | None = None,
) -> Build:
    """Build (or return the cached build of) the binaries from ``archive``; see the module docstring."""
    cached = lookup(cache, sha256)
    if cached is not None:
        log(f"llamacpp: cached build {cached.directory}")
        return cached
    check_archive(archive, sha256, BuildError)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found (roles/llamacpp installs cmake and g++ from the mirror)")
    final = cache_dir(cache, sha256)
    scratch = cache / f".build-{sha256[:12]}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    run = runner or _run
    try:
        top = _safe_extract(archive, scratch / "src")
        source = top / "vendor" / "llama.cpp"
        if not (source / "CMakeLists.txt").is_file():
            raise BuildError(f"{archive}: no vendor/llama.cpp/CMakeLists.txt")
        build_dir = scratch / "build"
        env_flags = {k: os.environ.get(k, "") for k in ("CFLAGS", "CXXFLAGS", "LDFLAGS")}
        configure = configure_argv(cmake, source, build_dir)
        compile_ = build_argv(cmake, build_dir, jobs)
        started = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for argv in (configure, compile_):
            log("llamacpp: " + " ".join(argv))
            rc = run(argv)
            if rc != 0:
                raise BuildError(f"{argv[0]} exited with {rc}: {' '.join(argv)}")
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        out = scratch / "out"
        (out / "bin").mkdir(parents=True)
        for target in TARGETS:
            built = build_dir / "bin" / target
            if not built.is_file():
                raise BuildError(f"target {target}: {built} was not produced")
            shutil.copy2(built, out / "bin" / target)
        load = os.getloadavg()
        record: dict[str, Any] = {
            "sdist": archive.name,
            "sha256": sha256,
            "version": SDIST_VERSION if archive.name == SDIST_NAME else None,
            "targets": TARGETS,
            "cmake_options": CMAKE_OPTIONS,
            "configure_argv": configure[1:],
            "build_argv": compile_[1:],
            "env_flags": env_flags,
            "cmake": _compiler_version(cmake),
            "cc": _compiler_version(os.environ.get("CC", "cc")),
            "cxx": _compiler_version(os.environ.get("CXX", "c++")),
            "jobs": jobs,
            "wall_s": round(wall, 1),
            # CPU time of every waited-for descendant (compilers, linker): comparable across loads
            "cpu_s": round(cpu, 1),
            "loadavg_after": [round(x, 2) for x in load],
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (out / BUILD_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        out.rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    built_now = lookup(cache, sha256)
    if built_now is None:
        raise BuildError(f"{final}: incomplete after the build")
    log(f"llamacpp: built {final} in {record['wall_s']} s")
    return built_now


def _run(argv: list[str]) -> int:
    return subprocess.run(argv, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    """``python build.py --archive SDIST [--cache DIR] [--jobs N]``: the maintenance action's entry point
    (this file is copied to the node alone: it needs only the standard library)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="dit-llamacpp-build", description=main.__doc__)
    parser.add_argument("--archive", type=Path, required=True, help="the llama-cpp-python sdist")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--sha256", default=SDIST_SHA256, help="the pinned SHA-256 of the sdist")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        built = build(
            args.archive, args.cache, sha256=args.sha256, jobs=args.jobs, log=lambda m: print(m, flush=True)
        )
    except BuildError as exc:
        print(f"llamacpp build: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"directory": str(built.directory), **built.record}, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
