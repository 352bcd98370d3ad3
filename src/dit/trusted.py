"""Directories dit may trust while it runs as root, and writes that cannot be redirected.

dit runs as root. A directory it writes into, reads back as trusted (a run's identity, a resumed
variant, an inventory naming the interpreter to run) or executes from must be one that nobody but
root could have prepared or can change: owned by root and not writable by group or others, and so
must every directory above it, or another user could rename it away and put their own in its place
(issue 46). A root-owned directory with the sticky bit (``/tmp``, ``/var/tmp``) is accepted as a
*parent* only: there others may create names but not rename or remove root's, so a root-owned child
below it stays root's; a directory dit itself writes into is never such a shared one. When dit runs
as a user other than root, that user's own directories are trusted as root's are (nobody else's).

The walk opens one component at a time with ``O_NOFOLLOW`` relative to the directory above it, so
what is checked is what is opened: a symlink is followed only when root owns it and the directory
holding it is trusted (``/var/run`` → ``/run``), never one another user could have planted or
swapped. Stdlib only: the node side's Ansible modules use this same file (``module_utils/dit_trusted.py``
is a link to it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from collections.abc import Iterator

#: What a directory's mode may not grant: write for its group or for others.
_SHARED_WRITE = 0o022
#: Symlinks followed in one walk before it is refused (the kernel's own limit is 40).
_MAX_LINKS = 40


class UntrustedPath(Exception):
    """A path dit refuses to trust: the message names the path, its owner and mode, and the fix."""


def owner_name(uid: int) -> str:
    """``root (uid 0)``, or ``uid 1234`` for a uid with no passwd entry."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def trusted_owner(uid: int) -> bool:
    """Root, or the user dit runs as: a user who is not root can only trust what is theirs (and root's);
    as root, that is root alone."""
    return uid == 0 or uid == os.geteuid()


def others_can_write(st: os.stat_result) -> bool:
    """Whether anyone but root (or the user dit runs as) owns ``st`` or may write it (group- or
    world-writable)."""
    return not trusted_owner(st.st_uid) or bool(st.st_mode & _SHARED_WRITE)


def _shared_sticky(st: os.stat_result) -> bool:
    """A root-owned sticky directory others may add names to but not take root's away from."""
    return st.st_uid == 0 and bool(st.st_mode & stat.S_ISVTX)


def _refusal(what: str, path: str, shown: str, st: os.stat_result, why: str, fix: str) -> UntrustedPath:
    here = "" if shown == os.path.abspath(path) else f": {shown} above it"
    return UntrustedPath(
        f"{what} {path}{here} is owned by {owner_name(st.st_uid)} with mode "
        f"{stat.S_IMODE(st.st_mode):04o}: {why}. {fix}"
    )


def _fix_for(shown: str) -> str:
    return (
        f"Make it root's and not writable by others (`chown root:root {shown}` and `chmod go-w {shown}`, "
        "after checking what is in it), or choose a path whose every directory is (e.g. under /var/lib/dit)"
    )


