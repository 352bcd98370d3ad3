"""Download the wheels of a lock for its target platform with ``pip download`` (hashes required).

pip runs isolated from the machine's configuration (``PIP_CONFIG_FILE=/dev/null``, ``--isolated``):
the only sources are the index given (PyPI) and the lock's declared extra sources, so the mirror
never depends on what a local ``pip.conf`` happens to add. After the download every pin of the lock
must be matched by exactly one wheel in the architecture's directory whose SHA-256 the lock lists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dit.mirror.locks import PYTHON_VERSION, LockFile, Platform, canonical
from dit.mirror.manifest import sha256_file

_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl\Z")


class WheelError(RuntimeError):
    """A lock's wheels cannot be downloaded or do not match its hashes."""


@dataclass(frozen=True)
class WheelFile:
    path: Path
    name: str  # canonical
    version: str
    sha256: str


def parse_wheel_name(filename: str) -> tuple[str, str] | None:
    m = _WHEEL.match(filename)
    if m is None:
        return None
    return canonical(m.group("name")), m.group("version")


def pip_env() -> dict[str, str]:
    """The environment for pip: no PIP_* variables, no configuration files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def download_argv(
    lock: Path, platform: Platform, dest: Path, index_url: str, find_links: list[str]
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "pip",
        "--isolated",
        "download",
        "--require-hashes",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        "--abi",
        "cp" + PYTHON_VERSION.replace(".", ""),
        "--index-url",
        index_url,
        "--dest",
        str(dest),
        "--progress-bar",
        "off",
    ]
    for tag in platform.pip_platforms():
        argv += ["--platform", tag]
    for location in find_links:
        argv += ["--find-links", location]
    argv += ["-r", str(lock)]
    return argv


def match_lock(lock: LockFile, directory: Path) -> dict[str, WheelFile]:
    """``{pin name: the wheel in directory that satisfies it}``; raises naming what is missing."""
    found: dict[str, WheelFile] = {}
    for path in sorted(directory.glob("*.whl")):
        parsed = parse_wheel_name(path.name)
        if parsed is None or parsed[0] not in lock.pins:
            continue
        pin = lock.pins[parsed[0]]
        digest = sha256_file(path)
        if digest in pin.hashes:
            found[pin.name] = WheelFile(path, pin.name, pin.version, digest)
    missing = sorted(set(lock.pins) - set(found))
    if missing:
        raise WheelError(f"{lock.path}: no wheel with a locked hash for {', '.join(missing)} in {directory}")
    return found


def download_lock(
    lock: LockFile,
    platform: Platform,
    dest: Path,
    index_url: str,
    source_locations: Mapping[str, str],
    log: Callable[[str], None],
) -> dict[str, WheelFile]:
    """Download every wheel of ``lock`` for ``platform`` into ``dest`` (kept when already there)."""
    dest.mkdir(parents=True, exist_ok=True)
    find_links = []
    for source in lock.sources:
        if source not in source_locations:
            raise WheelError(f"{lock.path}: no location for wheel source {source!r}")
        find_links.append(source_locations[source])
    argv = download_argv(lock.path, platform, dest, index_url, find_links)
    log(f"wheels: {lock.name} ({len(lock.pins)} pins) for {platform.arch} -> {dest}")
    proc = subprocess.run(argv, capture_output=True, text=True, env=pip_env(), check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise WheelError(f"pip download of {lock.path} for {platform.arch} failed:\n{tail}")
    return match_lock(lock, dest)
