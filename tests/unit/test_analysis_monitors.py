"""aggregate_monitors on hand-built run directories: alignment, throttling, exact energy integrals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dit.analysis.monitors import aggregate_monitors, energy_between, energy_between_wall

S = 1_000_000_000
START = 1_700_000_000 * S  # the common start instant (wall ns)


def put(run: Path, host: str, name: str, content: object) -> None:
    d = run / "raw" / host
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{host}_{name}"
    if isinstance(content, pd.DataFrame):
        content.to_csv(path, index=False)
    else:
        path.write_text(json.dumps(content), encoding="utf-8")


def origin(wall: int, mono: int, start_at: int | None = START) -> dict[str, object]:
    return {"origin_wall_ns": wall, "origin_mono_ns": mono, "start_at_ns": start_at}


def monitor_frame(t_mono: list[int], throttled: list[object], temp: float = 45.0) -> pd.DataFrame:
    n = len(t_mono)
    return pd.DataFrame(
        {
            "t_mono_ns": t_mono,
            "cpu_pct": [10.0 * (i + 1) for i in range(n)],
            "cpu0_pct": [5.0] * n,
            "thermal_zone0_temp_c": [temp + i for i in range(n)],
            "cpu0_freq_khz": [1_800_000] * (n - 1) + [1_500_000],
            "throttled": throttled,
        }
    )


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    # device1 started 2 ms late: origin wall = START + 2 ms at mono 50 s.
    put(run, "device1", "origin.json", origin(START + 2_000_000, 50 * S))
    put(
        run,
        "device1",
        "monitor.json",
        {"origin_wall_ns": 0, "origin_mono_ns": 0, "sources": {"throttle_source": "sysfs"}},
    )
    put(
        run,
        "device1",
        "monitor.csv",
        monitor_frame([49 * S, 50 * S, 51 * S, 52 * S], [0x50000, 0x50000, 0x50005, 0x50000]),
    )
    # power: P = 2 W + 1 W/s * (t - origin), samples every second from origin - 1 s to origin + 8 s.
    t = [50 * S + k * S for k in range(-1, 9)]
    put(
        run,
        "device1",
        "power.csv",
        pd.DataFrame(
            {"t_mono_ns": t, "current_a": 0.5, "voltage_v": 5.0, "power_w": [2.0 + k for k in range(-1, 9)]}
        ),
    )
    put(run, "device1", "power.json", {"origin_wall_ns": 0, "origin_mono_ns": 0, "sensor": "fake"})
    put(
        run,
        "device1",
        "inference.csv",
        pd.DataFrame(
            {
                "round": [0, 0, 1],
                "repetition": [0, 1, 0],
                "partition_point": [2, 2, 4],
                "start_ns": [S, S // 2 * 3, 7 * S],
                "total_ns": [2 * S, S, 5 * S],  # the last one runs past the trace
                "tokens": [4, 0, 1],
            }
        ),
    )
    put(run, "device1", "load.json", {"origin_wall_ns": START - 10 * S, "origin_mono_ns": 40 * S})
    put(
        run,
        "device1",
        "load.csv",
        pd.DataFrame(
            {
                "t_mono_ns": [45 * S, 55 * S, 56 * S],
                "event": ["start", "target", "stop"],
                "mode": "continuous",
                "cpu_pct": [12.5, 17.0, None],
                "mem_pct": [15.0, 11.0, None],
                "mem_bytes": [100, 200, 0],
                "clamped": 0,
                "processes": 0,
                "core": 1,
            }
        ),
    )
    # device2: on time, an occurred bit that rises during the run, no power trace.
    put(run, "device2", "origin.json", origin(START, 7 * S))
    put(run, "device2", "monitor.csv", monitor_frame([8 * S, 9 * S], [0, 0x20000]))
    put(
        run,
        "device2",
        "monitor.json",
        {"origin_wall_ns": 0, "origin_mono_ns": 0, "sources": {"throttle_source": "vcgencmd"}},
    )
    # device3: under-voltage happened before the run (occurred bit set from the first sample) only.
    put(run, "device3", "origin.json", origin(START, 0))
    put(run, "device3", "monitor.csv", monitor_frame([S, 2 * S], [0x10000, 0x10000]))
    # edge: its origin has no start instant (taken when the service started, 3 s before START).
    put(run, "edge", "origin.json", origin(START - 3 * S, 100 * S, start_at=None))
    put(run, "edge", "monitor.csv", monitor_frame([104 * S, 105 * S], [None, None]))
    put(
        run,
        "edge",
        "monitor.json",
        {"origin_wall_ns": 0, "origin_mono_ns": 0, "sources": {"throttle_source": "none"}},
    )
    return run


def test_traces_are_aligned_on_the_common_start_instant(run: Path) -> None:
    aggregate_monitors(run)
    table = pd.read_csv(run / "aggregate" / "monitors.csv")
    assert list(table.columns) == ["node", "t_ns", "metric", "value"]
    assert pd.api.types.is_integer_dtype(table["t_ns"])

    def t_of(node: str, metric: str) -> list[int]:
        return table[(table.node == node) & (table.metric == metric)]["t_ns"].tolist()

    # device1: mono 49 s is 1 s before its origin, which was 2 ms after the start instant.
    assert t_of("device1", "cpu_pct") == [-S + 2_000_000, 2_000_000, S + 2_000_000, 2 * S + 2_000_000]
    assert t_of("device2", "cpu_pct") == [S, 2 * S]
    # the edge's origin is 3 s before the start: mono 104 s = origin + 4 s = start + 1 s.
    assert t_of("edge", "cpu_pct") == [S, 2 * S]
    # power, on device1's origin too
    power = table[(table.node == "device1") & (table.metric == "power_w")]
    assert power["t_ns"].iloc[1] == 2_000_000 and power["value"].iloc[1] == 2.0
    # load targets: the stop row is not a target; the load's own header is not used (origin.json wins)
    cpu_target = table[(table.node == "device1") & (table.metric == "load_cpu_target_pct")]
    assert cpu_target["t_ns"].tolist() == [-5 * S + 2_000_000, 5 * S + 2_000_000]
    assert cpu_target["value"].tolist() == [12.5, 17.0]
    # empty cells are left out (the edge has no throttling flags)
    assert t_of("edge", "throttled") == []
    assert (table.groupby("node")["t_ns"].apply(lambda s: s.is_monotonic_increasing)).all()


def test_throttling_report_per_node(run: Path) -> None:
    aggregate_monitors(run)
    report = pd.read_csv(run / "aggregate" / "throttling.csv").set_index("node")
    d1 = report.loc["device1"]
    assert bool(d1.throttled_during_run) and bool(d1.under_voltage) and bool(d1.throttled)
    assert not bool(d1.freq_capped) and not bool(d1.soft_temp_limit)
    assert d1.flags_seen == "0x50005" and d1.flags_at_start == "0x50000"
    assert d1.samples == 4 and d1.source == "sysfs"
    assert d1.max_temp_c == 48.0 and d1.min_freq_khz == 1_500_000
    d2 = report.loc["device2"]
    assert bool(d2.throttled_during_run) and bool(d2.freq_capped) and not bool(d2.under_voltage)
    d3 = report.loc["device3"]
    assert not bool(d3.throttled_during_run) and d3.flags_at_start == "0x10000"
    assert math.isnan(report.loc["edge"].throttled_during_run)


def test_energy_per_inference_is_the_exact_integral(run: Path) -> None:
    aggregate_monitors(run)
    energy = pd.read_csv(run / "aggregate" / "energy.csv")
    assert list(energy.device.unique()) == ["device1"]
    first, second, outside = energy.to_dict("records")
    # P(t) = 2 + t (t in s since the device origin): over [1, 3] s, 2*2 + (9 - 1)/2 = 8 J
    assert first["energy_j"] == pytest.approx(8.0, rel=1e-12)
    assert first["mean_power_w"] == pytest.approx(4.0, rel=1e-12)
    assert first["edp_js"] == pytest.approx(16.0, rel=1e-12)
    assert first["energy_per_token_j"] == pytest.approx(2.0, rel=1e-12)
    assert first["samples"] == 1  # only t = 2 s is strictly inside
    # over [1.5, 2.5] s (bounds between samples, interpolated): 2*1 + (6.25 - 2.25)/2 = 4 J
    assert second["energy_j"] == pytest.approx(4.0, rel=1e-12)
    assert math.isnan(second["energy_per_token_j"])  # zero tokens
    assert math.isnan(outside["energy_j"]) and math.isnan(outside["edp_js"])
    summary = pd.read_csv(run / "aggregate" / "power_summary.csv").set_index("node")
    # the whole trace: t from -1 to 8 s, P = 2 + t: 2*9 + (64 - 1)/2 = 49.5 J
    assert summary.loc["device1"].energy_j == pytest.approx(49.5, rel=1e-12)
    assert summary.loc["device1"].duration_ns == 9 * S
    assert summary.loc["device1"].sensor == "fake"


def test_energy_between_a_step_trace() -> None:
    t = np.array([0, S, 2 * S, 3 * S], dtype=np.int64)
    p = np.array([1.0, 1.0, 3.0, 3.0])
    got = energy_between(t, p, np.array([0, S // 2, 0]), np.array([3 * S, 2 * S, 4 * S]))
    assert got[0] == pytest.approx(1.0 + 2.0 + 3.0)
    assert got[1] == pytest.approx(0.5 + 2.0)
    assert math.isnan(got[2])


def test_energy_over_a_wall_clock_interval_uses_the_traces_own_origin(tmp_path: Path) -> None:
    # power 1 W for the first second of the trace, 3 W after; the trace's monotonic 0 is START - 10 s
    frame = pd.DataFrame({"t_mono_ns": [0, S, 2 * S, 3 * S], "power_w": [1.0, 1.0, 3.0, 3.0]})
    put(tmp_path, "board", "power.csv", frame)
    put(tmp_path, "board", "power.json", {"origin_wall_ns": START, "origin_mono_ns": 10 * S})
    assert energy_between_wall(tmp_path, "board", START - 10 * S, START - 7 * S) == pytest.approx(6.0)
    assert energy_between_wall(tmp_path, "board", START - 10 * S + S // 2, START - 8 * S) == pytest.approx(
        2.5
    )
    assert math.isnan(energy_between_wall(tmp_path, "board", START, START + S) or 0.0)  # after the trace
    assert energy_between_wall(tmp_path, "nowhere", START, START + S) is None


def test_a_run_without_traces_writes_empty_tables(tmp_path: Path) -> None:
    run = tmp_path / "run"
    put(run, "device1", "origin.json", origin(START, 0))
    aggregate_monitors(run)
    for name in ("monitors.csv", "throttling.csv", "energy.csv", "power_summary.csv"):
        frame = pd.read_csv(run / "aggregate" / name)
        assert frame.empty, name
