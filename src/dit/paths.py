"""Where the Ansible content and the shipped scenarios live (source checkout or installed wheel)."""

from __future__ import annotations

from pathlib import Path


def content_root() -> Path:
    """The directory holding ``playbooks/``, ``roles/``, ``library/`` … and ``scenarios/``.

    In an installed wheel they are shipped under ``dit/_content``; in a source checkout they sit at
    the repository root, two levels above this package.
    """
    here = Path(__file__).resolve().parent
    packaged = here / "_content"
    if packaged.is_dir():
        return packaged
    return here.parent.parent
