"""The load generator: seeded targets, the duty cycle, the memory basis, and the real command."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from dit.conditions.load import LOAD_REGIMES
from dit.device import load
from dit.device.common import ConfigError
from tests.ansible_modules import module_util

S = 1_000_000_000
RUN_ID = f"test-load-{os.getpid()}"


def dit_procs() -> ModuleType:
    """The node-side process helpers teardown uses (``module_utils/dit_procs.py``)."""
    return module_util("dit_procs")


def test_regimes_mirror_the_scenario_regimes() -> None:
    for name, regime in LOAD_REGIMES.items():
        assert load.REGIMES[name] == (regime.cpu_pct, regime.mem_pct)


def test_targets_are_seeded_by_scenario_seed_and_device_and_stay_in_range() -> None:
    a = [load.draw_targets(load.load_rng(7, "device1"), "heavy") for _ in range(3)]
    b = [load.draw_targets(load.load_rng(7, "device1"), "heavy") for _ in range(3)]
    assert a == b  # each fresh generator draws the same first target
    rng = load.load_rng(7, "device1")
    seq1 = [load.draw_targets(rng, "moderate") for _ in range(50)]
    rng = load.load_rng(7, "device1")
    assert seq1 == [load.draw_targets(rng, "moderate") for _ in range(50)]
    other = load.load_rng(7, "device2")
    assert seq1 != [load.draw_targets(other, "moderate") for _ in range(50)]
    reseeded = load.load_rng(8, "device1")
    assert seq1 != [load.draw_targets(reseeded, "moderate") for _ in range(50)]
    assert all(30 <= cpu <= 50 and 30 <= mem <= 40 for cpu, mem in seq1)
    assert len({cpu for cpu, _ in seq1}) > 40  # really redrawn


def test_busy_part_of_a_period() -> None:
    assert load.busy_ns(40.0) == 40_000_000
    assert load.busy_ns(0.0) == 0
    assert load.busy_ns(100.0) == load.PERIOD_NS
    assert load.busy_ns(150.0) == load.PERIOD_NS
    assert load.busy_ns(12.5, 1_000_000) == 125_000


class FakeClock:
    """Advances 1 µs per reading; sleeps advance it by the slept time."""

    def __init__(self) -> None:
        self.now = 10 * S
        self.sleeps: list[int] = []

    def __call__(self) -> int:
        self.now += 1_000
        return self.now

    def sleep(self, seconds: float) -> None:
        ns = round(seconds * 1e9)
        self.sleeps.append(ns)
        self.now += ns


def test_duty_cycle_spins_for_the_target_and_sleeps_the_rest_on_an_absolute_schedule() -> None:
    clock = FakeClock()
    duty = load.DutyCycle(load.PERIOD_NS, clock=clock, sleep=clock.sleep, cpu_clock=clock)
    first = duty.next_start
    spins_before = clock.now
    duty.period(40.0)
    # busy until first + 40 ms (within one clock step), then asleep until first + 100 ms
    assert duty.next_start == first + load.PERIOD_NS
    assert clock.now == first + load.PERIOD_NS
    assert abs(clock.sleeps[0] - 60_000_000) <= 5_000  # a few 1 µs clock reads
    assert spins_before < first + 40_000_000
    for _ in range(9):
        duty.period(25.0)
    assert duty.next_start == first + 10 * load.PERIOD_NS  # no drift
    assert all(abs(s - 75_000_000) <= 5_000 for s in clock.sleeps[1:])


def test_a_preempted_spin_is_extended_by_the_cpu_time_it_lost() -> None:
    clock = FakeClock()
    half = lambda: clock.now // 2  # noqa: E731 - the process gets the core half of the time
    duty = load.DutyCycle(load.PERIOD_NS, clock=clock, sleep=clock.sleep, cpu_clock=half)
    first = duty.next_start
    duty.period(40.0)
    # 40 ms of CPU at half speed take ~80 ms of wall time; the rest of the period is slept
    assert abs(clock.sleeps[0] - 20_000_000) <= 2 * load.DutyCycle.SLACK_NS + 10_000
    duty.period(60.0)  # 120 ms needed: the spin stops at the end of the period
    assert len(clock.sleeps) == 1 and duty.next_start == first + 2 * load.PERIOD_NS
    plain = load.DutyCycle(load.PERIOD_NS, clock=clock, sleep=clock.sleep, cpu_clock=half, compensate=False)
    start = plain.next_start
    plain.period(40.0)  # the wall-clock spin alone: 40 ms of wall time, 20 ms of CPU
    assert abs(clock.sleeps[-1] - (start + load.PERIOD_NS - (start + 40_000_000))) <= 10_000


def test_duty_cycle_restarts_its_schedule_after_a_long_stall() -> None:
    clock = FakeClock()
    duty = load.DutyCycle(load.PERIOD_NS, clock=clock, sleep=clock.sleep, cpu_clock=clock)
    clock.now += 5 * load.PERIOD_NS  # suspended for half a second
    duty.period(10.0)
    assert duty.next_start >= clock.now - 2_000


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")
    return path


MEMINFO = "MemTotal:        3884376 kB\nMemFree:  100 kB\nMemAvailable:    3000000 kB\n"


def test_memory_basis_is_the_cgroup_v2_limit_smallest_on_the_path(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    write(cg / "dit/memory.max", str(512 * 1024 * 1024))
    write(cg / "dit/run1/memory.max", "max")
    proc_cgroup = write(tmp_path / "self_cgroup", "0::/dit/run1\n")
    mountinfo = write(
        tmp_path / "mountinfo",
        f"30 1 0:26 / {cg} rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    meminfo = write(tmp_path / "meminfo", MEMINFO)
    basis = load.memory_basis(proc_cgroup, mountinfo, meminfo)
    assert basis.total_bytes == 512 * 1024 * 1024
    assert basis.source == f"cgroup2 {cg}/dit/memory.max"


def test_memory_basis_is_the_cgroup_v1_limit(tmp_path: Path) -> None:
    mem = tmp_path / "memory"
    write(mem / "memory.limit_in_bytes", "9223372036854771712")  # the root: unlimited
    write(mem / "dit-run/memory.limit_in_bytes", str(64 * 1024 * 1024))
    proc_cgroup = write(tmp_path / "self_cgroup", "12:cpuset:/\n7:memory:/dit-run\n0::/\n")
    mountinfo = write(
        tmp_path / "mountinfo",
        f"40 30 0:33 / {mem} rw shared:10 - cgroup cgroup rw,memory\n"
        f"41 30 0:34 / {tmp_path}/cpuset rw shared:11 - cgroup cgroup rw,cpuset\n",
    )
    basis = load.memory_basis(proc_cgroup, mountinfo, write(tmp_path / "meminfo", MEMINFO))
    assert basis == load.MemoryBasis(64 * 1024 * 1024, f"cgroup1 {mem}/dit-run/memory.limit_in_bytes")


def test_memory_basis_without_a_limit_is_memtotal(tmp_path: Path) -> None:
    mem = tmp_path / "memory"
    write(mem / "memory.limit_in_bytes", "9223372036854771712")
    proc_cgroup = write(tmp_path / "self_cgroup", "7:memory:/\n")
    mountinfo = write(tmp_path / "mountinfo", f"40 30 0:33 / {mem} rw - cgroup cgroup rw,memory\n")
    basis = load.memory_basis(proc_cgroup, mountinfo, write(tmp_path / "meminfo", MEMINFO))
    assert basis == load.MemoryBasis(3884376 * 1024, "meminfo MemTotal")
    # a limit above the board's memory is no limit either
    write(mem / "memory.limit_in_bytes", str(8 * 1024**3))
    assert load.memory_basis(proc_cgroup, mountinfo, tmp_path / "meminfo").source == "meminfo MemTotal"


def test_memory_basis_is_the_board_without_a_limit_and_the_limit_before_it(tmp_path: Path) -> None:
    """Local mode's board (``board_memory_mb``) replaces MemTotal, not a cgroup limit, and never
    exceeds MemTotal."""
    mem = tmp_path / "memory"
    write(mem / "memory.limit_in_bytes", "9223372036854771712")
    proc_cgroup = write(tmp_path / "self_cgroup", "7:memory:/\n")
    mountinfo = write(tmp_path / "mountinfo", f"40 30 0:33 / {mem} rw - cgroup cgroup rw,memory\n")
    meminfo = write(tmp_path / "meminfo", MEMINFO)  # MemTotal 3.7 GiB
    board = load.memory_basis(proc_cgroup, mountinfo, meminfo, board_bytes=1024**3)
    assert board.total_bytes == 1024**3 and board.source.startswith("board_memory_mb")
    # a board larger than this machine: MemTotal
    bigger = load.memory_basis(proc_cgroup, mountinfo, meminfo, board_bytes=8 * 1024**3)
    assert bigger == load.MemoryBasis(3884376 * 1024, "meminfo MemTotal")
    # a cgroup limit (the scenario's memory_limit_mb) comes first, also when it is above the board
    write(mem / "dit-run/memory.limit_in_bytes", str(2 * 1024**3))
    write(tmp_path / "self_cgroup", "7:memory:/dit-run\n")
    limited = load.memory_basis(proc_cgroup, mountinfo, meminfo, board_bytes=1024**3)
    assert limited == load.MemoryBasis(2 * 1024**3, f"cgroup1 {mem}/dit-run/memory.limit_in_bytes")


def test_board_memory_must_be_a_positive_number() -> None:
    base = {"mode": "light", "host": "device1", "results_dir": "/tmp/r", "seed": 1}
    assert load.parse_config(base | {"board_memory_mb": 4096}).board_memory_mb == 4096
    assert load.parse_config(base).board_memory_mb is None
    with pytest.raises(load.ConfigError, match="board_memory_mb"):
        load.parse_config(base | {"board_memory_mb": 0})
    with pytest.raises(load.ConfigError, match="board_memory_mb"):
        load.parse_config(base | {"board_memory_mb": "4G"})


def test_memory_load_allocates_touches_and_shrinks() -> None:
    mem = load.MemoryLoad()
    mem.resize(20 * 1024 * 1024 + 123)
    assert mem.size == 20 * 1024 * 1024 + 123
    assert mem.touched()
    mem.resize(3 * 1024 * 1024)
    assert mem.size <= 3 * 1024 * 1024 + load.CHUNK_BYTES and mem.size >= 3 * 1024 * 1024
    mem.resize(0)
    assert mem.size == 0


def test_config_errors_name_the_field() -> None:
    base = {"host": "device1", "results_dir": "/tmp/x", "seed": 1}
    with pytest.raises(ConfigError, match="mode: 'extreme'"):
        load.parse_config({**base, "mode": "extreme"})
    with pytest.raises(ConfigError, match="processes: None is not a positive integer"):
        load.parse_config({**base, "mode": "processes"})
    with pytest.raises(ConfigError, match="cpu_pct: 120"):
        load.parse_config({**base, "mode": "light", "cpu_pct": 120})
    cfg = load.parse_config({**base, "mode": "continuous", "regime": None, "interval_s": None})
    assert (cfg.regime, cfg.interval_s, cfg.period_ns) == ("moderate", 10.0, load.PERIOD_NS)


def test_pick_core_defaults_to_the_highest_allowed_core() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    assert load.pick_core() == allowed[-1]
    assert load.pick_core(allowed[0]) == allowed[0]
    with pytest.raises(ConfigError, match="cpu_core: 4096"):
        load.pick_core(4096)


def start(tmp_path: Path, **cfg: object) -> tuple[subprocess.Popen[bytes], Path]:
    results = tmp_path / "results"
    config = {"host": "device1", "run_id": "t", "results_dir": str(results), "seed": 7, **cfg}
    path = tmp_path / "load-config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    env = {**os.environ, "DIT_RUN_ID": RUN_ID, "DIT_HOST": "device1", "DIT_TAG": "load"}  # as dit_proc
    proc = subprocess.Popen(
        [sys.executable, "-m", "dit.device", "load", "--config", str(path)],
        start_new_session=True,
        stderr=subprocess.PIPE,
        env=env,
    )
    return proc, results


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_continuous_load_logs_every_target_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "load.ready"
    proc, results = start(
        tmp_path, mode="continuous", regime="light", interval_s=0.2, mem_pct=0.05, ready_file=str(ready)
    )
    wait_for(ready)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, proc.stderr.read() if proc.stderr else ""
    log = rows(results / "load.csv")
    assert log[0]["event"] == "start" and log[-1]["event"] == "stop"
    targets = log[:-1]
    assert len(targets) >= 2 and all(r["event"] == "target" for r in targets[1:])
    # the same seed and device draw the same sequence (memory is overridden: it stays at 0.05 %)
    rng = load.load_rng(7, "device1")
    expected = [load.draw_targets(rng, "light")[0] for _ in targets]
    assert [float(r["cpu_pct"]) for r in targets] == expected
    assert all(r["mem_pct"] == "0.05" and int(r["mem_bytes"]) > 0 for r in targets)
    times = [int(r["t_mono_ns"]) for r in log]
    assert times == sorted(times)
    header = json.loads((results / "load.json").read_text())
    assert header["core"] == sorted(os.sched_getaffinity(0))[-1]
    assert header["memory_basis_source"] in ("meminfo MemTotal",) or header["memory_basis_source"].startswith(
        "cgroup"
    )


def test_fixed_regime_draws_once_and_honours_explicit_targets(tmp_path: Path) -> None:
    proc, results = start(tmp_path, mode="moderate", cpu_pct=5, mem_pct=0.02, duration_s=0.3)
    assert proc.wait(timeout=10) == 0
    log = rows(results / "load.csv")
    assert [r["event"] for r in log] == ["start", "stop"]
    assert (log[0]["cpu_pct"], log[0]["mem_pct"]) == ("5.00", "0.02")


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_busy_processes_inherit_the_tag_and_teardown_reaps_them_with_the_group(tmp_path: Path) -> None:
    procs = dit_procs()
    ready = tmp_path / "load.ready"
    proc, results = start(tmp_path, mode="processes", processes=2, ready_file=str(ready))
    wait_for(ready)
    kids = json.loads(ready.read_text())["children"]
    assert len(kids) == 2 and sorted(kids) == sorted(children_of(proc.pid))
    for kid in kids:
        assert os.getpgid(kid) == proc.pid  # the load process leads the group
    tagged = procs.find_tagged(RUN_ID, "device1", "load")
    assert sorted(p["pid"] for p in tagged) == sorted([proc.pid, *kids])  # found by run id alone
    found, survivors = procs.reap(RUN_ID, grace_s=5.0)  # what teardown does
    proc.wait(timeout=10)
    assert survivors == [] and len(found) == 3
    assert not any(alive(k) for k in kids)
    log = rows(results / "load.csv")
    assert [r["event"] for r in log] == ["start", "stop"]  # SIGTERM: stopped cleanly, flushed
    assert log[0]["processes"] == "2"


def test_busy_processes_die_when_the_load_process_is_killed_alone(tmp_path: Path) -> None:
    ready = tmp_path / "load.ready"
    proc, _ = start(tmp_path, mode="processes", processes=1, ready_file=str(ready))
    wait_for(ready)
    (kid,) = json.loads(ready.read_text())["children"]
    os.kill(proc.pid, signal.SIGKILL)  # not the group: only the parent
    proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while alive(kid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(kid)


class FakeLoadClocks:
    """Wall and thread-CPU clocks of a duty cycle: each period adds 100 ms of wall time and the CPU time
    the scheduler granted it (from ``grants``, in ms, the last one repeating)."""

    def __init__(self, grants: list[int]) -> None:
        self.wall = 5 * S
        self.cpu = 0
        self.grants = grants
        self.periods = 0

    def period(self) -> None:
        grant = self.grants[min(self.periods, len(self.grants) - 1)]
        self.periods += 1
        self.wall += 100_000_000
        self.cpu += grant * 1_000_000


SETTLE = load.SettleConfig(timeout_s=3.0, tolerance_pct=2.0, window_s=0.5)


def test_the_settle_wait_ends_when_the_load_reaches_its_target() -> None:
    # the first 5 periods get 20 ms of CPU (a busy core), then the target's 40 ms
    clocks = FakeLoadClocks([20] * 5 + [40])
    watch = load.SettleWatch(40.0, SETTLE, clocks.wall)
    result = load.settle(
        clocks.period, watch, lambda: False, clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu
    )
    # steady once a whole 0.5 s window lies in the 40 % part: after period 10, 1.0 s after the start
    assert (result.steady, result.reason, result.elapsed_s, result.achieved_pct) == (
        True,
        "steady",
        1.0,
        40.0,
    )
    assert clocks.periods == 10
    assert result.as_dict()["target_pct"] == 40.0


def test_the_settle_timeout_is_reported_not_silent() -> None:
    clocks = FakeLoadClocks([20])  # never more than 20 % of a core
    watch = load.SettleWatch(40.0, SETTLE, clocks.wall)
    result = load.settle(
        clocks.period, watch, lambda: False, clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu
    )
    assert (result.steady, result.reason, result.elapsed_s, result.achieved_pct) == (
        False,
        "timeout",
        3.0,
        20.0,
    )
    assert clocks.periods == 30


def test_a_stop_ends_the_settle_wait() -> None:
    clocks = FakeLoadClocks([0])
    watch = load.SettleWatch(40.0, SETTLE, clocks.wall)
    result = load.settle(
        clocks.period,
        watch,
        lambda: clocks.periods >= 2,
        clock=lambda: clocks.wall,
        cpu_clock=lambda: clocks.cpu,
    )
    assert (result.steady, result.reason, result.achieved_pct) == (False, "stopped", None)


def test_settle_config_defaults_and_errors() -> None:
    base = {"host": "device1", "results_dir": "/tmp/x", "seed": 1, "mode": "light"}
    assert load.parse_config(base).settle is None
    assert load.parse_config({**base, "settle": {}}).settle == load.SettleConfig(60.0, 5.0, 1.0)
    with pytest.raises(ConfigError, match=r"settle\.tolerance_pct: -1"):
        load.parse_config({**base, "settle": {"tolerance_pct": -1}})
    with pytest.raises(ConfigError, match="settle: 5 is not a mapping"):
        load.parse_config({**base, "settle": 5})


def test_a_settling_load_reports_ready_with_its_settle_record(tmp_path: Path) -> None:
    ready = tmp_path / "load.ready"
    settle = {"timeout_s": 20, "tolerance_pct": 10, "window_s": 0.3}
    proc, _ = start(tmp_path, mode="light", cpu_pct=30, mem_pct=0.01, ready_file=str(ready), settle=settle)
    try:
        wait_for(ready)
        record = json.loads(ready.read_text())["settle"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    assert record["target_pct"] == 30.0 and record["window_s"] == 0.3
    assert record["elapsed_s"] >= 0.3  # at least one window of the duty cycle before ready
    if record["steady"]:
        assert abs(record["achieved_pct"] - 30.0) <= 10.0
    else:  # a machine too busy to give 30 % of a core: the timeout is in the record
        assert record["reason"] == "timeout" and record["elapsed_s"] >= 20.0
