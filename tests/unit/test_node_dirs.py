"""What dit makes, reads and runs on a node is in directories only root can have prepared (issue 46,
item 1): the run directory (dit_node), the lease's (dit_lease, local mode's lease directory) and the
zipapp dit runs (dit_procs.spawn with ``verify``). As root, with trees that ``nobody`` owns."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dit.ansible_plugins.processes import verify_zipapp
from dit.run.lease_decision import LOCAL_LEASE_DIR_ENV, local_lease_dir
from dit.trusted import UntrustedPath
from tests.ansible_modules import MODULE_UTILS, library_module, module_util, run_in_process
from tests.conftest import REPO

NOBODY = 65534
PYZ = "dit-device.pyz"

procs = module_util("dit_procs")  # its UntrustedPath is module_utils/dit_trusted.py's: the same file


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
    content = base64.b64encode(payload).decode()
    files = [{"name": PYZ, "content": content, "sha256": hashlib.sha256(payload).hexdigest()}]
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


def test_shipped_content_travels_in_the_arguments_checked_and_never_logged(base: Path) -> None:
    """The action plugin puts what it ships into the module's arguments (one round trip to the node):
    the module checks each file's SHA-256 before writing it, and the run's key never shows in the
    task's result (its invocation is what ansible-runner's events and run.log keep)."""
    path = base / "lib" / "dit" / "run-1"
    key = b"the run's signing key 0123456789abcdef"
    content = base64.b64encode(key).decode()
    wrong = [{"name": "edge.key", "content": content, "sha256": hashlib.sha256(b"other").hexdigest()}]
    refused = run_in_process(
        library_module("dit_node"), {"path": str(path), "run_id": "run-1", "files": wrong}
    )
    assert (
        refused.get("failed")
        and "edge.key: the shipped content does not have the expected SHA-256" in refused["msg"]
    )
    assert not (path / "edge.key").exists()

    right = [{"name": "edge.key", "content": content, "sha256": hashlib.sha256(key).hexdigest()}]
    made = run_in_process(library_module("dit_node"), {"path": str(path), "run_id": "run-1", "files": right})
    assert made["shipped"] == ["edge.key"] and (path / "edge.key").read_bytes() == key
    assert (path / "edge.key").stat().st_mode & 0o777 == 0o600
    assert made["invocation"]["module_args"]["files"][0]["content"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    assert content not in json.dumps(made)


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


# -- what dit runs (module_utils/dit_procs.py spawn with verify) ------------------------------------------
SHIPPED = "import sys\nopen(sys.argv[1], 'w').write('shipped')\n"
TROJAN = "import sys\nopen(sys.argv[1], 'w').write('trojan')\n"


def ship(directory: Path) -> tuple[Path, str]:
    pyz = directory / PYZ
    pyz.write_text(SHIPPED)
    os.chmod(pyz, 0o644)
    return pyz, hashlib.sha256(SHIPPED.encode()).hexdigest()


def run_verified(pyz: Path, sha256: str, marker: Path) -> str:
    """Start ``pyz`` as dit_proc does, wait for it, and say what it wrote ("" for nothing)."""
    logs = pyz.parent
    proc = procs.spawn(
        [sys.executable, str(pyz), str(marker)],
        {"PATH": os.environ.get("PATH", "")},
        str(logs),
        str(logs / "out.log"),
        str(logs / "err.log"),
        verify={str(pyz): sha256},
    )
    assert proc.wait(timeout=30) == 0, (logs / "err.log").read_text()
    return marker.read_text() if marker.exists() else ""


def test_a_zipapp_replaced_after_it_was_shipped_is_refused_naming_both_hashes(base: Path) -> None:
    pyz, sha256 = ship(base)
    trojan = base / "trojan"
    trojan.write_text(TROJAN)
    os.replace(trojan, pyz)
    marker = base / "ran"
    found = hashlib.sha256(TROJAN.encode()).hexdigest()
    with pytest.raises(procs.UntrustedPath, match=f"{pyz} has SHA-256 {found}, not the {sha256} shipped"):
        run_verified(pyz, sha256, marker)
    time.sleep(0.2)
    assert not marker.exists()  # the attacker's file never ran


def test_a_zipapp_swapped_after_the_check_is_harmless_it_runs_from_the_checked_descriptor(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyz, sha256 = ship(base)
    real = procs._spawn

    def swap_then_spawn(argv: list[str], *args: Any) -> Any:
        trojan = base / "trojan"
        trojan.write_text(TROJAN)
        os.replace(trojan, pyz)  # between the hash and the exec
        assert argv[1].startswith("/proc/self/fd/")
        return real(argv, *args)

    monkeypatch.setattr(procs, "_spawn", swap_then_spawn)
    assert run_verified(pyz, sha256, base / "ran") == "shipped"


def test_a_link_a_writable_file_or_a_directory_another_user_owns_is_never_run(base: Path) -> None:
    pyz, sha256 = ship(base)
    os.chmod(pyz, 0o666)
    with pytest.raises(procs.UntrustedPath, match="mode 0666"):
        run_verified(pyz, sha256, base / "ran")
    os.chmod(pyz, 0o644)
    link = base / "link"
    link.mkdir()
    (link / PYZ).symlink_to(pyz)
    with pytest.raises(procs.UntrustedPath, match="is a symbolic link"):
        run_verified(link / PYZ, sha256, base / "ran")
    theirs = nobodys(base / "theirs")
    their_pyz, _ = ship(theirs)
    with pytest.raises(procs.UntrustedPath, match=f"the run directory {theirs} is owned by nobody"):
        run_verified(their_pyz, sha256, base / "ran")
    assert not (base / "ran").exists()


def test_the_action_plugins_verify_every_argv_naming_the_zipapp() -> None:
    argvs = [["/usr/bin/python3", f"/var/lib/dit/r1/{PYZ}", "monitor"], ["/usr/bin/tc", "qdisc"], None]
    digest = "a" * 64
    assert verify_zipapp({"tag": "x"}, argvs, {"dit_device_pyz_sha256": digest}) == {
        "tag": "x",
        "verify": {f"/var/lib/dit/r1/{PYZ}": digest},
    }
    assert verify_zipapp({"tag": "x"}, argvs, {}) == {"tag": "x"}  # outside a dit run: as before


def test_the_nodes_walk_is_the_controllers_own_file() -> None:
    """module_utils/dit_trusted.py is a link to src/dit/trusted.py, not a copy that could drift."""
    assert (MODULE_UTILS / "dit_trusted.py").samefile(REPO / "src" / "dit" / "trusted.py")
