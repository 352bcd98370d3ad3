"""The monitor: /proc and sysfs readers against fake trees, throttling sources, the real command."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dit.device import monitor
from dit.run.localmode import make_fake_sysfs

STAT_1 = """cpu  100 0 100 800 0 0 0 0 0 0
cpu0 50 0 50 400 0 0 0 0 0 0
cpu1 50 0 50 400 0 0 0 0 0 0
intr 1 2 3
"""
# cpu0: +90 busy of +100; cpu1: +10 system and +5 softirq busy of +105 (+10 iowait counts as idle)
STAT_2 = """cpu  190 0 110 890 10 0 5 0 0 0
cpu0 140 0 50 410 0 0 0 0 0 0
cpu1 50 0 60 480 10 0 5 0 0 0
intr 1 2 3
"""
MEMINFO = "MemTotal:        4000000 kB\nMemFree:          100000 kB\nMemAvailable:    3000000 kB\n"


def fake_proc(root: Path, stat: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(stat, encoding="ascii")
    (root / "meminfo").write_text(MEMINFO, encoding="ascii")
    return root


def test_proc_stat_deltas_give_per_core_utilisation(tmp_path: Path) -> None:
    first = monitor.read_proc_stat(fake_proc(tmp_path, STAT_1) / "stat")
    second = monitor.read_proc_stat(fake_proc(tmp_path, STAT_2) / "stat")
    assert set(first) == {"cpu", "cpu0", "cpu1"}
    assert monitor.utilisation_pct(first["cpu0"], second["cpu0"]) == pytest.approx(90.0)
    assert monitor.utilisation_pct(first["cpu1"], second["cpu1"]) == pytest.approx(15.0 * 100 / 105)
    assert monitor.utilisation_pct(first["cpu0"], first["cpu0"]) is None


def test_sampler_reads_the_fake_pi(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", STAT_1)
    sysfs = make_fake_sysfs(tmp_path / "sys", "device")
    (sysfs / "class/thermal/thermal_zone0/temp").write_text("61234\n")
    (sysfs / "devices/system/cpu/cpufreq/policy0/scaling_cur_freq").write_text("1500000\n")
    (sysfs / monitor.FIRMWARE_THROTTLED).write_text("50005\n")
    sampler = monitor.Sampler(sysfs, proc, throttle_source="auto", vcgencmd_argv=["no-such-vcgencmd-here"])
    assert sampler.throttle_source == "sysfs"
    fake_proc(tmp_path / "proc", STAT_2)
    row = dict(zip(sampler.columns, sampler.sample(), strict=True))
    assert sampler.columns[0] == "t_mono_ns" and isinstance(row["t_mono_ns"], int)
    assert row["cpu0_pct"] == "90.00"
    assert row["cpu1_pct"] == "14.29"
    assert row["mem_total_bytes"] == 4_000_000 * 1024
    assert row["mem_available_bytes"] == 3_000_000 * 1024
    assert row["mem_used_pct"] == "25.00"
    assert row["thermal_zone0_temp_c"] == "61.234"
    # the fake Pi has one policy for its four cores: every core reports the policy's frequency
    assert [row[f"cpu{c}_freq_khz"] for c in range(4)] == [1_500_000] * 4
    assert row["throttled"] == 0x50005


def test_per_core_cpufreq_directories_win_over_policies(tmp_path: Path) -> None:
    sysfs = make_fake_sysfs(tmp_path / "sys", "device")
    own = sysfs / "devices/system/cpu/cpu2/cpufreq"
    own.mkdir(parents=True)
    (own / "scaling_cur_freq").write_text("600000\n")
    files = monitor.core_frequency_files(sysfs)
    assert files[2] == own / "scaling_cur_freq"
    assert files[0] == sysfs / "devices/system/cpu/cpufreq/policy0/scaling_cur_freq"
    edge = monitor.core_frequency_files(make_fake_sysfs(tmp_path / "edge", "edge"))
    assert edge[3].parent.name == "policy3"  # the edge server has a policy per core


def test_throttle_flags_parse_and_decode() -> None:
    assert monitor.parse_throttled("throttled=0x50005\n") == 0x50005
    assert monitor.parse_throttled("0\n") == 0
    assert monitor.parse_throttled("80000") == 0x80000
    flags = monitor.decode_throttled(0x50005)
    assert flags["under_voltage_now"] and flags["throttled_now"] and flags["under_voltage_occurred"]
    assert not flags["freq_capped_now"] and not flags["soft_temp_limit_occurred"]


def test_vcgencmd_is_used_where_it_exists(tmp_path: Path) -> None:
    sysfs = make_fake_sysfs(tmp_path / "sys", "device")
    argv = ["/bin/echo", "throttled=0x20002"]  # stands in for `vcgencmd get_throttled`
    sampler = monitor.Sampler(sysfs, throttle_source="auto", vcgencmd_argv=argv)
    assert sampler.throttle_source == "vcgencmd"
    assert sampler.throttled() == 0x20002
    assert (
        monitor.Sampler(make_fake_sysfs(tmp_path / "e", "edge"), vcgencmd_argv=["nope"]).throttle_source
        == "none"
    )


def start_monitor(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """The ``monitor`` command on a fake Pi's sysfs, sampling every 50 ms: its process, its results
    directory and its ready file (not waited for)."""
    sysfs = make_fake_sysfs(tmp_path / "sys", "device")
    results = tmp_path / "results"
    ready = tmp_path / "monitor.ready"
    config = {
        "host": "device1",
        "run_id": "t",
        "results_dir": str(results),
        "sysfs_root": str(sysfs),
        "interval_s": 0.05,
        "ready_file": str(ready),
        "vcgencmd_argv": ["no-such-vcgencmd-here"],
    }
    path = tmp_path / "monitor-config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dit.device", "monitor", "--config", str(path)], start_new_session=True
    )
    return proc, results, ready


def test_the_command_samples_until_sigterm_and_writes_whole_rows(tmp_path: Path) -> None:
    proc, results, ready = start_monitor(tmp_path)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.5)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - sent < 5  # the wait ends at the signal, not at the next tick
    header = json.loads((results / "monitor.json").read_text())
    with open(results / "monitor.csv", encoding="utf-8") as fh:
        table = list(csv.reader(fh))
    assert table[0] == header["columns"]
    assert len(table) >= 4
    assert all(len(r) == len(table[0]) for r in table[1:])
    times = [int(r[0]) for r in table[1:]]
    assert times == sorted(times) and times[0] > header["origin_mono_ns"]
    assert header["sources"]["throttle_source"] == "sysfs"
    assert {r[-1] for r in table[1:]} == {"0"}


def test_sighup_hands_the_monitor_over_to_a_sweep_s_next_variant(tmp_path: Path) -> None:
    """A sweep's next variant keeps the monitor running and empties its results directory: on SIGHUP
    it writes monitor.json and a monitor.csv of its own again, with only samples taken after it."""
    proc, results, ready = start_monitor(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        (results / "monitor.csv").unlink()  # what the reset between two variants does
        (results / "monitor.json").unlink()
        handed = time.monotonic_ns()
        os.kill(proc.pid, signal.SIGHUP)
        while (
            not (results / "monitor.csv").exists()
            or len((results / "monitor.csv").read_text().splitlines()) < 3
        ):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        assert proc.poll() is None  # still running: SIGHUP is no stop
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    header = json.loads((results / "monitor.json").read_text())
    with open(results / "monitor.csv", encoding="utf-8") as fh:
        table = list(csv.reader(fh))
    assert table[0] == header["columns"]
    assert all(int(r[0]) > handed for r in table[1:])
