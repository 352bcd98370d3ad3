# -*- coding: utf-8 -*-
# Shared by dit's Ansible modules: a node's lease file (stdlib only, runs on the node).
"""Read, take (compare-and-swap) and release a dit node's lease file.

The controller decides (``dit.run.lease_decision``); these only act, under an exclusive ``flock`` on the lease's
directory so that the hosts of one machine (local mode) and two controllers never interleave a
read-check-write. The file is replaced atomically, so a reader never sees half a lease. The lease's
directory, and every directory above it, must be root's alone (``dit_trusted``): a lease another user
could plant or replace would refuse every run, or let a second one in.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

from ansible.module_utils.dit_trusted import check_trusted_dir

if TYPE_CHECKING:  # annotations only: the node's Python needs nothing beyond the stdlib
    from collections.abc import Iterator

LEASE_FILE = "lease.json"
MAX_BYTES = 65536
WHAT = "the node's lease directory"


class LeaseError(ValueError):
    """The lease cannot be taken or released as asked."""


class LeaseHeld(LeaseError):
    """Another run's lease was found under the lock: ``current`` is its exact content, so that the
    controller can name the holder in full (the node took it since the controller looked)."""

    def __init__(self, message: str, current: str) -> None:
        super().__init__(message)
        self.current = current


def check_directory(path: str) -> None:
    """Refuse (``UntrustedPath``) a lease whose directory, or one above it, is not root's alone; a
    directory not made yet passes when what exists above it is root's."""
    with contextlib.suppress(FileNotFoundError):
        check_trusted_dir(os.path.dirname(path), what=WHAT)


def read_text(path: str) -> str | None:
    """The lease file's content, or None when there is none."""
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_BYTES).decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def run_id_of(text: str) -> str | None:
    """The run id a lease file's content names, or None."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return str(data.get("run_id")) if isinstance(data, dict) and data.get("run_id") else None


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _check_path(path: str) -> None:
    if os.path.basename(path) != LEASE_FILE:
        raise LeaseError(f"{path}: a lease file is named {LEASE_FILE}")


def take(path: str, lease: dict[str, Any], replaces: str | None = None) -> bool:
    """Write ``lease`` (a dict with ``run_id``) to ``path`` when the node is free or already ours.

    ``replaces`` is the exact content of another run's lease the controller decided to break; any
    other content found is refused (someone took the node since the controller looked). Returns
    True when the file was written.
    """
    _check_path(path)
    directory = os.path.dirname(path)
    check_trusted_dir(directory, what=WHAT, create=True)
    with _locked(directory):
        current = read_text(path)
        if current is not None and run_id_of(current) == lease["run_id"]:
            return False
        if current is not None and current != replaces:
            holder = run_id_of(current) or "an unreadable lease"
            raise LeaseHeld(f"{path} is held by {holder}", current)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".lease-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(lease, handle, sort_keys=True)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return True


def release(path: str, run_id: str, check: bool = False) -> bool:
    """Remove the lease at ``path`` if it is held by ``run_id``; another run's is left alone.

    Returns True when it was (or, in check mode, would be) removed.
    """
    _check_path(path)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        return False
    with _locked(directory):
        if os.path.islink(path) or not os.path.isfile(path):
            return False
        current = read_text(path)
        if current is None or run_id_of(current) != run_id:
            return False
        if not check:
            os.unlink(path)
    return True
