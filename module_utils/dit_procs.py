# -*- coding: utf-8 -*-
# Shared by dit's Ansible modules: tagged process groups of a run (stdlib only, runs on the node).
"""Start, find and reap the device-side processes of a dit run.

Every process a run starts carries ``DIT_RUN_ID``, ``DIT_HOST`` and ``DIT_TAG`` in its
environment and leads its own session (hence its own process group). Finding them reads
``/proc/<pid>/environ``, so a crashed driver can still reap them: nothing about them has to be
remembered except the run id.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import stat
import time
from typing import TYPE_CHECKING, Any, BinaryIO

from ansible.module_utils.dit_trusted import (
    UntrustedPath,
    open_private_append,
    others_can_write,
    owner_name,
    trusted_dir,
)

if TYPE_CHECKING:  # annotations only: the lazy import below keeps a module's start-up small
    import subprocess
    from collections.abc import Collection, Mapping

RUN_ENV = "DIT_RUN_ID"
HOST_ENV = "DIT_HOST"
TAG_ENV = "DIT_TAG"
# The device agent keeps its status record (running, then its exit code) where this names
# (dit.device.agent.StatusFile); dit_proc points it at logs/<tag>.status.json.
STATUS_ENV = "DIT_STATUS_FILE"
STATUS_SUFFIX = ".status.json"
# The two-phase start of a main process with a prepared_file (dit.device.tags spells the same names).
START_AT_ENV = "DIT_START_AT_NS"
START_AT_FILE_ENV = "DIT_START_AT_FILE"
PREPARED_FILE_ENV = "DIT_PREPARED_FILE"
START_WAIT_TIMEOUT_ENV = "DIT_START_AT_TIMEOUT_S"
STDERR_TAIL_LINES = 10


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return True
    # The state follows the parenthesised command name, which may itself contain spaces.
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


def find_tagged(
    run_id: str, host: str | None = None, tag: str | None = None, spare: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Live processes of ``run_id`` (optionally of one host / one tag; none tagged one of ``spare``):
    list of dicts."""
    found: list[dict[str, Any]] = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        env = _environ(pid)
        if not env or env.get(RUN_ENV) != run_id:
            continue
        if host is not None and env.get(HOST_ENV) != host:
            continue
        if tag is not None and env.get(TAG_ENV) != tag:
            continue
        if env.get(TAG_ENV) in spare:
            continue
        if _is_zombie(pid):
            continue
        try:
            pgid = os.getpgid(pid)
        except OSError:
            continue
        found.append({"pid": pid, "pgid": pgid, "tag": env.get(TAG_ENV, ""), "host": env.get(HOST_ENV, "")})
    return found


