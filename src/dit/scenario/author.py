"""The scenario's author, and whether they could read the files the scenario names.

dit runs as root, so it can read any file a scenario names; a run then copies what it read to places
others may read (a HeadSplit paragraph into the node's ``headsplit.json``, a profile's costs beside it).
A path input is therefore held to what the scenario's author could read: the owner of the scenario file
(anyone who may write to it, when others may), or the user validating a document that came from no
file. Fields that name files on the machine running dit say so in the schema with ``x-readable``
(docs/runtimes.md): the relative paths below the named one that are read (``.``: the path itself,
``**``: everything below it too).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Cap on the files checked below one ``**`` path (a checkpoint directory holds a few dozen).
MAX_TREE_FILES = 10_000


@dataclass(frozen=True)
class Author:
    """Whose read permission a scenario's path inputs are held to.

    ``uid`` None: no particular user (a scenario file others may write): only what every user of
    ``gids`` (group-writable file) or everyone (world-writable) may read passes."""

    uid: int | None
    gids: frozenset[int]
    who: str  # how a message names them: "nobody (the owner of the scenario file)"

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    @classmethod
    def current(cls) -> Author:
        """The user running dit (a document that came from no file: its author is whoever passes it)."""
        uid = os.geteuid()
        return cls(uid, frozenset({os.getegid(), *os.getgroups()}), f"{_user_name(uid)} (who runs dit)")

    @classmethod
    def of_stat(cls, st: os.stat_result) -> Author:
        """The author of a scenario file of this status: its owner, unless others may write to it."""
        if st.st_mode & stat.S_IWOTH:
            return cls(None, frozenset(), "any user (the scenario file is writable by others)")
        if st.st_mode & stat.S_IWGRP and _members(st.st_gid) - {st.st_uid}:  # not a user-private group
            group = _group_name(st.st_gid)
            return cls(
                None, frozenset({st.st_gid}), f"any member of {group} (the scenario file is group-writable)"
            )
        return cls(
            st.st_uid, _groups_of(st.st_uid), f"{_user_name(st.st_uid)} (the owner of the scenario file)"
        )


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def _members(gid: int) -> set[int]:
    """The users of group ``gid``: those it is the primary group of and its listed members."""
    users = {entry.pw_uid for entry in pwd.getpwall() if entry.pw_gid == gid}
    try:
        names = grp.getgrgid(gid).gr_mem
    except KeyError:
        return users
    for name in names:
        try:
            users.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return users


def _groups_of(uid: int) -> frozenset[int]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    return frozenset({entry.pw_gid, *(g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem)})


def _bits(st: os.stat_result, author: Author) -> int:
    """The rwx bits (as ``0o7``) of ``st`` that apply to ``author`` (ACLs are not consulted)."""
    mode = stat.S_IMODE(st.st_mode)
    if author.uid is not None and st.st_uid == author.uid:
        return (mode >> 6) & 7
    if st.st_gid in author.gids:
        return (mode >> 3) & 7
    return mode & 7


def _show(path: Path, st: os.stat_result) -> str:
    return f"{path} is {stat.filemode(st.st_mode)} {_user_name(st.st_uid)}:{_group_name(st.st_gid)}"


def _parents(path: Path) -> Iterator[Path]:
    """The directories above ``path`` from the root down: as written (absolute) and resolved, so that a
    symbolic link is held to both where it is and where it leads."""
    seen: set[Path] = set()
    for full in (Path(os.path.abspath(path)), path.resolve()):
        for parent in reversed(full.parents):
            if parent not in seen:
                seen.add(parent)
                yield parent


def _walk(root: Path) -> Iterator[Path]:
    """Everything below ``root``, at most :data:`MAX_TREE_FILES` entries (os.walk does not follow the
    links below it; each is checked where it leads by :func:`_unreadable`)."""
    count = 0
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            count += 1
            if count > MAX_TREE_FILES:
                return
            yield Path(top) / name


def _unreadable(path: Path, author: Author) -> str | None:
    """Where ``author`` is stopped reading ``path`` (a file: r; a directory: r and x; above it: x)."""
    for parent in _parents(path):
        st = parent.stat()
        if not _bits(st, author) & 1:
            return _show(parent, st)
    st = path.stat()
    need = 5 if stat.S_ISDIR(st.st_mode) else 4
    return None if _bits(st, author) & need == need else _show(path, st)


def problem(value: str, reads: Sequence[str], author: Author) -> str | None:
    """Why ``author`` could not read what a field naming ``value`` reads, or None. ``reads`` is the
    field's ``x-readable``: paths relative to ``value``, ``.`` for itself and ``**`` for itself and
    everything below it. A path that does not exist is no problem here: what reads it says so."""
    if author.is_root:
        return None
    base = Path(value).expanduser()  # as the code that reads it expands it
    for rel in reads:
        target = base if rel in (".", "**") else base / rel
        try:
            for item in (target, *(_walk(target) if rel == "**" else ())):
                where = _unreadable(item, author)
                if where is not None:
                    fix = (
                        "name a file the scenario's author can read"
                        if author.uid is not None
                        else "name a file they all can read, or let only its owner write the scenario file"
                    )
                    return f"{value}: {author.who} cannot read it ({where}); {fix}"
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{value}: {exc.strerror or exc}"
    return None
