"""The CPU share condition for real on this machine: the cgroup_cpu role creates a CPU-capped cgroup
(journaled), a busy loop placed in a 30 % share gets 30 % of a CPU, and the teardown stage leaves
the cgroup tree as it found it.

A behaviour test, not a performance target: the loop's CPU time over about 2.5 s of wall time,
from ``/proc`` (psutil), within 2 points of the share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dit.conditions.cgroup_roots import cgroup_cpu_root
from dit.run.ansible_exec import ansible_env, run_stage
from dit.run.journal import Journal
from dit.run.localmode import cpu_quota_usable

SHARE_PCT = 30
BUSY = "while True:\n    pass\n"


def _cpu_root() -> Path:
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root")
    if not cpu_quota_usable():
        pytest.skip("no cpu cgroup controller with CFS bandwidth control here")
    return Path(cgroup_cpu_root())


def _tree(root: Path) -> list[str]:
    """Every cgroup directory under ``root`` (the hierarchy's shape, not its counters)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir())


def _converge(tmp_path: Path, journal: Path, cgroup: Path) -> None:
    """Apply the cgroup_cpu role to this machine, as the apply stage does (journal first)."""
    playbook = tmp_path / "apply.yml"
    playbook.write_text(
        "- hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - ansible.builtin.include_role:\n"
        "        name: cgroup_cpu\n"
        "      vars:\n"
        f"        cgroup_cpu_path: {cgroup}\n"
        f"        cgroup_cpu_quota_us: {SHARE_PCT * 1000}\n"
        "        cgroup_cpu_field: hardware.device1.cpu_share_pct\n",
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


def _teardown(tmp_path: Path, run_id: str, journal: Path) -> None:
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


@pytest.mark.serial  # the share is measured: alone, after the parallel pass
def test_a_busy_loop_in_a_30_percent_share_gets_30_percent_and_teardown_restores_the_tree(
    tmp_path: Path,
) -> None:
    psutil = pytest.importorskip("psutil")
    root = _cpu_root()
    before = _tree(root)
    run_id = f"itest-cpu-{uuid.uuid4().hex[:8]}"
    cgroup = root / f"dit-{run_id}-localhost"
    journal = tmp_path / "journal.jsonl"
    _converge(tmp_path, journal, cgroup)
    try:
        assert cgroup.is_dir()
        if (root / "cgroup.controllers").exists():
            assert (cgroup / "cpu.max").read_text().split() == [str(SHARE_PCT * 1000), "100000"]
        else:
            assert int((cgroup / "cpu.cfs_quota_us").read_text()) == SHARE_PCT * 1000
            assert int((cgroup / "cpu.cfs_period_us").read_text()) == 100_000
            if (cgroup / "cpu.rt_runtime_us").exists():  # the agent's SCHED_FIFO start wait needs a budget
                assert int((cgroup / "cpu.rt_runtime_us").read_text()) > 0
        (change,) = Journal(journal).pending()
        assert (change.op, dict(change.undo)) == ("cgroup", {"path": str(cgroup)})

        def join() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()), encoding="ascii")

        busy = subprocess.Popen(
            [sys.executable, "-c", BUSY],
            preexec_fn=join,  # noqa: PLW1509 - only joins the cgroup
            env={**os.environ, "DIT_RUN_ID": run_id, "DIT_HOST": "localhost", "DIT_TAG": "busy"},
        )
        try:
            proc = psutil.Process(busy.pid)
            time.sleep(0.5)  # past interpreter start-up
            cpu0, wall0 = sum(proc.cpu_times()[:2]), time.monotonic()
            time.sleep(2.5)
            cpu1, wall1 = sum(proc.cpu_times()[:2]), time.monotonic()
        finally:
            busy.kill()
            busy.wait(timeout=30)
        share = 100 * (cpu1 - cpu0) / (wall1 - wall0)
        load = os.getloadavg()
        print(f"busy loop in a {SHARE_PCT} % share: {share:.1f} % of a CPU, load average {load}")
        assert abs(share - SHARE_PCT) <= 2, f"{share:.1f} % of a CPU (load average {load})"
    finally:
        _teardown(tmp_path, run_id, journal)
    assert not cgroup.exists()
    assert _tree(root) == before
