"""External runtimes in the mirror: their declared sources, pins and the wheels built from them.

``mirror/sources.yaml`` declares each external runtime under ``runtimes:``::

    runtimes:
      - name: headsplit                   # the runtime's name (its dit.runtimes entry point)
        path: ../runtimes/headsplit       # a directory (relative to the sources file), pinned by its hash
        requirements: ../runtimes/headsplit/requirements.txt   # hash-locked; or {aarch64: ..., x86_64: ...}
      - name: other
        git: https://example.org/other.git   # or a git repository (URL or local path) ...
        commit: 0123456789abcdef0123456789abcdef01234567   # ... at a full commit id
        subdirectory: python              # optional: where its pyproject.toml is in the repository
        wheel_sha256: <64 hex>            # optional: the wheel the build must produce (a wheel pin)

The **pin** is the commit (git) or the SHA-256 of the directory's files (path); a node installs the
runtime into ``<runtimes dir>/<name>-<pin[:12]>`` (``roles/runtime_env``). At mirror-build time a git
runtime is cloned bare into ``sources/<name>.git`` (:mod:`dit.mirror.sources`), its pinned commit is
exported into a temporary tree, and the tree is built into a wheel with ``pip wheel --no-deps
--no-index``, its declared build requirements (the build backend) installed in pip's isolated build
environment from the mirror's own wheels of this machine's architecture (nothing is downloaded; without
those wheels, from the builder's environment); ``SOURCE_DATE_EPOCH`` is the commit's time (0 for a
directory), so a rebuild gives the same bytes. The mirror then holds, per runtime and pin::

    runtimes/<name>-<pin12>/<wheel>                 the runtime's wheel (pure Python)
    runtimes/<name>-<pin12>/requirements-<arch>.txt its lock plus the wheel's own line, every line hashed
    runtimes/<name>-<pin12>/runtime.json            name, pin, source, wheel, its SHA-256, per-arch locks

and the wheels of its lock in ``wheels/<arch>/`` with the other locks' wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.mirror.entries import read_sources
from dit.mirror.locks import PLATFORMS, LockError, LockFile, read_lock
from dit.mirror.manifest import sha256_file
from dit.mirror.wheels import parse_wheel_name, pip_env

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_COMMIT = re.compile(r"^[0-9a-f]{40}\Z")
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
PIN_CHARS = 12  # of the pin in directory names: <name>-<pin12>
RUNTIME_JSON = "runtime.json"
#: Left out of a directory source's hash and of the tree the wheel is built from (build by-products).
IGNORED = ("__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".git", ".mypy_cache", ".pytest_cache")


class RuntimeSourceError(RuntimeError):
    """A runtime declaration is malformed, or its source cannot be cloned, hashed or built."""


@dataclass(frozen=True)
class RuntimeSource:
    """One external runtime as ``mirror/sources.yaml`` declares it (paths resolved)."""

    name: str
    git: str | None = None  # repository URL or path (with ``commit``)
    commit: str | None = None
    path: Path | None = None  # a directory (pinned by its hash)
    subdirectory: str = ""
    requirements: Mapping[str, Path] = field(default_factory=dict)  # arch ("" = any) -> lock
    wheel_sha256: str | None = None

    @property
    def pin(self) -> str:
        """The commit (git) or the SHA-256 of the directory's files (path)."""
        if self.commit is not None:
            return self.commit
        assert self.path is not None
        return tree_sha256(self.path)

    def env_name(self, pin: str | None = None) -> str:
        """``<name>-<pin12>``: the venv's directory name on a node and the mirror's directory name."""
        return f"{self.name}-{(pin or self.pin)[:PIN_CHARS]}"

    def lock_for(self, arch: str) -> Path | None:
        """The runtime's lock for ``arch`` (None: the runtime needs nothing besides itself)."""
        return self.requirements.get(arch) or self.requirements.get("")

    def describe(self) -> str:
        if self.git is not None:
            return f"{self.git} at {self.commit}" + (f" ({self.subdirectory})" if self.subdirectory else "")
        return str(self.path)


def _ignored(name: str) -> bool:
    return any(Path(name).match(pattern) for pattern in IGNORED)


def _files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _ignored(d))
        for name in sorted(filenames):
            if not _ignored(name):
                yield Path(dirpath, name)


