"""The trusted-directory walk and the no-follow writes (issue 46): as root, with a nobody-owned tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dit.trusted import UntrustedPath, check_trusted_dir, trusted_dir, write_at, write_file_nofollow

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown to another user")


@pytest.fixture
def root_dir(tmp_path: Path) -> Path:
    """A directory of root's whose parents (pytest's basetemp under /tmp) are root's or sticky."""
    base = tmp_path / "trusted"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    return base


def test_root_owned_chain_is_trusted_and_created(root_dir: Path) -> None:
    check_trusted_dir(root_dir, what="--out")
    made = root_dir / "a" / "b"
    check_trusted_dir(made, what="--out", create=True, mode=0o700)
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700


def test_missing_without_create_is_not_found(root_dir: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check_trusted_dir(root_dir / "absent", what="--out")


def test_directory_owned_by_another_user_is_refused_naming_it(root_dir: Path) -> None:
    planted = root_dir / "dit"
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UntrustedPath, match=r"the runs directory .*dit is owned by nobody \(uid 65534\)"):
        check_trusted_dir(planted, what="the runs directory")
    # ... and as a parent of what dit would create below it, even with root's child inside
    child = planted / "run"
    child.mkdir()
    with pytest.raises(UntrustedPath, match=r"dit above it is owned by nobody"):
        check_trusted_dir(child, what="the run directory")


def test_group_or_world_writable_is_refused(root_dir: Path) -> None:
    shared = root_dir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)
    with pytest.raises(UntrustedPath, match="mode 0775"):
        check_trusted_dir(shared, what="--out")


def test_sticky_root_dir_is_a_parent_but_never_the_directory_written(root_dir: Path) -> None:
    sticky = root_dir / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    with pytest.raises(UntrustedPath, match="mode 1777"):
        check_trusted_dir(sticky, what="--out")
    check_trusted_dir(sticky / "mine", what="--out", create=True)
    theirs = sticky / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedPath, match="owned by nobody"):
        check_trusted_dir(theirs / "run", what="--out", create=True)
    assert not (theirs / "run").exists()


def test_a_link_another_user_made_is_never_followed(root_dir: Path) -> None:
    target = root_dir / "target"
    target.mkdir()
    sticky = root_dir / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    link = sticky / "out"
    link.symlink_to(target)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(UntrustedPath, match="a link anyone but root could have made"):
        check_trusted_dir(link, what="--out")
    # root's own link in a trusted directory is followed (as /var/run -> /run)
    (root_dir / "alias").symlink_to(target)
    with trusted_dir(root_dir / "alias", what="--out") as fd:
        assert os.path.samestat(os.fstat(fd), target.stat())


def test_write_at_never_writes_through_a_planted_symlink(root_dir: Path) -> None:
    victim = root_dir / "victim"
    victim.write_text("root's\n")
    (root_dir / "note.md").symlink_to(victim)
    for name in os.listdir(root_dir):
        assert not name.endswith(".tmp")
    write_file_nofollow(root_dir / "note.md", b"note\n")
    assert victim.read_text() == "root's\n"
    assert not (root_dir / "note.md").is_symlink() and (root_dir / "note.md").read_text() == "note\n"
    with trusted_dir(root_dir, what="x") as fd:
        write_at(fd, "status.json", b"{}", mode=0o600)
    assert ((root_dir / "status.json").stat().st_mode & 0o777) == 0o600
    assert sorted(os.listdir(root_dir)) == ["note.md", "status.json", "victim"]


def test_a_relative_path_is_named_as_itself_not_as_a_directory_above_it(
    root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root_dir / "runs").mkdir()
    os.chown(root_dir / "runs", NOBODY, NOBODY)
    monkeypatch.chdir(root_dir)
    with pytest.raises(UntrustedPath) as refused:
        check_trusted_dir("runs", what="--runs-dir")
    assert str(refused.value).startswith("--runs-dir runs is owned by nobody"), refused.value
