"""module_utils/dit_procs: tagged session leaders, CPU sets, finding and reaping them by run id."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dit_procs", REPO / "module_utils" / "dit_procs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spawned_processes_are_tagged_session_leaders_and_reaped_by_run_id(tmp_path: Path) -> None:
    procs = load()
    run_id = f"test-{uuid.uuid4().hex}"
    env = procs.tagged_env(os.environ, run_id, "device1", "sleeper")
    code = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    child = procs.spawn(
        [sys.executable, "-c", code], env, str(tmp_path), str(tmp_path / "o"), str(tmp_path / "e")
    )
    try:
        deadline = time.monotonic() + 10
        while len(procs.find_tagged(run_id)) < 2:
            assert time.monotonic() < deadline, "the grandchild never appeared"
            time.sleep(0.02)
        found = procs.find_tagged(run_id)
        assert {p["pgid"] for p in found} == {child.pid}  # its own session: pgid == its pid
        assert {p["tag"] for p in found} == {"sleeper"}
        assert procs.find_tagged(run_id, host="device2") == []
        killed, survivors = procs.reap(run_id, "device1", None, grace_s=5)
        assert len(killed) == 2 and survivors == []
        assert procs.find_tagged(run_id) == []
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_spawn_confines_the_process_to_its_cpu_set(tmp_path: Path) -> None:
    procs = load()
    cpu = max(os.sched_getaffinity(0))
    run_id = f"test-{uuid.uuid4().hex}"
    env = procs.tagged_env(os.environ, run_id, "edge", "pinned")
    child = procs.spawn(
        ["sleep", "30"], env, str(tmp_path), str(tmp_path / "o"), str(tmp_path / "e"), cpus=[cpu]
    )
    try:
        assert os.sched_getaffinity(child.pid) == {cpu}
    finally:
        procs.reap(run_id)
        child.wait()