def reap(
    run_id: str,
    host: str | None = None,
    tag: str | None = None,
    grace_s: float = 5.0,
    spare: Collection[str] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """SIGTERM every process group of the run (but those of the processes tagged one of ``spare``), wait
    ``grace_s``, SIGKILL what is left.

    Returns ``(killed, survivors)``: the processes found at first, and those still alive at the end.
    """
    procs = find_tagged(run_id, host, tag, spare)
    groups = sorted({p["pgid"] for p in procs})
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(OSError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline:
            if not find_tagged(run_id, host, tag, spare):
                break
            time.sleep(0.05)
        remaining = find_tagged(run_id, host, tag, spare)
        if not remaining:
            return procs, []
        groups = sorted({p["pgid"] for p in remaining})
    return procs, find_tagged(run_id, host, tag, spare)


def cgroup_dirs(value: object) -> list[str]:
    """The cgroup directories of a module's ``cgroup`` option: one path (the old form), a list of
    paths, or nothing. A path is never split on commas (v1 mounts ``cpu,cpuacct``)."""
    if value is None or value == "":
        return []
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(item, str) and item for item in items):
        raise ValueError(f"cgroup: {value!r} is not a cgroup directory or a list of them")
    out: list[str] = []
    for item in items:
        if not os.path.isabs(item):
            raise ValueError(f"cgroup: {item!r} is not an absolute path")
        if item not in out:
            out.append(item)
    return out


def open_verified(path: str, sha256: str) -> int:
    """A read-only descriptor of the file ``path``, once its content is known to have SHA-256 ``sha256``.

    The directory holding it must be root's alone, parents included (``dit_trusted``), and the file
    root's and not writable by others; it is opened without following a link and hashed from that
    descriptor. Running it through the descriptor (``/proc/self/fd/N``) then runs exactly what was
    hashed: a file renamed over ``path`` afterwards is another inode. Raises
    :class:`UntrustedPath` naming the path, and on a mismatch both hashes.
    """
    directory, name = os.path.split(os.path.abspath(path))
    with trusted_dir(directory, what="the run directory") as dir_fd:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise UntrustedPath(
                f"{path} is a symbolic link: dit runs only the file it shipped there. Run again so that "
                "the file is shipped anew"
            ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or others_can_write(st):
            owner, mode = owner_name(st.st_uid), stat.S_IMODE(st.st_mode)
            raise UntrustedPath(
                f"{path} is owned by {owner} with mode {mode:04o}: dit runs only a regular file of root's "
                "that others cannot write. Run again so that the file is shipped anew"
            )
        digest = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
        found = digest.hexdigest()
        if found != sha256:
            raise UntrustedPath(
                f"{path} has SHA-256 {found}, not the {sha256} shipped with this run: it was changed after "
                "it was shipped, so dit will not run it. Find out who changed it, then run again"
            )
        return fd
    except BaseException:
        os.close(fd)
        raise


def spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    stdout_path: str,
    stderr_path: str,
    cgroup: str | list[str] | None = None,
    cpus: list[int] | None = None,
    verify: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session with ``env``; returns the Popen object.

    With ``cgroup`` (a cgroup directory, v1 or v2, or a list of them: cgroup v1 has one hierarchy
    per controller, e.g. the memory and the cpu one) the child joins each before it executes, so the
    process and everything it starts are under the cgroups' limits from their first instruction.
    With ``cpus`` (a list of CPU numbers) the child and its descendants run only on those CPUs.
    ``verify`` maps a file of ``argv`` (the device zipapp) to its SHA-256 as shipped: it is opened and
    checked by :func:`open_verified` and the child is given ``/proc/self/fd/N`` in its place.
    """
    verified: dict[str, int] = {}
    try:
        for arg in argv:
            if verify and arg in verify and arg not in verified:
                verified[arg] = open_verified(arg, verify[arg])
        child = _spawn(
            [f"/proc/self/fd/{verified[a]}" if a in verified else a for a in argv],
            env, cwd, stdout_path, stderr_path, cgroup, cpus, tuple(verified.values()),
        )  # fmt: skip
    finally:
        for fd in verified.values():
            os.close(fd)
    _await_environ(child.pid)
    return child


def _await_environ(pid: int, timeout_s: float = 2.0) -> None:
    """Wait until the new process's environment (its tags) can be read, or it is gone. Linux closes
    the exec status pipe Popen waits on before it lays out the new image's environment, so for a
    moment after Popen returns ``/proc/<pid>/environ`` reads empty and the process cannot be found by
    its run id (1-2 % of 2000 spawns of ``sleep`` on the development machine): a reap or a state
    check made then would miss it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        env = _environ(pid)
        if env is None or env or _is_zombie(pid):
            return
        time.sleep(0.0005)


def _spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    stdout_path: str,
    stderr_path: str,
    cgroup: str | list[str] | None,
    cpus: list[int] | None,
    pass_fds: tuple[int, ...],
) -> subprocess.Popen[bytes]:
    import subprocess

    procs_files = [os.path.join(d, "cgroup.procs") for d in cgroup_dirs(cgroup)]
    for procs_file in procs_files:
        if not os.path.exists(procs_file):
            raise OSError(f"cgroup {os.path.dirname(procs_file)} has no cgroup.procs")
    affinity = {int(c) for c in cpus} if cpus else None

    def before_exec() -> None:
        for procs_file in procs_files:
            with open(procs_file, "w", encoding="ascii") as handle:
                handle.write(str(os.getpid()))
        if affinity:
            os.sched_setaffinity(0, affinity)

    # 0600: a process's output names what others must not learn (the edge service's port, issue 46)
    with _private_log(stdout_path) as out, _private_log(stderr_path) as err:
        return subprocess.Popen(  # argv list, never a shell string
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
            preexec_fn=before_exec if (procs_files or affinity) else None,  # noqa: PLW1509 - no locks taken
        )


def _private_log(path: str) -> BinaryIO:
    """``path`` opened for appending, created 0600 (an existing file is narrowed to 0600 too)."""
    return os.fdopen(open_private_append(path), "ab")


def status_path(logs_dir: str, tag: str) -> str:
    """Where the process tagged ``tag`` keeps its status record."""
    return os.path.join(logs_dir, tag + STATUS_SUFFIX)


def alive_as(pid: object, run_id: str, tag: str) -> bool:
    """``pid`` is alive and is still the tagged process (not a reused pid)."""
    if not isinstance(pid, int) or pid <= 0 or _is_zombie(pid):
        return False
    env = _environ(pid)
    return env is not None and env.get(RUN_ENV) == run_id and env.get(TAG_ENV) == tag


def stderr_tail(path: str, lines: int = STDERR_TAIL_LINES, limit: int = 8192) -> list[str]:
    """The last ``lines`` non-empty lines of a log file (at most its last ``limit`` bytes)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def process_states(logs_dir: str, run_id: str) -> list[dict[str, Any]]:
    """What became of every process of this node that keeps a status record, sorted by tag.

    Each entry: ``tag``, ``command``, ``pid``, ``state`` (``running``: still alive; ``exited``: it
    recorded its exit code; ``vanished``: its record says running but the process is gone, i.e. it was
    killed by a signal), ``exit_code``, ``error``, ``failed`` (exited non-zero or vanished) and, when
    failed, ``stderr_tail`` (the last lines of ``logs/<tag>.err``).
    """
    out: list[dict[str, Any]] = []
    try:
        names = sorted(n for n in os.listdir(logs_dir) if n.endswith(STATUS_SUFFIX))
    except OSError:
        return out
    for name in names:
        tag = name[: -len(STATUS_SUFFIX)]
        record = read_json(os.path.join(logs_dir, name))
        if not isinstance(record, dict):
            record = {"state": "unreadable"}
        state = record.get("state")
        entry: dict[str, Any] = {
            "tag": tag,
            "command": record.get("command"),
            "pid": record.get("pid"),
            "exit_code": record.get("exit_code"),
            "error": record.get("error"),
        }
        if state == "exited":
            entry["state"] = "exited"
            entry["failed"] = entry["exit_code"] != 0
        elif state == "running" and alive_as(record.get("pid"), run_id, tag):
            entry["state"] = "running"
            entry["failed"] = False
        else:
            entry["state"] = "vanished"
            entry["failed"] = True
            entry["error"] = entry["error"] or "ended without recording an exit code (killed by a signal?)"
        if entry["failed"]:
            entry["stderr_tail"] = stderr_tail(os.path.join(logs_dir, tag + ".err"))
        out.append(entry)
    return out


def read_json(path: str) -> Any:
    """The JSON document in ``path``, or None when it is missing or not (yet) complete."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def tagged_env(
    base: Mapping[str, str], run_id: str, host: str, tag: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = dict(base)
    env.update(extra or {})
    env[RUN_ENV] = run_id
    env[HOST_ENV] = host
    env[TAG_ENV] = tag
    return env
