"""dit_proc never adopts a tagged process its own run's journal did not start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from dit.run.ansible_exec import ansible_env
from dit.run.journal import Journal
from tests.ansible_modules import module_util

procs = module_util("dit_procs")


def _start(
    tmp_path: Path, journal: Path, run_id: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """The apply stage's way of starting a tagged process (through the journaling action plugin)."""
    playbook = tmp_path / "start.yml"
    playbook.write_text(
        "- hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Start the sleeper\n"
        "      dit_proc:\n"
        f"        run_id: {run_id}\n"
        "        host: edge\n"
        "        tag: sleeper\n"
        "        argv: [sleep, '60']\n"
        f"        cwd: {tmp_path}\n",
        encoding="utf-8",
    )
    extra: dict[str, Any] = {"dit_journal_path": str(journal), "ansible_python_interpreter": sys.executable}
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    if check:
        argv.append("--check")
    return subprocess.run(
        [*argv, "-e", json.dumps(extra), str(playbook)],
        env={**os.environ, **ansible_env()},
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_tag_already_running_for_the_run_id_is_an_error_not_adopted(tmp_path: Path) -> None:
    run_id = f"itest-tags-{uuid.uuid4().hex[:8]}"
    # Another run with the same run id (different journal) already runs a process with this tag.
    env = procs.tagged_env(os.environ, run_id, "edge", "sleeper")
    other = procs.spawn(["sleep", "60"], env, str(tmp_path), str(tmp_path / "o"), str(tmp_path / "e"))
    try:
        journal = tmp_path / "journal.jsonl"
        started = _start(tmp_path, journal, run_id)
        assert started.returncode != 0, started.stdout
        assert f"process tagged sleeper of run {run_id} already runs on edge" in started.stdout
        assert f"pid {other.pid}" in started.stdout
        # Nothing was started beside it.
        assert [p["pid"] for p in procs.find_tagged(run_id)] == [other.pid]
        # Check mode predicts the same refusal.
        checked = _start(tmp_path, tmp_path / "journal-check.jsonl", run_id, check=True)
        assert checked.returncode != 0 and "already runs" in checked.stdout
    finally:
        procs.reap(run_id)
        other.wait()


def test_a_process_this_runs_journal_started_is_its_own(tmp_path: Path) -> None:
    # Applying the same task twice in one run (molecule's idempotence step) starts nothing new.
    run_id = f"itest-tags-{uuid.uuid4().hex[:8]}"
    journal = tmp_path / "journal.jsonl"
    try:
        first = _start(tmp_path, journal, run_id)
        assert first.returncode == 0, first.stdout
        pids = [p["pid"] for p in procs.find_tagged(run_id)]
        assert len(pids) == 1
        again = _start(tmp_path, journal, run_id)
        assert again.returncode == 0, again.stdout
        assert "changed=0" in again.stdout
        assert [p["pid"] for p in procs.find_tagged(run_id)] == pids
        assert len(Journal(journal).pending()) == 1
    finally:
        procs.reap(run_id)
