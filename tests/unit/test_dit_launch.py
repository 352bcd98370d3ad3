"""library/dit_launch: the two-phase start (prepare, then start at the instant) beside the one-phase one.

The module runs as Ansible runs it on a node: a process of its own (its arguments in a file), which
exits after each phase; the processes it starts lead their own sessions and outlive it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ansible_modules import LIBRARY, MODULE_UTILS, library_module, module_util, run_in_process

procs = module_util("dit_procs")
launch = library_module("dit_launch")

# Runs library/dit_launch.py with the checkout's module_utils on ansible.module_utils's path.
RUNNER = (
    "import runpy, sys, ansible.module_utils as m; m.__path__.append(sys.argv.pop(1)); "
    "runpy.run_path(sys.argv.pop(1), run_name='__main__')"
)

# A process of the two-phase start, as the device agent behaves: status record, prepare (argv[1] s),
# prepared file, wait for the start-at file, result, exit code argv[2] (recorded, then exited).
PREPARED = """
import json, os, sys, time
def put(path, doc):
    with open(path + ".tmp", "w") as out:
        json.dump(doc, out)
    os.replace(path + ".tmp", path)
status = os.environ["DIT_STATUS_FILE"]
put(status, {"state": "running", "pid": os.getpid()})
time.sleep(float(sys.argv[1]))
if sys.argv[2] == "early":
    sys.exit(3)
put(os.environ["DIT_PREPARED_FILE"], {"prepared_wall_ns": time.time_ns()})
while not os.path.exists(os.environ["DIT_START_AT_FILE"]):
    time.sleep(0.005)
with open(os.environ["DIT_START_AT_FILE"]) as handle:
    start = json.load(handle)["start_at_ns"]
if sys.argv[2] == "hang":
    time.sleep(600)
os.makedirs("results", exist_ok=True)
env = {k: os.environ.get(k) for k in ("DIT_START_AT_NS", "DIT_START_AT_TIMEOUT_S", "DIT_TAG")}
put("results/prepared_out.json", {"start_at_ns": start, "env": env})
if sys.argv[2] == "killed":
    os.kill(os.getpid(), 9)
put(status, {"state": "exited", "exit_code": int(sys.argv[2]), "pid": os.getpid()})
sys.exit(int(sys.argv[2]))
"""

# A process of the one-phase start: the instant from DIT_START_AT_NS.
PLAIN = """
import json, os
os.makedirs("results", exist_ok=True)
with open("results/plain_out.json", "w") as out:
    json.dump({"start_at_ns": os.environ.get("DIT_START_AT_NS")}, out)
"""


def run_module(args: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The module in this process (a second's start-up of Ansible saved per call)."""
    return run_in_process(launch, args)