def tree_sha256(root: Path) -> str:
    """SHA-256 over every file of ``root`` (relative path and content; build by-products left out)."""
    if not root.is_dir():
        raise RuntimeSourceError(f"{root}: not a directory")
    digest = hashlib.sha256()
    for path in sorted(_files(root), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def _requirements(value: Any, base: Path, where: str) -> dict[str, Path]:
    if value is None:
        return {}
    if isinstance(value, str):
        return {"": (base / value).resolve()}
    if isinstance(value, dict):
        out: dict[str, Path] = {}
        for arch, path in value.items():
            if arch not in PLATFORMS:
                raise RuntimeSourceError(
                    f"{where}.requirements: {arch!r} is not one of {', '.join(PLATFORMS)}"
                )
            if not isinstance(path, str):
                raise RuntimeSourceError(f"{where}.requirements.{arch}: {path!r} is not a path")
            out[str(arch)] = (base / path).resolve()
        return out
    raise RuntimeSourceError(f"{where}.requirements: a path or a mapping of architecture to path")


def parse_runtimes(entries: Any, base: Path, where: str = "runtimes") -> tuple[RuntimeSource, ...]:
    """The ``runtimes:`` list of a sources file; relative paths are relative to ``base`` (its directory).

    Errors name the entry and field (``runtimes[0].commit: ...``).
    """
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise RuntimeSourceError(f"{where}: a list of runtimes")
    found: list[RuntimeSource] = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise RuntimeSourceError(f"{at}: not a mapping")
        unknown = sorted(
            set(entry) - {"name", "git", "commit", "path", "subdirectory", "requirements", "wheel_sha256"}
        )
        if unknown:
            raise RuntimeSourceError(f"{at}: unknown field(s) {', '.join(unknown)}")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RuntimeSourceError(f"{at}.name: {name!r} is not a plain name")
        git, commit, path = entry.get("git"), entry.get("commit"), entry.get("path")
        if (git is None) == (path is None):
            raise RuntimeSourceError(f"{at}: exactly one of git (with commit) or path ({name})")
        sub = entry.get("subdirectory", "")
        if not isinstance(sub, str) or sub.startswith("/") or ".." in Path(sub).parts:
            raise RuntimeSourceError(
                f"{at}.subdirectory: {sub!r} is not a relative path inside the repository"
            )
        wheel_sha = entry.get("wheel_sha256")
        if wheel_sha is not None and (not isinstance(wheel_sha, str) or not _SHA256.match(wheel_sha)):
            raise RuntimeSourceError(f"{at}.wheel_sha256: {wheel_sha!r} is not a 64-hex SHA-256")
        reqs = _requirements(entry.get("requirements"), base, at)
        if git is not None:
            if not isinstance(git, str) or not git:
                raise RuntimeSourceError(f"{at}.git: {git!r} is not a repository URL or path")
            if not isinstance(commit, str) or not _COMMIT.match(commit):
                raise RuntimeSourceError(f"{at}.commit: {commit!r} is not a full 40-hex commit id ({name})")
            url = git if "://" in git or git.startswith("git@") else str((base / git).resolve())
            found.append(RuntimeSource(name, url, commit, None, sub, reqs, wheel_sha))
        else:
            if commit is not None:
                raise RuntimeSourceError(f"{at}.commit: only with git (a path is pinned by its hash)")
            if not isinstance(path, str) or not path:
                raise RuntimeSourceError(f"{at}.path: {path!r} is not a directory")
            found.append(RuntimeSource(name, None, None, (base / path / sub).resolve(), "", reqs, wheel_sha))
    names = [r.name for r in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RuntimeSourceError(f"{where}: runtime(s) declared twice: {', '.join(twice)}")
    return tuple(found)


def load_runtimes(path: Path) -> tuple[RuntimeSource, ...]:
    """The ``runtimes:`` of a sources file (``mirror/sources.yaml``)."""
    doc = read_sources(path, RuntimeSourceError)
    if not isinstance(doc, dict):
        raise RuntimeSourceError(f"{path}: not a mapping")
    return parse_runtimes(doc.get("runtimes"), path.parent, f"{path}: runtimes")


def default_sources_file() -> Path:
    """``$DIT_MIRROR_SOURCES``, else this checkout's ``mirror/sources.yaml``."""
    env = os.environ.get("DIT_MIRROR_SOURCES")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "mirror" / "sources.yaml"


def declared(name: str, sources_file: Path | None = None) -> RuntimeSource | None:
    """The declaration of runtime ``name`` (None when the sources file does not declare it)."""
    path = sources_file or default_sources_file()
    if not path.is_file():
        return None
    return next((r for r in load_runtimes(path) if r.name == name), None)


# ------------------------------------------------------------------------------------------------ build


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("git")
    if exe is None:
        raise RuntimeSourceError("git not found")
    return subprocess.run([exe, *args], capture_output=True, text=True, check=False)


def export_commit(bare: Path, commit: str, dest: Path) -> int:
    """Write the tree of ``commit`` of the bare repository ``bare`` into ``dest``; the commit's time."""
    when = _git("-C", str(bare), "show", "-s", "--format=%ct", commit)
    if when.returncode != 0:
        raise RuntimeSourceError(f"{bare}: cannot read commit {commit}: {when.stderr.strip()}")
    archive = dest.parent / f"{dest.name}.tar"
    proc = _git("-C", str(bare), "archive", "--format=tar", "-o", str(archive), commit)
    if proc.returncode != 0:
        raise RuntimeSourceError(f"{bare}: git archive {commit} failed: {proc.stderr.strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return int(when.stdout.strip())


def build_requires(tree: Path) -> list[str]:
    """The build requirements ``tree``'s ``pyproject.toml`` declares (PEP 518's default without one)."""
    try:
        doc: Any = tomllib.loads((tree / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        doc = {}
    requires = doc.get("build-system", {}).get("requires") if isinstance(doc, dict) else None
    if not isinstance(requires, list):
        return ["setuptools>=40.8.0"]
    return [str(r) for r in requires]


def _pip_wheel(argv_tail: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pip", "--isolated", "wheel", "--no-deps", "--no-index", "--progress-bar", "off",
            *argv_tail]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False)


def build_wheel(
    tree: Path,
    dest: Path,
    epoch: int,
    log: Callable[[str], None],
    backend_wheels: Path | None = None,
) -> Path:
    """``pip wheel --no-deps --no-index`` of ``tree`` into ``dest``: the wheel.

    The build requirements ``tree`` declares (its build backend, e.g. ``setuptools>=70.1``) come from
    ``backend_wheels`` (the mirror's own wheels of this machine's architecture: the locks pin setuptools
    and wheel) in pip's isolated build environment, offline: the build needs nothing of dit's own
    environment, which a plain install (``pip install dit[web]``) leaves without a setuptools that has
    ``bdist_wheel``. Without such wheels (or when they lack a requirement), the builder's environment
    serves (``--no-build-isolation``), as before.
    """
    dest.mkdir(parents=True, exist_ok=True)
    env = {**pip_env(), "SOURCE_DATE_EPOCH": str(max(epoch, 315532800))}  # zip cannot store before 1980
    tail = ["--wheel-dir", str(dest), str(tree)]
    proc: subprocess.CompletedProcess[str] | None = None
    if backend_wheels is not None and any(backend_wheels.glob("*.whl")):
        log(f"runtimes: pip wheel {tree} (build requirements from {backend_wheels})")
        proc = _pip_wheel(["--find-links", str(backend_wheels), *tail], env)
        if proc.returncode != 0 and "No matching distribution found" in proc.stdout + proc.stderr:
            log(
                f"runtimes: {backend_wheels} lacks a build requirement of {tree}; building with this environment's"
            )
            proc = None
    if proc is None:
        log(f"runtimes: pip wheel {tree}")
        proc = _pip_wheel(["--no-build-isolation", *tail], env)
    if proc.returncode != 0:
        output = (proc.stdout or "") + (proc.stderr or "")
        last = "\n".join(output.strip().splitlines()[-15:])
        hint = ""
        if any(sign in output for sign in _BACKEND_MISSING):
            requires = ", ".join(build_requires(tree))
            hint = (
                f"\nThe build requirements of {tree.name} ({requires}) are missing: build the mirror's wheels "
                "first (mirror/build without --skip-wheels: the locks pin setuptools and wheel, and the "
                "runtimes are built with them), or install them into dit's environment "
                f"(pip install {' '.join(repr(r) for r in build_requires(tree))}; the dev extra has them: "
                "pip install -e '.[dev]')"
            )
        raise RuntimeSourceError(f"pip wheel of {tree} failed:\n{last}{hint}")
    built = sorted(dest.glob("*.whl"))
    if len(built) != 1:
        raise RuntimeSourceError(f"pip wheel of {tree} left {len(built)} wheels, expected one")
    return built[0]


#: What pip or the backend prints when the build backend is absent or too old to build wheels.
_BACKEND_MISSING = (
    "invalid command 'bdist_wheel'",
    "BackendUnavailable",
    "backend-unavailable",
    "Cannot import build backend",
    "No module named 'setuptools'",
    "Cannot import 'setuptools.build_meta'",
    "No matching distribution found",
)


@dataclass(frozen=True)
class BuiltRuntime:
    """What the mirror holds of one runtime at its pin."""

    source: RuntimeSource
    pin: str
    directory: Path  # <mirror>/runtimes/<name>-<pin12>
    wheel: Path
    wheel_sha256: str
    distribution: str  # canonical project name of the wheel
    version: str
    requirements: Mapping[str, Path]  # arch -> the combined requirements file
    locks: Mapping[str, LockFile | None]  # arch -> the runtime's lock (None: nothing besides itself)


def _read_lock(path: Path, name: str) -> LockFile:
    if not path.is_file():
        raise RuntimeSourceError(f"runtime {name}: requirements file {path} does not exist")
    try:
        lock = read_lock(path)
    except LockError as exc:
        raise RuntimeSourceError(f"runtime {name}: {exc}") from exc
    if lock.unhashed:
        raise RuntimeSourceError(
            f"runtime {name}: {path}: requirements without a hash: {', '.join(lock.unhashed)}"
        )
    return lock


def build_runtime(
    source: RuntimeSource,
    out: Path,
    archs: tuple[str, ...],
    log: Callable[[str], None],
    clone: Callable[[], Path] | None = None,
    backend_wheels: Path | None = None,
) -> BuiltRuntime:
    """Build ``source``'s wheel at its pin into ``out/runtimes/<name>-<pin12>/`` with its requirements.

    ``clone`` makes (or reuses) the bare clone of a git source and returns it. A directory already
    holding this pin's ``runtime.json`` and wheel is kept (the pin names the same source).
    ``backend_wheels``: where the build requirements come from (:func:`build_wheel`).
    """
    pin = source.pin
    directory = out / "runtimes" / source.env_name(pin)
    with tempfile.TemporaryDirectory(prefix=f"dit-runtime-{source.name}-") as tmp:
        work = Path(tmp)
        if source.git is not None:
            if clone is None:
                raise RuntimeSourceError(f"runtime {source.name}: a git source needs its bare clone")
            bare = clone()
            epoch = export_commit(bare, pin, work / "tree")
            tree = work / "tree" / source.subdirectory
        else:
            assert source.path is not None
            tree = work / "tree"
            shutil.copytree(source.path, tree, ignore=shutil.ignore_patterns(*IGNORED))
            epoch = 0
        if not (tree / "pyproject.toml").is_file() and not (tree / "setup.py").is_file():
            raise RuntimeSourceError(f"runtime {source.name}: no pyproject.toml in {source.describe()}")
        wheel = build_wheel(tree, work / "wheel", epoch, log, backend_wheels)
        parsed = parse_wheel_name(wheel.name)
        if parsed is None or not wheel.name.endswith("-py3-none-any.whl"):
            raise RuntimeSourceError(
                f"runtime {source.name}: {wheel.name} is not a pure-Python wheel (py3-none-any); "
                "only pure-Python runtimes are built into the mirror"
            )
        digest = sha256_file(wheel)
        if source.wheel_sha256 is not None and digest != source.wheel_sha256:
            raise RuntimeSourceError(
                f"runtime {source.name}: the wheel built from {source.describe()} has sha256 {digest}, "
                f"the declaration pins wheel_sha256 {source.wheel_sha256}"
            )
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        final = directory / wheel.name
        shutil.move(str(wheel), final)
    name, version = parsed
    wheel_line = f"{name}=={version} --hash=sha256:{digest}\n"
    requirements: dict[str, Path] = {}
    locks: dict[str, LockFile | None] = {}
    for arch in archs:
        lock_path = source.lock_for(arch)
        lock = _read_lock(lock_path, source.name) if lock_path is not None else None
        if lock is not None and lock.arch not in (None, arch):
            continue  # a lock made for another architecture does not serve this one
        if lock is not None and name in lock.pins:
            raise RuntimeSourceError(
                f"runtime {source.name}: its lock {lock.path} pins the runtime itself ({name})"
            )
        head = f"# runtime {source.name} at {pin} for {arch}, written by mirror/build: its lock, then its wheel\n"
        body = lock.path.read_text(encoding="utf-8") if lock is not None else ""
        if body and not body.endswith("\n"):
            body += "\n"
        target = directory / f"requirements-{arch}.txt"
        target.write_text(head + body + wheel_line, encoding="utf-8")
        requirements[arch], locks[arch] = target, lock
    record = {
        "name": source.name,
        "pin": pin,
        "source": {"git": source.git, "commit": source.commit, "subdirectory": source.subdirectory}
        if source.git is not None
        else {"path": str(source.path), "tree_sha256": pin},
        "wheel": final.name,
        "wheel_sha256": digest,
        "distribution": name,
        "version": version,
        "requirements": {arch: p.name for arch, p in requirements.items()},
        "locks": {arch: (str(lock.path) if lock else None) for arch, lock in locks.items()},
    }
    (directory / RUNTIME_JSON).write_text(
        json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    log(
        f"runtimes: {source.name} {version} at {pin[:PIN_CHARS]} -> {final.relative_to(out)} (sha256 {digest[:12]})"
    )
    return BuiltRuntime(source, pin, directory, final, digest, name, version, requirements, locks)
