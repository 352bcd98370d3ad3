"""module_utils/dit_procs: tagged session leaders, CPU sets, finding and reaping them by run id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from tests.ansible_modules import module_util


def load() -> ModuleType:
    return module_util("dit_procs")


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


def _status(logs: Path, tag: str, **record: object) -> None:
    (logs / f"{tag}.status.json").write_text(json.dumps({"command": tag, **record}), encoding="utf-8")


def test_process_states_tell_running_exited_and_vanished_processes_apart(tmp_path: Path) -> None:
    procs = load()
    run_id = f"test-{uuid.uuid4().hex}"
    logs = tmp_path / "logs"
    logs.mkdir()
    env = procs.tagged_env(os.environ, run_id, "device1", "monitor")
    alive = procs.spawn(
        ["sleep", "30"], env, str(tmp_path), str(logs / "monitor.out"), str(logs / "monitor.err")
    )
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        _status(logs, "monitor", state="running", pid=alive.pid)
        _status(logs, "load", state="exited", pid=1, exit_code=0, error=None)
        _status(logs, "power", state="running", pid=dead.pid)  # gone without an exit code: a signal
        _status(
            logs, "netem-vary", state="exited", pid=2, exit_code=3, error="netem-vary returned exit code 3"
        )
        (logs / "netem-vary.err").write_text("".join(f"line {i}\n" for i in range(30)), encoding="utf-8")
        # a pid that is alive but not this tagged process (reused) is not "running"
        _status(logs, "edge", state="running", pid=os.getpid())
        states = {s["tag"]: s for s in procs.process_states(str(logs), run_id)}
    finally:
        alive.kill()
        alive.wait()
    assert [t for t in states] == sorted(states)
    assert states["monitor"]["state"] == "running" and not states["monitor"]["failed"]
    assert states["load"]["state"] == "exited" and not states["load"]["failed"]
    assert "stderr_tail" not in states["load"]
    assert states["power"]["state"] == "vanished" and states["power"]["failed"]
    assert "killed by a signal" in states["power"]["error"]
    assert states["edge"]["state"] == "vanished"
    vary = states["netem-vary"]
    assert vary["failed"] and vary["exit_code"] == 3
    assert vary["stderr_tail"] == [f"line {i}" for i in range(20, 30)]
    assert procs.process_states(str(tmp_path / "missing"), run_id) == []


def test_a_spawned_process_can_be_found_by_its_tags_as_soon_as_spawn_returns(tmp_path: Path) -> None:
    """Linux closes the exec status pipe Popen waits on before it lays out the new image's
    environment: for a moment /proc/<pid>/environ reads empty, and a reap or a state check then misses
    the process (1-2 % of spawns here; CI's parallel pass met it in
    test_process_states_tell_running_exited_and_vanished_processes_apart). spawn returns only once
    the tags can be read."""
    procs = load()
    run_id = f"test-{uuid.uuid4().hex}"
    env = procs.tagged_env(os.environ, run_id, "device1", "sleeper")
    missed = 0
    for i in range(300):
        child = procs.spawn(
            ["sleep", "30"], env, str(tmp_path), str(tmp_path / f"{i}.out"), str(tmp_path / f"{i}.err")
        )
        try:
            missed += not procs.alive_as(child.pid, run_id, "sleeper")
        finally:
            child.kill()
            child.wait()
    assert missed == 0
