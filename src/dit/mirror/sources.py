"""``mirror/sources.yaml``: the Debian packages the roles need and the external runtimes (git) with
their pinned commits; bare clones of those runtimes, served over git's dumb HTTP protocol.

A bare clone is made with ``git clone --bare`` (no hook templates), the pinned commit is fetched
by id when the clone does not already hold it, verified (``rev-parse`` gives the same full id, it is
a commit, and ``rev-list --objects`` walks its whole tree, so nothing it needs is missing), pointed
to by the branch ``dit-pinned`` (the clone's HEAD), repacked into one pack and prepared for dumb
HTTP (``update-server-info``), so a board clones it from the mirror with plain
``git clone http://MIRROR/sources/<name>.git`` and checks out exactly that commit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dit.mirror.debs import DebianArchive
from dit.mirror.entries import NAME, Field, entry_values, read_sources

PINNED_BRANCH = "dit-pinned"
_FIELDS = {
    "name": Field("is not a plain name", NAME),
    "url": Field("is not a URL"),
    "commit": Field("is not a full 40-hex commit id ({name})", re.compile(r"^[0-9a-f]{40}\Z")),
}


class SourcesError(RuntimeError):
    """The sources list is malformed or a source cannot be cloned or verified."""


@dataclass(frozen=True)
class GitSource:
    name: str
    url: str
    commit: str


@dataclass(frozen=True)
class Sources:
    archive: DebianArchive
    packages: dict[str, tuple[str, ...]]  # Debian arch -> packages
    git: tuple[GitSource, ...]


def load_sources(path: Path) -> Sources:
    """Read and check ``mirror/sources.yaml`` (errors name the offending entry)."""
    doc = read_sources(path, SourcesError)
    if not isinstance(doc, dict):
        raise SourcesError(f"{path}: not a mapping")
    debian = doc.get("debian") or {}
    archive_lines = debian.get("archive") or []
    if not isinstance(archive_lines, list) or not all(isinstance(x, str) for x in archive_lines):
        raise SourcesError(f"{path}: debian.archive must be a list of 'URI SUITE COMPONENT...' strings")
    keyring = str(debian.get("keyring", DebianArchive(()).keyring))
    common = debian.get("packages") or []
    per_arch = debian.get("arch_packages") or {}
    packages: dict[str, tuple[str, ...]] = {}
    for arch in debian.get("architectures") or []:
        extra = per_arch.get(arch) or []
        packages[str(arch)] = tuple(str(p) for p in [*common, *extra])
    git: list[GitSource] = []
    for i, entry in enumerate(doc.get("git") or []):
        # unknown fields of a git entry have never been refused: they stay allowed
        git.append(GitSource(*entry_values(entry, f"{path}: git[{i}]", _FIELDS, SourcesError, closed=False)))
    return Sources(DebianArchive(tuple(archive_lines), keyring), packages, tuple(git))


def _git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("git")
    if exe is None:
        raise SourcesError("git not found (use --skip-sources)")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)


def _has_commit(repo: Path, commit: str) -> bool:
    return _git("-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def clone_source(source: GitSource, dest_root: Path, log: Callable[[str], None]) -> Path:
    """A bare clone of ``source`` at ``dest_root/<name>.git`` holding and pointing at its commit."""
    dest = dest_root / f"{source.name}.git"
    dest_root.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        log(f"sources: git clone --bare {source.url} -> {dest}")
        proc = _git("clone", "--bare", "--quiet", "--template=", source.url, str(dest))
        if proc.returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            raise SourcesError(f"{source.name}: git clone --bare {source.url} failed: {proc.stderr.strip()}")
    if not _has_commit(dest, source.commit):
        log(f"sources: git fetch origin {source.commit} ({source.name})")
        proc = _git("-C", str(dest), "fetch", "--quiet", "origin", source.commit)
        if proc.returncode != 0 or not _has_commit(dest, source.commit):
            raise SourcesError(
                f"{source.name}: commit {source.commit} is not in {source.url}: {proc.stderr.strip()}"
            )
    verify_commit(dest, source)
    steps = [
        ("update-ref", f"refs/heads/{PINNED_BRANCH}", source.commit),
        ("symbolic-ref", "HEAD", f"refs/heads/{PINNED_BRANCH}"),
        ("repack", "-a", "-d", "-q"),
        ("prune-packed",),
        ("update-server-info",),
    ]
    for step in steps:
        proc = _git("-C", str(dest), *step)
        if proc.returncode != 0:
            raise SourcesError(f"{source.name}: git {' '.join(step)} failed: {proc.stderr.strip()}")
    (dest / "FETCH_HEAD").unlink(missing_ok=True)
    return dest


def verify_commit(repo: Path, source: GitSource) -> None:
    """The repository holds ``source.commit`` as a commit with every object of its tree."""
    parsed = _git("-C", str(repo), "rev-parse", "--verify", "--quiet", f"{source.commit}^{{commit}}")
    if parsed.returncode != 0 or parsed.stdout.strip() != source.commit:
        raise SourcesError(f"{source.name}: {source.commit} is not a commit of {repo}")
    walk = _git("-C", str(repo), "rev-list", "--objects", "--quiet", source.commit)
    if walk.returncode != 0:
        raise SourcesError(
            f"{source.name}: commit {source.commit} is incomplete in {repo}: {walk.stderr.strip()}"
        )
