"""What dit makes, reads and runs on a node is in directories only root can have prepared (issue 46,
item 1): the run directory (dit_node), the lease's (dit_lease, local mode's lease directory) and a
runtime's (dit_trusted_dir). As root, with trees that ``nobody`` owns."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from dit.run.lease_decision import LOCAL_LEASE_DIR_ENV, local_lease_dir
from dit.trusted import UntrustedPath
from tests.ansible_modules import MODULE_UTILS, library_module, run_in_process
from tests.conftest import REPO

NOBODY = 65534
PYZ = "dit-device.pyz"


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A directory of root's, mode 0755, whose parents (pytest's basetemp) are root's too."""
    if os.geteuid() != 0:
        pytest.skip("needs root: chown to another user")
    path = tmp_path / "node"
    path.mkdir()
    os.chmod(path, 0o755)
    return path


def nobodys(path: Path, mode: int = 0o755) -> Path:
    path.mkdir()
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, mode)
    return path


# -- the run directory (library/dit_node.py) ---------------------------------------------------------
def test_a_run_directory_below_a_dit_directory_another_user_owns_is_refused_and_nothing_is_made(
    base: Path,
) -> None:
    dit = nobodys(base / "dit")
    result = run_in_process(library_module("dit_node"), {"path": str(dit / "run-1"), "run_id": "run-1"})
    assert result.get("failed"), result
    message = result["msg"]
    assert f"the node's run directory {dit}/run-1: {dit} above it is owned by nobody (uid 65534)" in message
    assert f"chown root:root {dit}" in message  # the fix, in the same sentence's sequel
    assert list(dit.iterdir()) == []


def test_a_world_writable_parent_without_the_sticky_bit_is_refused(base: Path) -> None:
    shared = base / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    result = run_in_process(
        library_module("dit_node"), {"path": str(shared / "dit" / "run-1"), "run_id": "run-1"}
    )
    assert result.get("failed") and "mode 0777" in result["msg"], result
    assert list(shared.iterdir()) == []


def test_a_run_directory_is_made_root_s_and_a_shipped_file_never_written_through_a_link(base: Path) -> None:
    path = base / "lib" / "dit" / "run-1"
    payload = b"print('shipped')\n"
    transferred = base / "transferred"
    transferred.write_bytes(payload)
    files = [{"name": PYZ, "tmp": str(transferred), "sha256": hashlib.sha256(payload).hexdigest()}]
    args = {"path": str(path), "run_id": "run-1", "files": files}

    made = run_in_process(library_module("dit_node"), args)
    assert made["changed"] and made["shipped"] == [PYZ], made
    for directory in (base / "lib", base / "lib" / "dit", path, path / "results", path / "logs"):
        st = directory.stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755), directory
    assert (path / ".dit-run").read_text() == "run-1\n"
    assert (path / PYZ).read_bytes() == payload

    # links put where the shipped file goes, and where a fixed temporary name would be, are never
    # written through: what they point at is left alone
    victim = base / "victim"
    victim.write_text("root's own file")
    (path / PYZ).unlink()
    (path / PYZ).symlink_to(victim)
    (path / f"{PYZ}.tmp").symlink_to(victim)
    again = run_in_process(library_module("dit_node"), args)
    assert again["shipped"] == [PYZ], again
    assert victim.read_text() == "root's own file"
    assert not (path / PYZ).is_symlink() and (path / PYZ).read_bytes() == payload


def test_a_runtime_s_node_directory_is_refused_below_another_user_s_and_made_root_s_otherwise(
    base: Path,
) -> None:
    """library/dit_trusted_dir.py: where a runtime's plays put the files they ship and run."""
    theirs = nobodys(base / "dit")
    refused = run_in_process(library_module("dit_trusted_dir"), {"path": str(theirs / "headsplit" / "files")})
    assert refused.get("failed") and f"{theirs} above it is owned by nobody (uid 65534)" in refused["msg"]
    assert list(theirs.iterdir()) == []
    files = base / "lib" / "dit" / "headsplit" / "files"
    checked = run_in_process(
        library_module("dit_trusted_dir"), {"path": str(files), "_ansible_check_mode": True}
    )
    assert checked["changed"] and not (base / "lib").exists()
    made = run_in_process(library_module("dit_trusted_dir"), {"path": str(files)})
    assert made["changed"] and (files.stat().st_uid, files.stat().st_mode & 0o7777) == (0, 0o755)
    assert run_in_process(library_module("dit_trusted_dir"), {"path": str(files)})["changed"] is False


# -- the lease (library/dit_lease.py, local mode's lease directory) ------------------------------------
def test_a_lease_planted_in_a_directory_another_user_owns_is_refused_before_it_is_read(base: Path) -> None:
    planted_dir = nobodys(base / "lease")
    planted = planted_dir / "lease.json"
    planted.write_text('{"run_id": "forged", "controller_host": "x", "controller_pid": 1}\n')
    holder = {"run_id": "run-1", "controller_host": "here", "controller_pid": os.getpid()}
    args: dict[str, Any] = {"path": str(planted), "run_id": "run-1", "holder": holder}
    for plan in (True, False):  # the action plugin's look, and the take itself
        result = run_in_process(library_module("dit_lease"), {**args, "_dit_plan": plan})
        assert result.get("failed"), result
        assert f"the node's lease directory {planted_dir} is owned by nobody (uid 65534)" in result["msg"]
        assert "current" not in result  # the planted lease was not read
    assert planted.read_text().startswith('{"run_id": "forged"')


def test_local_mode_refuses_a_lease_directory_another_user_owns(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = nobodys(base / "lease")
    monkeypatch.setenv(LOCAL_LEASE_DIR_ENV, str(planted))
    with pytest.raises(
        UntrustedPath, match=rf"local mode's lease directory \(DIT_LOCAL_LEASE_DIR\) {planted} is "
    ):
        local_lease_dir()
    # one still to be made below a directory of root's passes: dit_lease makes it root's
    monkeypatch.setenv(LOCAL_LEASE_DIR_ENV, str(base / "new" / "lease"))
    assert local_lease_dir() == str(base / "new" / "lease")


def test_the_nodes_walk_is_the_controllers_own_file() -> None:
    """module_utils/dit_trusted.py is a link to src/dit/trusted.py, not a copy that could drift."""
    assert (MODULE_UTILS / "dit_trusted.py").samefile(REPO / "src" / "dit" / "trusted.py")
