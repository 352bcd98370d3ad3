"""The device agent: the timed start, profile command outputs, config errors, stdlib-only imports."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dit.device import agent

TINY = {"name": "fake", "builder": "dit.device.fakemodel:build", "params": {"profile": "tiny"}, "seed": 1}
SRC = Path(__file__).resolve().parents[2] / "src"


def write(tmp: Path, cfg: dict[str, Any]) -> Path:
    path = tmp / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def profile_cfg(tmp: Path, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "run_id": "run-7",
        "host": "device1",
        "start_at_ns": time.time_ns() + 50_000_000,
        "model": TINY,
        "repetitions": 3,
        "warmup": 1,
        "inference": {"enabled": False},
        "results_dir": str(tmp / "out"),
        "threads": 2,
    }
    cfg.update(over)
    return cfg


def test_sleep_until_spins_only_at_the_end() -> None:
    now = [0]
    sleeps: list[float] = []

    def clock() -> int:
        now[0] += 100_000  # each read: +0.1 ms
        return now[0]

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += int(s * 1e9)

    orig = agent.time.sleep
    agent.time.sleep = fake_sleep
    try:
        agent.sleep_until(1_000_000_000, clock=clock)
    finally:
        agent.time.sleep = orig
    assert now[0] >= 1_000_000_000
    assert len(sleeps) >= 1 and sum(sleeps) < 1.0  # one coarse sleep, then ~2 ms of spinning
    agent.sleep_until(0)  # already past: returns at once


def test_the_coarse_wait_is_one_absolute_sleep_to_the_spin_then_a_spin() -> None:
    now = [0]
    targets: list[int] = []

    def clock() -> int:
        now[0] += 100_000
        return now[0]

    def absolute(until_ns: int) -> bool:
        targets.append(until_ns)
        now[0] = until_ns  # the kernel wakes it at the absolute instant
        return True

    method = agent.sleep_until(1_000_000_000, clock=clock, absolute=absolute)
    assert method == agent.ABSOLUTE_WAIT
    assert targets == [1_000_000_000 - agent.SPIN_NS]  # one sleep, ending where the spin starts
    assert now[0] >= 1_000_000_000
    # An absolute sleep that fails falls back to relative sleeps (no sleeper at all likewise).
    now[0] = 0
    assert agent.sleep_until(5_000_000, clock=clock, absolute=lambda ns: False) == agent.RELATIVE_WAIT
    assert now[0] >= 5_000_000
    # Reached late: nothing slept, and the record says so.
    assert agent.sleep_until(0, clock=clock, absolute=absolute) == agent.NO_WAIT


def test_the_real_wait_sleeps_on_the_wall_clock_with_clock_nanosleep() -> None:
    # 0.5 s ahead: a busy machine (CI's, with three test workers on two cores) can stall this process
    # for more than the 20 ms this test first allowed, and the instant was then reached late (NO_WAIT)
    start_at = time.time_ns() + 500_000_000
    method = agent.sleep_until(start_at)
    assert time.time_ns() >= start_at
    assert method == (agent.ABSOLUTE_WAIT if sys.platform.startswith("linux") else agent.RELATIVE_WAIT)


class FakeSched:
    """os's scheduler calls, recorded; ``fail`` makes sched_setscheduler refuse like a v1 cpu
    cgroup without an RT budget does (EPERM)."""

    SCHED_FIFO, SCHED_OTHER = os.SCHED_FIFO, os.SCHED_OTHER

    def __init__(self, euid: int = 0, fail: bool = False) -> None:
        self.euid, self.fail, self.policy = euid, fail, os.SCHED_OTHER
        self.calls: list[tuple[int, int]] = []

    def geteuid(self) -> int:
        return self.euid

    def sched_getscheduler(self, pid: int) -> int:
        return self.policy

    def sched_getparam(self, pid: int) -> os.sched_param:
        return os.sched_param(0)

    def sched_param(self, priority: int) -> os.sched_param:
        return os.sched_param(priority)

    def sched_setscheduler(self, pid: int, policy: int, param: os.sched_param) -> None:
        if self.fail and policy == os.SCHED_FIFO:
            raise PermissionError(1, "Operation not permitted")
        self.calls.append((policy, param.sched_priority))
        self.policy = policy


def test_the_wait_runs_at_sched_fifo_when_root_and_drops_back_after() -> None:
    fake = FakeSched()
    with agent.start_priority(fake) as sched:
        assert fake.policy == os.SCHED_FIFO
    assert sched == {"policy": "SCHED_FIFO", "priority": agent.FIFO_PRIORITY, "detail": ""}
    assert fake.calls == [(os.SCHED_FIFO, agent.FIFO_PRIORITY), (os.SCHED_OTHER, 0)]


@pytest.mark.parametrize(
    ("fake", "detail"),
    [
        (FakeSched(euid=1000), "not root"),
        (FakeSched(fail=True), "sched_setscheduler: Operation not permitted"),
    ],
)
def test_without_permission_the_wait_stays_at_the_normal_policy(fake: FakeSched, detail: str) -> None:
    with agent.start_priority(fake) as sched:
        assert fake.policy == os.SCHED_OTHER
    assert sched == {"policy": "SCHED_OTHER", "priority": 0, "detail": detail}
    assert fake.calls == []


def test_the_start_instant_comes_from_the_profile_stage_when_the_config_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIT_RUN_ID", raising=False)
    start_at = time.time_ns() + 50_000_000
    monkeypatch.setenv("DIT_START_AT_NS", str(start_at))
    cfg = profile_cfg(tmp_path)
    del cfg["start_at_ns"]
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == 0
    origin = json.loads((tmp_path / "out" / "origin.json").read_text())
    assert origin["start_at_ns"] == start_at
    assert origin["lateness_ns"] == origin["origin_wall_ns"] - start_at >= 0
    monkeypatch.setenv("DIT_START_AT_NS", "soon")
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == agent.EXIT_CONFIG


# -- the two-phase start: prepared, then the instant from a file ----------------------------------


def test_waiting_for_the_start_file_polls_until_it_appears(tmp_path: Path) -> None:
    path = tmp_path / "start_at.json"
    now = [100.0]
    polls: list[float] = []

    def sleep(s: float) -> None:
        polls.append(s)
        now[0] += s
        if len(polls) == 3:  # the profile stage writes the instant after the third poll
            path.write_text(json.dumps({"start_at_ns": 1_234_567_890}))

    got = agent.wait_for_start_file(path, timeout_s=1.0, poll_s=0.005, clock=lambda: now[0], sleep=sleep)
    assert got == 1_234_567_890
    assert polls == [0.005, 0.005, 0.005]


def test_waiting_for_the_start_file_times_out_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "start_at.json"
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(
        TimeoutError, match=rf"no start instant: {re.escape(str(path))} did not appear within 2 s"
    ):
        agent.wait_for_start_file(path, timeout_s=2.0, poll_s=0.5, clock=lambda: now[0], sleep=sleep)
    assert now[0] == 2.0  # polled until the deadline, not a poll longer


@pytest.mark.parametrize(
    ("text", "match"),
    [("{", "not JSON"), ('{"start_at_ns": "soon"}', "start_at_ns: 'soon' is not an integer"), ("[]", "None")],
)
def test_a_start_file_that_is_not_an_instant_is_an_error_naming_it(
    tmp_path: Path, text: str, match: str
) -> None:
    path = tmp_path / "start_at.json"
    path.write_text(text)
    with pytest.raises(agent.ConfigError, match=re.escape(str(path)) + ".*" + match):
        agent.wait_for_start_file(path, timeout_s=1.0)


def test_a_prepared_agent_says_so_then_starts_at_the_instant_of_the_start_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    monkeypatch.delenv("DIT_RUN_ID", raising=False)
    monkeypatch.delenv("DIT_START_AT_NS", raising=False)
    start_file, prepared_file = tmp_path / "start_at.json", tmp_path / "profile.prepared.json"
    monkeypatch.setenv("DIT_START_AT_FILE", str(start_file))
    monkeypatch.setenv("DIT_PREPARED_FILE", str(prepared_file))
    picked: list[int] = []

    def profile_stage() -> None:  # picks the instant only once the agent has prepared
        deadline = time.monotonic() + 30
        while not prepared_file.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)
        picked.append(time.time_ns() + 50_000_000)
        # atomically, as the profile stage writes it (a rename): the agent polls every 5 ms, and a file
        # it finds created but not yet written is, rightly, an error (it failed CI once under load)
        partial = start_file.with_suffix(".part")
        partial.write_text(json.dumps({"start_at_ns": picked[0]}))
        os.replace(partial, start_file)

    stage = threading.Thread(target=profile_stage, daemon=True)
    stage.start()
    cfg = profile_cfg(tmp_path)
    del cfg["start_at_ns"]
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == 0
    stage.join(5)
    prepared = json.loads(prepared_file.read_text())
    origin = json.loads((tmp_path / "out" / "origin.json").read_text())
    assert origin["start_at_ns"] == picked[0]
    assert origin["prepared_wall_ns"] == prepared["prepared_wall_ns"] and prepared["pid"] == os.getpid()
    # It waited, prepared, for the 0.1 s the stage took plus the 50 ms lead.
    assert origin["prepared_to_start_ns"] == picked[0] - prepared["prepared_wall_ns"] >= 150_000_000
    assert origin["lateness_ns"] == origin["origin_wall_ns"] - picked[0] >= 0
    assert origin["start_sched"]["start_from"] == "file"
    assert origin["start_sched"]["prepared_to_start_ns"] == origin["prepared_to_start_ns"]


def test_a_prepared_agent_that_never_gets_its_instant_fails_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DIT_START_AT_FILE", str(tmp_path / "start_at.json"))
    monkeypatch.setenv("DIT_PREPARED_FILE", str(tmp_path / "p.json"))
    monkeypatch.setenv("DIT_START_AT_TIMEOUT_S", "0.1")
    cfg = profile_cfg(tmp_path)
    del cfg["start_at_ns"]
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == agent.EXIT_FAILURE
    assert (tmp_path / "p.json").exists()
    assert (
        f"no start instant: {tmp_path / 'start_at.json'} did not appear within 0.1 s"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "out" / "origin.json").exists()
    monkeypatch.setenv("DIT_START_AT_TIMEOUT_S", "never")
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == agent.EXIT_CONFIG
    assert "DIT_START_AT_TIMEOUT_S: 'never' is not a positive number" in capsys.readouterr().err


def test_profile_command_writes_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIT_RUN_ID", raising=False)
    cfg = profile_cfg(tmp_path)
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == 0
    out = tmp_path / "out"
    origin = json.loads((out / "origin.json").read_text())
    assert set(origin) == {
        "host", "run_id", "start_at_ns", "origin_wall_ns", "origin_mono_ns", "lateness_ns", "start_sched",
        "prepared_wall_ns", "prepared_to_start_ns",
    }  # fmt: skip
    assert origin["start_sched"]["policy"] in ("SCHED_FIFO", "SCHED_OTHER")
    assert origin["start_sched"]["start_from"] == "config"
    assert origin["prepared_to_start_ns"] == cfg["start_at_ns"] - origin["prepared_wall_ns"]
    # The profile itself runs at the normal policy again, whatever the wait used.
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    assert origin["lateness_ns"] == origin["origin_wall_ns"] - cfg["start_at_ns"] >= 0
    with open(out / "layers.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 5 and all(int(r["start_ns"]) >= 0 for r in rows)
    done = json.loads((out / "done.json").read_text())
    assert done["status"] == "ok" and done["profile"]["warmup"] == 1 and done["threads"] == 2
    assert done["inference"] == {"enabled": False}
    assert json.loads((out / "profile_summary.json").read_text())["warmup"] == 1
    assert not (out / "inference.csv").exists()
    assert os.environ["DIT_RUN_ID"] == "run-7" and os.environ["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"model": {"name": "alexnet"}}, "model.builder: is required"),
        ({"threads": 0}, "threads: 0 is not a positive integer"),
        ({"start_at_ns": "soon"}, "start_at_ns"),
        (
            {"inference": {"enabled": True, "vectors": [[0, 9]], "device_index": 1, "edge": {}}},
            r"\[0\]\[1\]: 9 is outside 0..4",
        ),
        (
            {"inference": {"enabled": True, "vectors": [[0]], "device_index": 0}},
            "inference.edge: is required",
        ),
        ({"repetitions": -1}, "repetitions: -1 is less than 0"),
        ({"tokens": 8}, "tokens: 8 tokens need a decoder model"),  # the fake model generates nothing
        ({"tokens": -1}, "tokens: -1 is less than 0"),
    ],
)
def test_config_errors_exit_2_and_name_the_field(
    tmp_path: Path, over: dict[str, Any], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = profile_cfg(tmp_path, **over)
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == agent.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "config error" in err
    assert re.search(match, err), err
    assert json.loads((tmp_path / "out" / "error.json").read_text())["kind"] == "config"


def test_missing_config_file(tmp_path: Path) -> None:
    assert agent.main(["profile", "--config", str(tmp_path / "nope.json")]) == agent.EXIT_CONFIG


def test_device_package_imports_only_the_standard_library() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import dit.device.agent, dit.device.edge, dit.device.client, dit.device.profiler,"
        " dit.device.fakemodel, dit.device.protocol, dit.device.build, dit.device.common;"
        "top = {m.split('.')[0] for m in sys.modules};"
        "bad = sorted(top - set(sys.stdlib_module_names) - {'dit', '__main__'});"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(SRC)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_agent_records_its_exit_in_the_status_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = tmp_path / "logs" / "profile.status.json"
    monkeypatch.setenv(agent.STATUS_ENV, str(status))
    monkeypatch.setenv("DIT_TAG", "profile")
    cfg = profile_cfg(tmp_path, repetitions=-1)
    assert agent.main(["profile", "--config", str(write(tmp_path, cfg))]) == agent.EXIT_CONFIG
    record = json.loads(status.read_text())
    assert record["state"] == "exited" and record["exit_code"] == agent.EXIT_CONFIG
    assert record["tag"] == "profile" and record["pid"] == os.getpid() and record["command"] == "profile"
    assert "repetitions: -1 is less than 0" in record["error"]
    assert record["ended_wall_ns"] >= record["started_wall_ns"]

    def boom(cfg: object) -> int:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setitem(agent.COMMANDS, "monitor", boom)
    assert agent.main(["monitor", "--config", str(write(tmp_path, {}))]) == agent.EXIT_FAILURE
    record = json.loads(status.read_text())
    assert record["exit_code"] == agent.EXIT_FAILURE
    assert record["error"] == "ZeroDivisionError: float division by zero"
    assert "ZeroDivisionError" in capsys.readouterr().err

    monkeypatch.setitem(agent.COMMANDS, "monitor", lambda cfg: 0)
    assert agent.main(["monitor", "--config", str(write(tmp_path, {}))]) == agent.EXIT_OK
    record = json.loads(status.read_text())
    assert record["state"] == "exited" and record["exit_code"] == 0 and record["error"] is None

    with pytest.raises(SystemExit):
        agent.main(["no-such-command", "--config", "x"])
    assert json.loads(status.read_text())["exit_code"] == 2

    monkeypatch.delenv(agent.STATUS_ENV)
    status.unlink()
    assert agent.main(["monitor", "--config", str(write(tmp_path, {}))]) == agent.EXIT_OK
    assert not status.exists()  # no record without the variable


def test_a_running_agent_says_so_in_its_status_file(tmp_path: Path) -> None:
    status = tmp_path / "monitor.status.json"
    cfg = {
        "host": "device1",
        "results_dir": str(tmp_path / "r"),
        "interval_s": 0.05,
        "vcgencmd_argv": ["no-such-vcgencmd-here"],
        "ready_file": str(tmp_path / "ready"),
    }
    env = {**os.environ, agent.STATUS_ENV: str(status), "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dit.device", "monitor", "--config", str(write(tmp_path, cfg))], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        record = json.loads(status.read_text())
        assert record["state"] == "running" and record["pid"] == proc.pid and record["exit_code"] is None
        proc.terminate()  # SIGTERM: what teardown sends; a clean stop, not a failure
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    record = json.loads(status.read_text())
    assert record["state"] == "exited" and record["exit_code"] == 0
