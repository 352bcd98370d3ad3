"""The run directory: ``runs/<scenario name>/<UTC time>-<hash8>-<random8>/`` and its files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dit.trusted import check_trusted_dir, open_trusted_dir, trusted_dir, write_at

STATUS = "status.json"
DRIVER = "driver.json"
STOP = "STOP"
NOTE = "note.md"  # the researcher's note on the run (a lab notebook entry), plain text
NOTE_MAX_CHARS = 10_000
RANDOM_BYTES = 4  # 32 random bits in every run id
# The states a run ends in; "degraded": every stage completed but a device process failed (status.json
# "degraded" lists them). Every state but "completed" makes `dit run` exit 1.
FINISHED_STATES = ("completed", "degraded", "failed", "stopped")


# What a person can do about the usual reasons a run directory cannot be written.
_REASONS = {
    errno.ENOSPC: "no space left on device: the file system is full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def os_reason(exc: OSError) -> str:
    """Why an OS call failed, in words (``no space left on device: the file system is full``)."""
    return _REASONS.get(exc.errno or 0) or exc.strerror or str(exc)


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def describe_failure(exc: Exception, stage: str | None, run_dir: Path) -> str:
    """One line for a failed stage: an OS error says which file and why in words (a full disk says
    so and where), not ``[Errno 28]``; anything else is its own message."""
    if not isinstance(exc, OSError):
        return str(exc)
    text = (
        str(exc)
        if isinstance(exc, RunDirError)
        else (f"{exc.filename}: " if exc.filename else "") + os_reason(exc)
    )
    if disk_full(exc):
        text += f" (the run directory {run_dir} is on it)"
    return f"{stage}: {text}" if stage else text


class RunDirError(OSError):
    """A run directory's file cannot be read or written. ``str()`` is one line naming the file and
    the reason; it stays an :class:`OSError` (errno, filename) for the callers that handle those."""

    def __init__(self, path: Path, action: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror, str(path))
        self.action = action
        self.reason = os_reason(cause)

    def __str__(self) -> str:
        return f"{self.filename}: cannot {self.action}: {self.reason}"


def write_json(path: Path, data: Any, *, what: str = "the run directory", mode: int = 0o644) -> None:
    """Write JSON atomically (rename over the old file); :class:`RunDirError` names ``path`` when
    it cannot be written, and no half-written temporary file is left beside it. The directory must
    be trusted (:class:`UntrustedPath` otherwise, see :func:`write_text`)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", what=what, mode=mode)


def write_text(path: Path, text: str, *, what: str = "the run directory", mode: int = 0o644) -> None:
    """Write ``text`` atomically, as :func:`write_json` writes JSON.

    dit reads back what it writes in a run directory (its identity, its status, the inventory it
    runs with), as root: the directory and every one above it must be root's alone, or
    :class:`UntrustedPath` names ``what`` and the fix, and nothing is written. The file goes to a new
    temporary name that follows no link, with ``mode``, then is renamed over ``path`` (issue 46).
    """
    try:
        with trusted_dir(path.parent, what=what) as dir_fd:
            write_at(dir_fd, path.name, text.encode("utf-8"), mode=mode)
    except OSError as exc:
        raise RunDirError(path, "write", exc) from None


