"""The Debian packages the roles install, with their dependencies, for arm64 and amd64, as a flat apt
repository per architecture (``debs/<arch>/`` with ``Packages``, ``Packages.gz`` and ``Release``).

apt runs with a private configuration (its own sources list, state, cache and an empty dpkg status)
and ``APT::Architecture`` set to the target, so the host's own apt state is never touched (no
``dpkg --add-architecture``) and the full dependency closure of the requested packages is
downloaded: a board can install them from the mirror alone. The archive signatures are checked
with the Debian archive keyring like any apt run. The index is written here (not by
``dpkg-scanpackages`` on the edge server) so it is part of the manifest; it is deterministic
(sorted stanzas, gzip without a timestamp) and carries no ``Date``, so a board whose clock is still
wrong before chrony has synchronised it (the Pi 4 has no RTC) does not refuse it as "not valid yet".
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

INDEX_FILES = ("Packages", "Packages.gz", "Release")
ORIGIN = "dit-mirror"


class DebError(RuntimeError):
    """Debian packages cannot be downloaded or indexed."""


@dataclass(frozen=True)
class DebianArchive:
    """Where the packages come from: one-line apt sources and the keyring that signs them."""

    sources: tuple[str, ...]  # "URI SUITE COMPONENT..." (deb lines without the "deb")
    keyring: str = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class DebFile:
    path: Path
    package: str
    version: str
    architecture: str


def _apt_options(work: Path, arch: str, archive: DebianArchive, archives: Path) -> list[str]:
    etc = work / "etc"
    for sub in ("etc/apt.conf.d", "etc/preferences.d", "etc/sources.list.d", "state/lists/partial"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    lines = [f"deb [arch={arch} signed-by={archive.keyring}] {src}" for src in archive.sources]
    (etc / "sources.list").write_text("\n".join(lines) + "\n", encoding="utf-8")
    status = work / "status"
    status.write_text("", encoding="utf-8")
    opts = {
        "Dir::Etc::SourceList": str(etc / "sources.list"),
        "Dir::Etc::SourceParts": str(etc / "sources.list.d"),
        "Dir::Etc::Preferences": str(etc / "preferences"),
        "Dir::Etc::PreferencesParts": str(etc / "preferences.d"),
        "Dir::State": str(work / "state"),
        "Dir::State::Status": str(status),
        "Dir::Cache": str(work / "cache"),
        "Dir::Cache::Archives": str(archives),
        "APT::Architecture": arch,
        "APT::Architectures::": arch,
        "APT::Install-Recommends": "false",
        "APT::Sandbox::User": "root" if os.geteuid() == 0 else os.environ.get("USER", "root"),
        "Debug::NoLocking": "true",
        "Acquire::Languages": "none",
    }
    argv: list[str] = []
    for key, value in opts.items():
        argv += ["-o", f"{key}={value}"]
    return argv


def download_debs(
    packages: Sequence[str],
    arch: str,
    dest: Path,
    work: Path,
    archive: DebianArchive,
    log: Callable[[str], None],
) -> list[DebFile]:
    """Download ``packages`` and their dependency closure for Debian architecture ``arch`` into ``dest``
    (apt's archive directory: packages already there are kept); returns every .deb in ``dest``."""
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise DebError("apt-get not found: the Debian packages are fetched with apt (use --skip-debs)")
    dest.mkdir(parents=True, exist_ok=True)
    opts = _apt_options(work, arch, archive, dest)
    log(f"debs: {len(packages)} packages and their dependencies for {arch} -> {dest}")
    update = subprocess.run([apt_get, "-q", *opts, "update"], capture_output=True, text=True, check=False)
    if update.returncode != 0 or "\nE: " in "\n" + update.stderr:
        raise DebError(f"apt-get update for {arch} failed:\n{update.stderr.strip()}")
    install = subprocess.run(
        [apt_get, "-q", "-y", *opts, "install", "--download-only", "--no-install-recommends", *packages],
        capture_output=True,
        text=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        check=False,
    )
    shutil.rmtree(dest / "partial", ignore_errors=True)
    (dest / "lock").unlink(missing_ok=True)
    if install.returncode != 0:
        raise DebError(f"apt-get install --download-only for {arch} failed:\n{install.stderr.strip()}")
    out: list[DebFile] = []
    for deb in sorted(dest.glob("*.deb")):
        fields = deb_fields(deb)
        out.append(DebFile(deb, fields["Package"], fields["Version"], fields["Architecture"]))
    if not out:
        raise DebError(f"apt downloaded no package for {arch}")
    return out


def deb_fields(path: Path) -> dict[str, str]:
    """The control fields of a .deb (``dpkg-deb --field``), in file order."""
    proc = subprocess.run(["dpkg-deb", "--field", str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DebError(f"{path}: not a Debian package: {proc.stderr.strip()}")
    return parse_control(proc.stdout)


def parse_control(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line[:1] in (" ", "\t") and key:
            fields[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _digests(path: Path) -> tuple[str, str, int]:
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            md5.update(block)
            sha.update(block)
    return md5.hexdigest(), sha.hexdigest(), path.stat().st_size


def write_index(directory: Path, arch: str) -> list[Path]:
    """Write ``Packages``, ``Packages.gz`` and ``Release`` for the .debs in ``directory`` (a flat
    repository: ``deb [trusted=yes] http://MIRROR/debs/<arch>/ ./``)."""
    stanzas: list[tuple[str, str, str]] = []
    for deb in sorted(directory.glob("*.deb")):
        fields = deb_fields(deb)
        md5, sha, size = _digests(deb)
        fields.pop("Filename", None)
        lines = [f"{k}: {v}" for k, v in fields.items()]
        lines += [f"Filename: ./{deb.name}", f"Size: {size}", f"MD5sum: {md5}", f"SHA256: {sha}"]
        stanzas.append((fields["Package"], fields["Version"], "\n".join(lines) + "\n"))
    stanzas.sort()
    packages = "\n".join(s for _, _, s in stanzas).encode()
    (directory / "Packages").write_bytes(packages)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        gz.write(packages)
    (directory / "Packages.gz").write_bytes(buf.getvalue())
    release = [
        f"Origin: {ORIGIN}",
        f"Label: {ORIGIN}",
        "Suite: dit",
        "Codename: dit",
        f"Architectures: {arch} all",
        "Description: dit offline mirror (built by mirror/build; see manifest.json)",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        _, sha, size = _digests(directory / name)
        release.append(f" {sha} {size} {name}")
    (directory / "Release").write_text("\n".join(release) + "\n", encoding="utf-8")
    return [directory / name for name in INDEX_FILES]