def run_module_as_ansible(args: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The module as Ansible runs it on a node: a process of its own, which exits after each phase."""
    path = tmp_path / f"args-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(MODULE_UTILS), str(LIBRARY / "dit_launch.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The common arguments of one node of a fresh run; every process of the run is reaped after."""
    run_id = f"launch-{uuid.uuid4().hex[:12]}"
    root = tmp_path / "node"
    root.mkdir()
    yield {"run_id": run_id, "host": "device1", "node_root": str(root)}
    procs.reap(run_id, grace_s=1.0)


def prepared(name: str, *args: str, **over: Any) -> dict[str, Any]:
    return {
        "name": name,
        "argv": [sys.executable, "prepared.py", *args],
        "files": {"prepared.py": PREPARED},
        "prepared_file": f"{name}.prepared.json",
        "result_files": ["results/prepared_out.json"],
        **over,
    }


PLAIN_SPEC = {
    "name": "plain",
    "argv": [sys.executable, "plain.py"],
    "files": {"plain.py": PLAIN},
    "result_files": ["results/plain_out.json"],
}


def test_prepare_starts_only_the_prepared_processes_and_start_releases_them_at_the_instant(
    node: dict[str, Any], tmp_path: Path
) -> None:
    root = Path(node["node_root"])
    (root / "start_at.json").write_text('{"start_at_ns": 1}')  # a stale instant must not release anyone
    main = [prepared("agent", "0.3", "0"), PLAIN_SPEC]
    res = run_module_as_ansible({**node, "processes": main, "phase": "prepare", "timeout_s": 30}, tmp_path)
    assert not res.get("failed"), res
    assert list(res["processes"]) == ["agent"]  # the one-phase process waits for the start phase
    pid = res["processes"]["agent"]["pid"]
    assert res["processes"]["agent"]["prepared"]["prepared_wall_ns"] > 0
    # The module has exited; the prepared process lives on, waiting for its instant.
    assert procs.alive_as(pid, node["run_id"], "agent")
    assert not (root / "start_at.json").exists() and not (root / "logs" / "plain.out").exists()
    assert json.loads((root / "logs" / "agent.status.json").read_text())["state"] == "running"

    instant = time.time_ns() + 200_000_000
    sent = time.time_ns()
    res = run_module_as_ansible(
        {**node, "processes": main, "phase": "start", "prepared": res["processes"], "start_at_ns": instant},
        tmp_path,
    )
    assert not res.get("failed"), res
    # when the module began (the profile playbook sizes the lead from it) and the instant it was given
    assert sent < res["entered_ns"] < time.time_ns() and res["start_at_ns"] == instant
    assert json.loads((root / "start_at.json").read_text()) == {"start_at_ns": instant}
    agent, plain = res["processes"]["agent"], res["processes"]["plain"]
    assert agent["pid"] == pid and agent["returncode"] == 0 and plain["returncode"] == 0
    out = agent["results"]["results/prepared_out.json"]
    assert out["start_at_ns"] == instant and out["env"]["DIT_START_AT_NS"] is None
    assert out["env"]["DIT_TAG"] == "agent" and float(out["env"]["DIT_START_AT_TIMEOUT_S"]) == 30 + 600
    assert plain["results"]["results/plain_out.json"] == {"start_at_ns": str(instant)}
    assert not procs.alive_as(pid, node["run_id"], "agent")


def test_prepare_fails_fast_when_a_process_exits_before_it_has_prepared(
    node: dict[str, Any], tmp_path: Path
) -> None:
    began = time.monotonic()
    res = run_module({**node, "processes": [prepared("agent", "0", "early")], "phase": "prepare"}, tmp_path)
    assert res["failed"] and res["msg"] == "agent exited with status 3 before it was prepared", res
    assert time.monotonic() - began < 30  # not the hour of the default timeout


def test_prepare_gives_up_after_its_timeout_and_kills_what_it_started(
    node: dict[str, Any], tmp_path: Path
) -> None:
    res = run_module(
        {**node, "processes": [prepared("agent", "60", "0")], "phase": "prepare", "timeout_s": 0.5}, tmp_path
    )
    assert res["failed"] and res["msg"] == "agent not prepared after 0.5 s", res
    assert procs.find_tagged(node["run_id"]) == []


def _prepare(node: dict[str, Any], tmp_path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    res = run_module({**node, "processes": [spec], "phase": "prepare", "timeout_s": 30}, tmp_path)
    assert not res.get("failed"), res
    processes: dict[str, Any] = res["processes"]
    return processes


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("4", "agent exited with status 4"),
        ("killed", "ended without recording an exit status in"),
    ],
)
def test_start_takes_a_prepared_process_exit_status_from_its_status_record(
    node: dict[str, Any], tmp_path: Path, how: str, message: str
) -> None:
    spec = prepared("agent", "0", how)
    ready = _prepare(node, tmp_path, spec)
    res = run_module(
        {**node, "processes": [spec], "phase": "start", "prepared": ready, "start_at_ns": time.time_ns()},
        tmp_path,
    )
    assert res["failed"] and message in res["msg"], res


