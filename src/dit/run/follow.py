"""Live device output: follow every node's ``{node_root}/logs/*.out|*.err`` while a run goes.

The driver starts a :class:`LogFollower` after the apply stage and stops it before teardown; each
complete line is handed to a callback (the driver's is ``Reporter.line(host, "stdout"|"stderr", …)``),
so device output lands in ``run.log`` next to the Ansible task events, tagged by node and stream,
as it happens. The text of a line is ``[<tag>] <line>`` where ``<tag>`` is the log file's name
without its suffix (``profile``, ``edge``, ``monitor`` …).

- A node whose Ansible connection is ``local`` (local mode, or a local host in an inventory) is
  followed by reading its files directly, from a thread that polls them.
- Any other node gets one ``ssh`` process built from the host's Ansible connection variables
  (``ansible_host``, ``ansible_user``, ``ansible_port``, ``ansible_ssh_private_key_file``,
  ``ansible_ssh_common_args``, ``ansible_ssh_extra_args``) running a small POSIX ``sh`` loop that
  starts ``tail -F -n +1`` on every log file as it appears, each line prefixed with its file name.
  The remote processes carry the run's ``DIT_RUN_ID`` / ``DIT_HOST`` / ``DIT_TAG=follow``, so even
  if the connection dies without them noticing, teardown's reaper removes them; normally they end
  by themselves within a second of the ssh session going away (the loop watches its parent).

Nothing is started on a node that is not already part of the run, and the follower never fails a
run: a node it cannot follow is reported once through the callback (stream ``follow``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.device.tags import HOST_ENV, RUN_ENV, TAG_ENV

Callback = Callable[[str, str, str], None]
"""``callback(host, stream, text)``; stream is ``stdout`` (``*.out``) or ``stderr`` (``*.err``)."""

SUFFIX_STREAM = {".out": "stdout", ".err": "stderr"}
MAX_LINE = 64 * 1024  # a line longer than this is cut into pieces of this size
FOLLOW_TAG = "follow"
REMOTE_GRACE_S = 1.0  # before stopping, remote followers get this long to deliver what is in flight

# The remote side of an ssh follower. $1 is the node's logs directory. Every second it starts a
# `tail -F` for each new *.out / *.err file, prefixing lines with the file name (sed -u: one write
# per line, so lines of different files never interleave mid-line); it ends, taking its process
# group with it, once its parent (the ssh session) is gone.
REMOTE_SCRIPT = r"""
cd "$1" 2>/dev/null || { mkdir -p "$1" && cd "$1"; } || exit 1
parent=$PPID
seen=" "
trap 'trap - TERM; kill 0' EXIT HUP TERM
while kill -0 "$parent" 2>/dev/null; do
  for f in *.out *.err; do
    [ -f "$f" ] || continue
    case "$seen" in *" $f "*) continue ;; esac
    seen="$seen$f "
    tail -F -n +1 -- "$f" 2>/dev/null | sed -u "s|^|$f |" &
  done
  sleep 1
done
"""


@dataclass(frozen=True)
class FollowTarget:
    """One node to follow: its run root (a path on the node) and its Ansible host variables."""

    host: str
    node_root: str
    hostvars: Mapping[str, Any] = field(default_factory=dict)
    local: bool = False  # local mode: every node is a directory on this machine

    @property
    def is_local(self) -> bool:
        return self.local or str(self.hostvars.get("ansible_connection", "ssh")) == "local"


def split_line(name: str, line: str) -> tuple[str, str] | None:
    """``(stream, text)`` of a line read from log file ``name``; None for a file that is not a log."""
    tag, dot, suffix = name.rpartition(".")
    stream = SUFFIX_STREAM.get(dot + suffix)
    if not tag or stream is None:
        return None
    return stream, f"[{tag}] {line}"


def parse_remote_line(line: str) -> tuple[str, str] | None:
    """A line of the remote loop (``<file> <text>``) as ``(stream, text)``."""
    name, _, text = line.partition(" ")
    if "/" in name:
        return None
    return split_line(name, text)


def ssh_argv(target: FollowTarget, run_id: str, ssh: str = "ssh") -> list[str]:
    """The ``ssh`` command that follows ``target``'s logs (the remote part is one quoted string)."""
    hv = target.hostvars
    argv = [ssh, "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5"]
    port = hv.get("ansible_port") or hv.get("ansible_ssh_port")
    if port:
        argv += ["-p", str(port)]
    key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
    if key:
        argv += ["-i", os.path.expanduser(str(key))]
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if hv.get(var):
            argv += shlex.split(str(hv[var]))
    address = str(hv.get("ansible_host") or target.host)
    user = hv.get("ansible_user") or hv.get("ansible_ssh_user")
    argv.append(f"{user}@{address}" if user else address)
    argv.append(remote_command(target, run_id))
    return argv