def read_json(path: Path) -> Any:
    """A JSON file's content; :class:`RunDirError` names ``path`` when it cannot be read (invalid
    JSON raises ``ValueError``, as before)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunDirError(path, "read", exc) from None
    return json.loads(text)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file's content, or ``{}`` when it is missing, unreadable or not an object (a
    report shows what a run has, a failed run's files may be absent)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def runs_under(root: Path) -> list[Path]:
    """The run directories (with ``status.json``) directly under ``root``, else one level deeper (a
    runs directory holds ``<scenario>/<run>``), sorted; SystemExit naming ``root`` when there is none."""
    found = sorted(p.parent for p in root.glob(f"*/{STATUS}")) or sorted(
        p.parent for p in root.glob(f"*/*/{STATUS}")
    )
    if not found:
        raise SystemExit(f"no run directories under {root}")
    return found


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        # Absolute, always: ansible-runner runs each stage from its own project directory, so a
        # relative run directory (the default `runs/`) would point the stages at nothing.
        object.__setattr__(self, "path", Path(self.path).resolve())

    @classmethod
    def create(cls, runs_root: Path, name: str, scenario_hash: str) -> RunDir:
        """A new run directory under ``runs_root/name``, made by walking down from ``/`` so that no
        directory another user owns or can write is on the way (:class:`UntrustedPath`)."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        parent = runs_root / name
        try:
            parent_fd = open_trusted_dir(parent, what="the runs directory", create=True)
        except OSError as exc:
            raise RunDirError(parent, "create the directory", exc) from None
        try:
            # The run id (scenario name + this directory's name) tags every process, cgroup and node
            # directory of the run, and nodes are shared: two runs of one scenario started in the same
            # second from different runs directories must still differ, hence the random part.
            base = f"{stamp}-{scenario_hash[:8]}-{secrets.token_hex(RANDOM_BYTES)}"
            for attempt in range(1, 1000):
                leaf = base if attempt == 1 else f"{base}-{attempt}"
                candidate = parent / leaf
                try:
                    os.mkdir(leaf, 0o755, dir_fd=parent_fd)
                    run_fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
                except FileExistsError:
                    continue
                except OSError as exc:
                    raise RunDirError(candidate, "create the run directory", exc) from None
                try:
                    for sub in ("raw", "aggregate", "ansible", "optimise"):
                        try:
                            os.mkdir(sub, 0o755, dir_fd=run_fd)
                        except OSError as exc:
                            raise RunDirError(candidate / sub, "create the directory", exc) from None
                finally:
                    os.close(run_fd)
                return cls(candidate)
        finally:
            os.close(parent_fd)
        raise RunDirError(parent, "create a run directory", FileExistsError(errno.EEXIST, "999 names taken"))

    def check_trusted(self) -> None:
        """Refuse (:class:`UntrustedPath`) a run directory another user owns or could write, or one
        below such a directory: its identity files, inventory and journal could be theirs, and
        root would act on them."""
        check_trusted_dir(self.path, what="the run directory")

    @property
    def run_id(self) -> str:
        """The tag every process of the run carries (``DIT_RUN_ID``)."""
        return f"{self.path.parent.name}-{self.path.name}"

    @property
    def journal(self) -> Path:
        return self.path / "journal.jsonl"

    @property
    def log(self) -> Path:
        return self.path / "run.log"

    def status(self) -> dict[str, Any]:
        path = self.path / STATUS
        return dict(read_json(path)) if path.exists() else {}

    def set_status(self, **fields: Any) -> None:
        """Update ``status.json``; :class:`RunDirError` when it cannot be written (a full disk)."""
        try:
            status = self.status()
        except (OSError, ValueError, TypeError):  # a torn or hand-edited file: kept aside, written anew
            broken = self.path / STATUS
            try:
                broken.replace(broken.with_name(STATUS + ".unreadable"))
            except OSError as exc:
                raise RunDirError(broken, "set the unreadable file aside", exc) from None
            status = {}
        if not isinstance(status, dict):
            status = {}
        status.update(fields)
        status["updated_wall_ns"] = time.time_ns()
        write_json(self.path / STATUS, status)

    def try_set_status(self, **fields: Any) -> str | None:
        """:meth:`set_status` where the run must go on without it (teardown): the error, or None."""
        try:
            self.set_status(**fields)
        except OSError as exc:
            return str(exc)
        return None

    def note(self) -> str:
        """The run's note (``note.md``): "" when it has none or it cannot be read."""
        try:
            return (self.path / NOTE).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return ""

    def set_note(self, text: str) -> None:
        """Write the run's note (an empty text removes it). ``ValueError`` for a note over
        :data:`NOTE_MAX_CHARS` or with a NUL; :class:`RunDirError` when it cannot be written."""
        if len(text) > NOTE_MAX_CHARS:
            raise ValueError(f"note: {len(text)} characters, at most {NOTE_MAX_CHARS}")
        if "\x00" in text:
            raise ValueError("note: a NUL character is not text")
        path = self.path / NOTE
        if not text.strip():
            try:
                with trusted_dir(self.path, what="the run directory") as dir_fd:
                    os.unlink(NOTE, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise RunDirError(path, "remove", exc) from None
            return
        write_text(path, text if text.endswith("\n") else text + "\n")

    def stop_requested(self) -> bool:
        return (self.path / STOP).exists()

    def request_stop(self, discard_results: bool = False) -> None:
        """Write ``STOP`` (``dit stop``); the driver tears down at its next check. :class:`RunDirError`
        when it cannot be written."""
        write_json(self.path / STOP, {"t_wall_ns": time.time_ns(), "discard_results": discard_results})

    def discard_requested(self) -> bool:
        """``dit stop --discard-results``: teardown deletes the results it cannot fetch."""
        try:
            request = json.loads((self.path / STOP).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False  # no STOP file (a signal, a failure), or an older dit's timestamp: keep them
        return isinstance(request, dict) and request.get("discard_results") is True


def check_writable(runs_root: Path, *, what: str = "the runs directory") -> None:
    """Refuse a runs directory before anything starts: :class:`UntrustedPath` when another user
    owns or could write it or a directory above it (they could swap a run directory for theirs,
    inventory included, while root runs it), :class:`RunDirError` naming it when this process
    cannot write it (read-only, full, not a directory). A missing one is made root's, 0755."""
    if runs_root.exists() and not runs_root.is_dir():
        raise RunDirError(runs_root, "use it", NotADirectoryError(errno.ENOTDIR, "not a directory"))
    try:
        root_fd = open_trusted_dir(runs_root, what=what, create=True)
    except OSError as exc:
        raise RunDirError(runs_root, "create the runs directory", exc) from None
    probe = f".dit-write-check-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=root_fd))
    except OSError as exc:
        raise RunDirError(runs_root, "write in the runs directory", exc) from None
    else:
        with contextlib.suppress(OSError):  # the check is done; a leftover probe harms nothing
            os.unlink(probe, dir_fd=root_fd)
    finally:
        os.close(root_fd)


def find_runs(runs_root: Path) -> list[RunDir]:
    if not runs_root.is_dir():
        return []
    found = [RunDir(p.parent) for p in runs_root.glob(f"*/*/{STATUS}")]
    return sorted(found, key=lambda r: r.path.name)