def test_start_kills_prepared_processes_that_outlive_its_timeout(
    node: dict[str, Any], tmp_path: Path
) -> None:
    spec = prepared("agent", "0", "hang")
    ready = _prepare(node, tmp_path, spec)
    args = {"phase": "start", "prepared": ready, "start_at_ns": time.time_ns(), "timeout_s": 1.0}
    res = run_module({**node, "processes": [spec], **args}, tmp_path)
    assert res["failed"] and res["msg"] == "agent did not finish within 1 s; killed", res
    deadline = time.monotonic() + 5
    while procs.find_tagged(node["run_id"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.find_tagged(node["run_id"]) == []


def test_start_refuses_a_prepared_process_the_prepare_phase_did_not_start(
    node: dict[str, Any], tmp_path: Path
) -> None:
    res = run_module(
        {**node, "processes": [prepared("agent", "0", "0")], "phase": "start", "start_at_ns": 1}, tmp_path
    )
    assert (
        res["failed"] and "agent: has a prepared_file, but the prepare phase did not start it" in res["msg"]
    )
    assert procs.find_tagged(node["run_id"]) == []


def test_the_one_phase_start_is_unchanged(node: dict[str, Any], tmp_path: Path) -> None:
    res = run_module({**node, "processes": [PLAIN_SPEC], "start_at_ns": 42, "wait": True}, tmp_path)
    assert not res.get("failed"), res
    assert res["processes"]["plain"]["results"] == {"results/plain_out.json": {"start_at_ns": "42"}}


def test_a_process_s_files_are_written_0600_whatever_the_umask_or_a_stale_temporary_file(
    node: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 46, item 5: a runtime's files carry what the scenario named (HeadSplit's headsplit.json holds
    the perplexity paragraph dit read as root); only the user running the processes may read them."""
    root = Path(node["node_root"])
    (root / "conf").mkdir()
    (root / "conf" / "run.json.tmp").write_text("stale")
    (root / "conf" / "run.json.tmp").chmod(0o666)
    spec = {**PLAIN_SPEC, "files": {**PLAIN_SPEC["files"], "conf/run.json": '{"secret": "paragraph"}'}}
    old = os.umask(0o022)
    try:
        res = run_module({**node, "processes": [spec], "start_at_ns": 42, "wait": True}, tmp_path)
    finally:
        os.umask(old)
    assert not res.get("failed"), res
    for name in ("plain.py", "conf/run.json"):
        assert (root / name).stat().st_mode & 0o777 == 0o600, name
    assert (root / "conf" / "run.json").read_text() == '{"secret": "paragraph"}'


def test_a_link_planted_at_a_file_s_temporary_name_is_not_followed(
    node: dict[str, Any], tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's own")
    (Path(node["node_root"]) / "plain.py.tmp").symlink_to(victim)
    res = run_module({**node, "processes": [PLAIN_SPEC], "start_at_ns": 42, "wait": True}, tmp_path)
    assert res.get("failed"), res
    assert victim.read_text() == "root's own"


def test_the_plan_journals_every_process_of_either_phase(node: dict[str, Any], tmp_path: Path) -> None:
    main = [prepared("agent", "0", "0"), PLAIN_SPEC]
    for phase in ("prepare", "start"):
        res = run_module({**node, "processes": main, "phase": phase, "_dit_plan": True}, tmp_path)
        assert [r["undo"]["tag"] for r in res["journal"]] == ["agent", "plain"]
    assert procs.find_tagged(node["run_id"]) == []
    assert not os.listdir(node["node_root"])  # a plan starts and writes nothing


def test_start_announces_the_instant_to_a_node_without_prepared_processes(
    node: dict[str, Any], tmp_path: Path
) -> None:
    """``announce``: the edge has no process of the profile stage, but its running service profiles its
    capacity again from the instant, which it reads from the node's start-at file."""
    root = Path(node["node_root"])
    res = run_module({**node, "processes": [], "phase": "start", "start_at_ns": 77}, tmp_path)
    assert not res.get("failed"), res
    assert not (root / "start_at.json").exists()  # nothing prepared, nothing announced
    res = run_module(
        {**node, "processes": [], "phase": "start", "start_at_ns": 77, "announce": True}, tmp_path
    )
    assert not res.get("failed"), res
    assert json.loads((root / "start_at.json").read_text()) == {"start_at_ns": 77}
    res = run_module({**node, "processes": [], "phase": "start", "announce": True}, tmp_path)
    assert res["failed"] and "start_at_ns: required" in res["msg"]