def remote_command(target: FollowTarget, run_id: str) -> str:
    """What the remote login shell runs: the loop, tagged as a process of the run."""
    logs = f"{target.node_root.rstrip('/')}/logs"
    return shlex.join(
        [
            "env",
            f"{RUN_ENV}={run_id}",
            f"{HOST_ENV}={target.host}",
            f"{TAG_ENV}={FOLLOW_TAG}",
            "sh",
            "-c",
            REMOTE_SCRIPT,
            "sh",
            logs,
        ]
    )


class _LocalFiles:
    """Incremental reader of one node's log files on this machine."""

    def __init__(self, target: FollowTarget, callback: Callback) -> None:
        self.target = target
        self.logs = Path(target.node_root) / "logs"
        self.callback = callback
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}

    def poll(self, final: bool = False) -> None:
        try:
            names = sorted(p.name for p in self.logs.iterdir() if p.suffix in SUFFIX_STREAM)
        except OSError:
            return
        for name in names:
            self._read(name, final)

    def _read(self, name: str, final: bool) -> None:
        path = self.logs / name
        offset = self.offsets.get(name, 0)
        try:
            with path.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < offset:  # truncated or replaced: start over
                    offset, self.partial[name] = 0, b""
                handle.seek(offset)
                data = handle.read(max(0, size - offset))
        except OSError:
            return
        self.offsets[name] = offset + len(data)
        buffer = self.partial.get(name, b"") + data
        *lines, rest = buffer.split(b"\n")
        if final and rest:
            lines, rest = [*lines, rest], b""
        while len(rest) > MAX_LINE:
            lines.append(rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        self.partial[name] = rest
        for raw in lines:
            parsed = split_line(name, raw.decode("utf-8", errors="replace").rstrip("\r"))
            if parsed is not None:
                self.callback(self.target.host, *parsed)


class LogFollower:
    """Follows the log files of every target until :meth:`stop`; see the module docstring."""

    def __init__(
        self,
        targets: list[FollowTarget],
        run_id: str,
        callback: Callback,
        poll_s: float = 0.2,
        ssh: str = "ssh",
    ) -> None:
        self.targets = targets
        self.run_id = run_id
        self.callback = callback
        self.poll_s = poll_s
        self.ssh = ssh
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._local = [_LocalFiles(t, self._emit) for t in targets if t.is_local]
        self._lock = threading.Lock()

    def _emit(self, host: str, stream: str, text: str) -> None:
        # the follower must never break the run it reports on
        with contextlib.suppress(Exception):
            self.callback(host, stream, text)

    def start(self) -> None:
        if self._local:
            thread = threading.Thread(target=self._poll_local, name="dit-follow-local", daemon=True)
            thread.start()
            self._threads.append(thread)
        for target in self.targets:
            if target.is_local:
                continue
            argv = ssh_argv(target, self.run_id, self.ssh)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                self._emit(target.host, FOLLOW_TAG, f"cannot follow the node's output: {exc}")
                continue
            self._procs.append(proc)
            thread = threading.Thread(
                target=self._read_remote, args=(target, proc), name=f"dit-follow-{target.host}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _poll_local(self) -> None:
        while not self._stop.wait(self.poll_s):
            for files in self._local:
                files.poll()

    def _read_remote(self, target: FollowTarget, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            parsed = parse_remote_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
            if parsed is not None:
                self._emit(target.host, *parsed)
        code = proc.wait()
        if not self._stop.is_set() and code != 0:
            self._emit(target.host, FOLLOW_TAG, f"following the node's output ended (ssh exit {code})")

    def stop(self, timeout: float = 5.0) -> None:
        """Read what is left (local files, and remote lines still in flight), then end every follower."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._procs:  # lines still in flight from the nodes
            time.sleep(REMOTE_GRACE_S)
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for thread in self._threads:
            thread.join(timeout)
        for proc in self._procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for files in self._local:
            files.poll(final=True)

    def __enter__(self) -> LogFollower:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def stop_beside(follower: LogFollower | None) -> threading.Thread:
    """:meth:`LogFollower.stop` ``follower`` in a thread of its own, started (join it): a remote
    follower waits :data:`REMOTE_GRACE_S` for the lines in flight, which a run's teardown need not wait
    for (the lines it makes its processes write come in meanwhile)."""
    thread = threading.Thread(
        target=follower.stop if follower is not None else lambda: None, name="dit-unfollow", daemon=True
    )
    thread.start()
    return thread


def targets_for(contexts: Mapping[str, Any]) -> list[FollowTarget]:
    """Follow targets from the driver's host contexts (:class:`dit.conditions.HostContext`)."""
    return [
        FollowTarget(host=host, node_root=ctx.node_root, hostvars=dict(ctx.hostvars), local=ctx.local)
        for host, ctx in contexts.items()
    ]
