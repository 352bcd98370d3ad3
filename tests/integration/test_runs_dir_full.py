"""A runs directory on a full disk or a read-only file system (root: tmpfs mounts).

A full disk must not stop teardown: the run fails saying the disk is full, and leaves no process,
cgroup or lease behind; the results the nodes held are kept until they can be fetched. A read-only
runs directory is refused before anything starts.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dit.conditions.cgroup_roots import cgroup_cpu_root, cgroup_memory_root
from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, dit_env, write_scenario

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root)")


@contextmanager
def tmpfs(where: Path, size: str, *options: str) -> Iterator[Path]:
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def dit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DIT, *args],
        cwd=REPO,
        env=env or dit_env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def cgroups_of(run_id: str) -> list[Path]:
    return [p for root in {cgroup_cpu_root(), cgroup_memory_root()} for p in Path(root).glob(f"*{run_id}*")]


@pytest.mark.slow  # a whole run, then two cleanups: 89 s of ./dev test; the read-only sibling below stays there
def test_a_run_on_a_full_disk_fails_saying_so_and_leaves_no_process_cgroup_or_lease(
    scenario_dir: Path, tmp_path: Path, _lease_dir: Path
) -> None:
    scenario = write_scenario(scenario_dir)
    env = dit_env()
    env["DIT_LOCAL_CPU_SHARE"] = "auto"  # a CPU cgroup per device, as a run has by default
    with tmpfs(tmp_path / "full", "2m") as disk:
        done = dit("run", str(scenario), "--runs-dir", str(disk / "runs"), env=env)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output
        assert "Traceback" not in output
        assert "no space left on device: the file system is full" in output, output
        (run_dir,) = (disk / "runs").glob("*/*/")
        run = RunDir(run_dir)
        assert run_processes(run.run_id) == []
        assert cgroups_of(run.run_id) == []
        assert not (_lease_dir / "lease.json").exists()

        # Still full: cleanup says what it cannot do, in one message, and deletes no result.
        kept = [p for p in (run.path / "nodes").glob(f"*/{run.run_id}") if any(p.glob("results/*"))]
        again = dit("cleanup", str(run.path))
        assert "Traceback" not in again.stdout + again.stderr
        if kept:
            assert again.returncode == 1, again.stdout + again.stderr
            assert "kept" in again.stderr and "--discard-results" in again.stderr
            assert all(p.is_dir() for p in kept)

        # With space, the results still on the nodes come home to raw/ and the nodes are clean.
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        final = dit("cleanup", str(run.path))
        assert final.returncode == 0, final.stdout + final.stderr
        assert Journal(run.journal).pending() == []
        assert not list((run.path / "nodes").glob(f"*/{run.run_id}"))
        for node in kept:
            host = node.parent.name
            assert list((run.path / "raw" / host).glob(f"{host}_*")), host


def test_a_read_only_runs_dir_is_refused_before_a_run_starts(
    scenario_dir: Path, tmp_path: Path, _lease_dir: Path
) -> None:
    scenario = write_scenario(scenario_dir)
    with tmpfs(tmp_path / "ro", "1m", "ro") as disk:
        done = dit("run", str(scenario), "--runs-dir", str(disk / "runs"))
        output = done.stdout + done.stderr
        assert done.returncode == 2, output
        assert "Traceback" not in output
        assert (
            f"--runs-dir: {disk / 'runs'}: cannot create the runs directory: read-only file system"
            in " ".join(output.split())
        )
        assert output.count("error:") == 1
    assert not (_lease_dir / "lease.json").exists()  # no node was leased: nothing started