def open_trusted_dir(
    path: str | os.PathLike[str], *, what: str, create: bool = False, mode: int = 0o755
) -> int:
    """A file descriptor of directory ``path`` after checking it and every directory above it.

    Each component must be a directory owned by root and not writable by group or others; a
    root-owned sticky directory is allowed above the last. ``create`` makes missing components
    (root's, ``mode``, with no umask widening). Raises :class:`UntrustedPath` naming ``what``
    (for example ``--out`` or ``the runs directory``) and the offending directory,
    :class:`FileNotFoundError` when the path is missing and ``create`` is false, or
    :class:`NotADirectoryError` naming a component that is a file. The caller closes
    the descriptor.
    """
    shown_path = os.fspath(path)
    absolute = os.path.abspath(shown_path)
    pending = [part for part in absolute.split("/") if part]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    where = "/"
    links = 0
    try:
        st = os.fstat(fd)
        if others_can_write(st) and not _shared_sticky(st):
            raise _refusal(
                what, shown_path, "/", st, "the root directory itself is not root's alone", _fix_for("/")
            )
        while pending:
            name = pending.pop(0)
            if name == ".":
                continue
            if name == "..":
                # Walk up by name from the checked path; ".." of "/" is "/".
                where = os.path.dirname(where) or "/"
                os.close(fd)
                fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
                pending = [part for part in where.split("/") if part] + pending
                where = "/"
                continue
            parent_st = os.fstat(fd)
            shown = os.path.join(where, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                # Created root's with the mode asked for, then checked like any other component.
                os.mkdir(name, mode, dir_fd=fd)
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.fchmod(child, mode)
                os.close(child)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if not trusted_owner(st.st_uid) or (
                    others_can_write(parent_st) and not _shared_sticky(parent_st)
                ):
                    raise _refusal(
                        what, shown_path, shown, st, "a link anyone but root could have made or replaced",
                        f"Use the path it points to, once you have checked it ({os.readlink(name, dir_fd=fd)})",
                    )  # fmt: skip
                links += 1
                if links > _MAX_LINKS:
                    raise UntrustedPath(f"{what} {shown_path}: more than {_MAX_LINKS} symbolic links")
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
                    where = "/"
                pending = [part for part in target.split("/") if part] + pending
                continue
            if not stat.S_ISDIR(st.st_mode):  # not a question of trust: the OSError callers already handle
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
            last = not pending
            if not trusted_owner(st.st_uid) or (
                bool(st.st_mode & _SHARED_WRITE) and (last or not _shared_sticky(st))
            ):
                why = (
                    "another user could have prepared it or could replace what dit writes and reads back there"
                    if last
                    else "another user could rename what is below it and put their own in its place"
                )
                raise _refusal(what, shown_path, shown, st, why, _fix_for(shown))
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            if not os.path.samestat(os.fstat(child), st):
                os.close(child)
                raise UntrustedPath(f"{what} {shown_path}: {shown} changed while it was checked; try again")
            os.close(fd)
            fd = child
            where = shown
        final = os.fstat(fd)
        if others_can_write(final):
            raise _refusal(
                what, shown_path, shown_path, final, "others could write into it", _fix_for(shown_path)
            )
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_trusted_dir(
    path: str | os.PathLike[str], *, what: str, create: bool = False, mode: int = 0o755
) -> None:
    """Refuse ``path`` unless it and every directory above it are root's alone (see :func:`open_trusted_dir`)."""
    os.close(open_trusted_dir(path, what=what, create=create, mode=mode))


@contextlib.contextmanager
def trusted_dir(
    path: str | os.PathLike[str], *, what: str, create: bool = False, mode: int = 0o755
) -> Iterator[int]:
    """:func:`open_trusted_dir` as a context manager that closes the descriptor."""
    fd = open_trusted_dir(path, what=what, create=create, mode=mode)
    try:
        yield fd
    finally:
        os.close(fd)


def open_private_append(path: str | os.PathLike[str]) -> int:
    """A descriptor appending to the log ``path``, created 0600 (an existing one narrowed to 0600), never
    through a link at its name: a log names what others must not learn (the edge service's port)."""
    fd = os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600
    )
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_at(dir_fd: int, name: str, data: bytes, *, mode: int = 0o644) -> None:
    """Replace file ``name`` in the directory ``dir_fd`` with ``data``, atomically, following no link.

    The content goes to a new temporary name created with ``O_EXCL | O_NOFOLLOW`` (so a planted
    file or symlink there is never written through), then is renamed over ``name`` (a rename
    replaces a symlink at ``name`` instead of following it).
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a file name: {name!r}")
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_file_nofollow(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """:func:`write_at` for ``path``: its directory is opened without following a link at its last component."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        write_at(dir_fd, name, data, mode=mode)
    finally:
        os.close(dir_fd)
