"""The memory condition for real on this machine: the cgroup_memory role creates a limited cgroup
(journaled), a process placed in it that outgrows the limit is stopped, and the teardown stage
removes the cgroup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dit.conditions.cgroup_roots import cgroup_memory_root
from dit.run.ansible_exec import ansible_env, run_stage
from dit.run.journal import Journal

LIMIT_MB = 64
ALLOCATE_MB = 256

HOG = f"""
import sys
try:
    block = bytearray({ALLOCATE_MB} << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touch every page: the memory is really used
except MemoryError:
    sys.exit(3)
print("allocated", flush=True)
"""


def _memory_root() -> Path:
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root")
    root = Path(cgroup_memory_root())
    if not (root / "cgroup.controllers").exists() and not (root / "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup memory controller at {root}")
    if (root / "cgroup.controllers").exists() and "memory" not in (
        root / "cgroup.subtree_control"
    ).read_text():
        pytest.skip(f"the memory controller is not enabled for the children of {root}")
    return root


def _converge(tmp_path: Path, journal: Path, cgroup: Path) -> None:
    """Apply the cgroup_memory role to this machine, as the apply stage does (journal first)."""
    playbook = tmp_path / "apply.yml"
    playbook.write_text(
        "- hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - ansible.builtin.include_role:\n"
        "        name: cgroup_memory\n"
        "      vars:\n"
        f"        cgroup_memory_path: {cgroup}\n"
        f"        cgroup_memory_limit_bytes: {LIMIT_MB << 20}\n"
        "        cgroup_memory_field: hardware.device1.memory_limit_mb\n",
        encoding="utf-8",
    )
    extra = {"dit_journal_path": str(journal), "ansible_python_interpreter": sys.executable}
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            json.dumps(extra),
            str(playbook),
        ],
        env={**os.environ, **ansible_env()},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_a_process_that_outgrows_its_cgroup_is_stopped_and_teardown_removes_the_cgroup(
    tmp_path: Path,
) -> None:
    root = _memory_root()
    run_id = f"itest-cgroup-{uuid.uuid4().hex[:8]}"
    cgroup = root / f"dit-{run_id}-localhost"
    journal = tmp_path / "journal.jsonl"
    _converge(tmp_path, journal, cgroup)

    assert cgroup.is_dir()
    limit_file = "memory.max" if (root / "cgroup.controllers").exists() else "memory.limit_in_bytes"
    assert int((cgroup / limit_file).read_text()) == LIMIT_MB << 20
    (change,) = Journal(journal).pending()
    assert (change.host, change.op, dict(change.undo)) == ("localhost", "cgroup", {"path": str(cgroup)})

    def join() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()), encoding="ascii")

    hog = subprocess.Popen(
        [sys.executable, "-c", HOG],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=join,  # noqa: PLW1509 - only joins the cgroup
        env={**os.environ, "DIT_RUN_ID": run_id, "DIT_HOST": "localhost", "DIT_TAG": "hog"},
    )
    out, err = hog.communicate(timeout=120)
    # Stopped by the limit: killed by the OOM killer (SIGKILL) or refused with MemoryError.
    assert hog.returncode in (-signal.SIGKILL, 3), (hog.returncode, out, err)
    assert "allocated" not in out

    # Teardown through the real teardown stage (dit_restore replays the journal newest first).
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {"localhost": {}},
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                }
            }
        ),
        encoding="utf-8",
    )
    outcome = run_stage(
        "teardown",
        tmp_path / "teardown",
        str(inventory),
        "localhost",
        {
            "dit_run_id": run_id,
            "dit_journal_path": str(journal),
            "dit_undo": Journal(journal).pending_by_host(),
        },
        lambda event: None,
        lambda: False,
        forks=1,
    )
    assert outcome.ok and not outcome.failures(), [e.message() for e in outcome.failures()]
    assert not cgroup.exists()
