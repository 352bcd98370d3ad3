"""The aggregate stage on the hand-assembled run directories under tests/fixtures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dit.analysis.aggregate import aggregate_run, read_model_inputs
from dit.analysis.feasibility import FEASIBILITY_COLUMNS, feasibility
from dit.analysis.layers import LAYERS_COLUMNS
from dit.analysis.links import DEFAULT_RATE_BPS, LINKS_COLUMNS, fitted_rate_bps, iperf3_rate_bps
from dit.analysis.run import AggregateError, round_vectors

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000
MIB = 1024 * 1024


def copy_run(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target)
    return target


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return copy_run(tmp_path, "run_small")


@pytest.fixture
def fallback(tmp_path: Path) -> Path:
    return copy_run(tmp_path, "run_fallback")


def rows(path: Path) -> list[dict[str, str]]:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    return frame.to_dict(orient="records")  # type: ignore[return-value]


def test_layers_means_peaks_and_cumulative(small: Path) -> None:
    summary = aggregate_run(small)
    assert summary.edge_source == "profile"
    assert summary.num_stages == 3
    frame = pd.read_csv(small / "aggregate" / "layers.csv")
    assert tuple(frame.columns) == LAYERS_COLUMNS
    assert frame["host"].tolist() == ["device1"] * 4 + ["device2"] * 4 + ["edge"] * 4
    d1 = frame[frame["host"] == "device1"]
    # means of (1.0, 1.2), (2.0, 2.2), (3.0, 3.0) ms; cumulative 1.1, 3.2, 6.2 ms
    assert d1["latency_ns"].tolist() == [0, 1_100_000, 2_100_000, 3_000_000]
    assert d1["cum_latency_ns"].tolist() == [0, 1_100_000, 3_200_000, 6_200_000]
    assert d1["output_bytes"].tolist() == [12000, 8000, 4000, 400]
    # peaks are maxima over repetitions: cpu max(40, 50), max(60, 55), max(70, 80); memory 10, 20, 15 MiB
    assert d1["peak_cpu_pct"].tolist() == [0.0, 50.0, 60.0, 80.0]
    assert d1["peak_mem_bytes"].tolist() == [0, 10 * MIB, 20 * MIB, 15 * MIB]
    assert d1["ops"].tolist() == [0, 100, 200, 300]
    edge = frame[frame["host"] == "edge"]
    assert edge["latency_ns"].tolist() == [0, 500_000, 1_000_000, 1_500_000]
    assert edge["cum_latency_ns"].tolist() == [0, 500_000, 1_500_000, 3_000_000]


def test_feasibility_file(small: Path) -> None:
    summary = aggregate_run(small)
    got = rows(small / "aggregate" / "feasibility.csv")
    assert tuple(got[0]) == FEASIBILITY_COLUMNS
    # device1: cumulative cpu 50, 60, 80 against a 75 % budget -> p = 2, cpu binds (memory fits 64 MiB)
    assert got[0] == {
        "device": "device1",
        "max_partition_point": "2",
        "binding_constraint": "cpu",
        "memory_limit_bytes": str(64 * MIB),
        "peak_mem_bytes_at_max": str(20 * MIB),
        "cpu_budget_pct": "75.0",
        "peak_cpu_pct_at_max": "60.0",
    }
    # device2: cumulative memory 30, 50, 50 MiB against 48 MiB -> p = 1, memory binds; no cpu budget
    assert got[1] == {
        "device": "device2",
        "max_partition_point": "1",
        "binding_constraint": "memory",
        "memory_limit_bytes": str(48 * MIB),
        "peak_mem_bytes_at_max": str(30 * MIB),
        "cpu_budget_pct": "",
        "peak_cpu_pct_at_max": "91.0",
    }
    assert summary.feasibility["device2"].max_partition_point == 1


def test_links_file_with_iperf3_and_scenario_cap(small: Path) -> None:
    summary = aggregate_run(small)
    got = rows(small / "aggregate" / "links.csv")
    assert tuple(got[0]) == LINKS_COLUMNS
    # device1: RTTs 2, 4 and eight 3 ms: mean 3, std sqrt(0.2) ms; iperf3 sum_received 8 Mbit/s beats the
    # scenario's 10 Mbit/s cap
    assert got[0] == {
        "device": "device1",
        "target": "edge",
        "rtt_ns_mean": "3000000",
        "rtt_ns_min": "2000000",
        "rtt_ns_max": "4000000",
        "rtt_ns_std": "447214",
        "rate_bps": "8000000.0",
        "rate_source": "iperf3",
    }
    # device2: nine 5 ms pings (one lost), no iperf3: the scenario's 16 Mbit/s cap
    assert got[1]["rtt_ns_mean"] == "5000000"
    assert got[1]["rtt_ns_std"] == "0"
    assert (got[1]["rate_bps"], got[1]["rate_source"]) == ("16000000.0", "scenario_cap")
    assert summary.rate_sources == {"device1": "iperf3", "device2": "scenario_cap"}


def test_phases_and_summary(small: Path) -> None:
    aggregate_run(small)
    phases = pd.read_csv(small / "aggregate" / "phases.csv")
    assert phases.columns[0] == "host"
    assert len(phases) == 12
    assert phases.groupby("host").size().to_dict() == {"device1": 6, "device2": 6}
    summary = pd.read_csv(small / "aggregate" / "phases_summary.csv")
    first = summary.iloc[0].to_dict()
    assert (first["host"], first["round"], first["partition_point"], first["n"]) == ("device1", 0, 0, 2)
    assert first["transmission_ns"] == 14_000_000  # mean of 13.9 and 14.1 ms
    assert first["total_ns"] == 20_250_000
    # ack_overlap_ns is not a phase, but it is kept in phases.csv and averaged: (0 + 40 us) / 2
    assert "ack_overlap_ns" in phases.columns
    assert first["ack_overlap_ns"] == 20_000
    last_local = summary[(summary["host"] == "device1") & (summary["round"] == 2)]["local_ns"].item()
    assert last_local == 6_250_000


def test_model_read_back(small: Path) -> None:
    aggregate_run(small)
    model = read_model_inputs(small)
    assert model.devices == ("device1", "device2")
    assert model.edge_stage_ns == (500_000, 1_000_000, 1_500_000)
    assert model.cum_latency_ns[1] == (0, 2_200_000, 6_400_000, 12_400_000)
    assert model.cut_bytes[0] == (12000, 8000, 4000, 400)
    assert model.rate_bps == (8e6, 16e6)
    assert model.rtt_ns == (3 * MS, 5 * MS)
    assert model.bounds == (2, 1)


def test_edge_fallback_rate_fit_and_default(fallback: Path) -> None:
    summary = aggregate_run(fallback)
    # no edge profile: device shape m = (1.65, 3.15, 4.5) ms, requests' remote_ns sum to 11.4 ms against a
    # shape sum of 45.6 ms -> c = 0.25
    assert summary.edge_source == "requests_scaled"
    assert any("edge_layers.csv is missing" in note for note in summary.notes)
    layers = pd.read_csv(fallback / "aggregate" / "layers.csv")
    edge = layers[layers["host"] == "edge"]
    assert edge["latency_ns"].tolist() == [0, 412_500, 787_500, 1_125_000]
    assert edge["peak_mem_bytes"].isna().all()
    links = rows(fallback / "aggregate" / "links.csv")
    # pi1: least squares over (12000 B, 12.9 / 13.1 ms), (4000 B, 4.95 / 5.05 ms): 1000 ns per byte
    assert (links[0]["rate_bps"], links[0]["rate_source"]) == ("8000000.0", "fit")
    # pi2: iperf3 failed, no cap, one request size: the default
    assert (float(links[1]["rate_bps"]), links[1]["rate_source"]) == (DEFAULT_RATE_BPS, "default")
    feas = rows(fallback / "aggregate" / "feasibility.csv")
    assert [(f["max_partition_point"], f["binding_constraint"], f["memory_limit_bytes"]) for f in feas] == [
        ("3", "none", ""),
        ("3", "none", ""),
    ]


def test_edge_fallback_without_requests_fails_clearly(fallback: Path) -> None:
    (fallback / "raw" / "edge" / "edge_edge_requests.csv").unlink()
    with pytest.raises(AggregateError, match="profile_capacity: true"):
        aggregate_run(fallback)


def test_missing_device_layers(small: Path) -> None:
    (small / "raw" / "device2" / "device2_layers.csv").unlink()
    with pytest.raises(AggregateError, match=r"device2_layers\.csv is missing"):
        aggregate_run(small)


def test_missing_ping_leaves_rtt_empty_and_optimise_input_fails(small: Path) -> None:
    (small / "raw" / "device2" / "device2_ping.json").unlink()
    summary = aggregate_run(small)
    assert "device2: no RTT measured towards edge" in summary.notes
    links = rows(small / "aggregate" / "links.csv")
    assert links[1]["rtt_ns_mean"] == ""
    with pytest.raises(AggregateError, match="device2 rtt_ns_mean"):
        read_model_inputs(small)


def test_iperf3_parsing() -> None:
    assert iperf3_rate_bps({"end": {"sum_received": {"bits_per_second": 1.5e7}}}) == 1.5e7
    assert iperf3_rate_bps({"end": {"sum": {"bits_per_second": 2e6, "lost_percent": 0.1}}}) == 2e6
    assert iperf3_rate_bps({"end": {}, "error": "unable to connect"}) is None
    assert iperf3_rate_bps(["not", "a", "result"]) is None


def test_fit_needs_two_sizes_and_a_positive_slope() -> None:
    same = pd.DataFrame({"request_bytes": [100, 100], "transmission_ns": [5, 6]})
    assert fitted_rate_bps(same) is None
    falling = pd.DataFrame({"request_bytes": [100, 200], "transmission_ns": [6, 5]})
    assert fitted_rate_bps(falling) is None
    # 2 ns per byte -> 4 Gbit/s
    rising = pd.DataFrame({"request_bytes": [0, 100, 200], "transmission_ns": [999, 1000, 1400]})
    assert fitted_rate_bps(rising.iloc[1:]) == pytest.approx(8e9 / 4)


def test_feasibility_both_constraints_at_once_report_memory() -> None:
    layers = pd.DataFrame(
        {"stage": [0, 1, 2], "peak_cpu_pct": [0.0, 10.0, 90.0], "peak_mem_bytes": [0, MIB, 9 * MIB]}
    )
    got = feasibility("d", layers, memory_limit_mb=4, cpu_budget_pct=50)
    assert (got.max_partition_point, got.binding_constraint, got.peak_mem_bytes_at_max) == (1, "memory", MIB)
    # nothing fits: p = 0 is always feasible
    got = feasibility("d", layers, memory_limit_mb=0.5, cpu_budget_pct=None)
    assert (got.max_partition_point, got.binding_constraint, got.peak_mem_bytes_at_max) == (0, "memory", 0)


def test_round_vectors() -> None:
    assert round_vectors({"devices": ["a", "b"], "inference": {"partition_points": [0, 2]}}) == [
        (0, 0),
        (2, 2),
    ]
    assert round_vectors({"devices": ["a", "b"], "inference": {"partition_points": [[0, 3]]}}) == [(0, 3)]
    with pytest.raises(AggregateError, match=r"inference.partition_points\[0\]"):
        round_vectors({"devices": ["a", "b"], "inference": {"partition_points": [[0, 3, 1]]}})


def test_ping_list_of_targets(small: Path) -> None:
    ping = small / "raw" / "device2" / "device2_ping.json"
    one = json.loads(ping.read_text())
    other = dict(one, target="device1", rtt_ns=[1_000_000, 3_000_000])
    ping.write_text(json.dumps([one, other]))
    aggregate_run(small)
    links = rows(small / "aggregate" / "links.csv")
    assert [(r["device"], r["target"], r["rtt_ns_mean"]) for r in links] == [
        ("device1", "edge", "3000000"),
        ("device2", "edge", "5000000"),
        ("device2", "device1", "2000000"),
    ]
    assert read_model_inputs(small).rtt_ns == (3 * MS, 5 * MS)


def test_points_from_hand_built_stage_timings() -> None:
    from dit.analysis.points import POINTS_COLUMNS, points_rows

    device = pd.DataFrame(
        {
            "host": "d",
            "stage": [0, 1, 2, 3],
            "latency_ns": [0, 1 * MS, 2 * MS, 4 * MS],
            "output_bytes": [1000, 800, 600, 10],
            "ops": [0, 10, 20, 40],
            "peak_mem_bytes": [5 * MIB, 30 * MIB, 20 * MIB, 40 * MIB],
            "peak_cpu_pct": [0.0, 90.0, 120.0, 100.0],
        }
    )
    edge = pd.DataFrame(
        {
            "host": "edge",
            "stage": [0, 1, 2, 3],
            "latency_ns": [0, MS // 10, MS // 5, MS // 2],
            "output_bytes": [1000, 800, 600, 10],
            "ops": [0, 10, 20, 40],
            "peak_mem_bytes": [0, 300 * MIB, 200 * MIB, 100 * MIB],
            "peak_cpu_pct": [0.0, 350.0, 380.0, 200.0],
        }
    )
    got = points_rows("d", device, edge)
    assert tuple(got.columns) == POINTS_COLUMNS
    assert got["point"].tolist() == [0, 1, 2, 3]
    assert got["local_latency_ns"].tolist() == [0, 1 * MS, 3 * MS, 7 * MS]
    assert got["local_ops"].tolist() == [0, 10, 30, 70]
    assert got["local_peak_mem_bytes"].tolist() == [0, 30 * MIB, 30 * MIB, 40 * MIB]
    assert got["local_peak_cpu_pct"].tolist() == [0.0, 90.0, 120.0, 120.0]
    assert got["cut_bytes"].tolist() == [1000, 800, 600, 0]
    assert got["remote_latency_ns"].tolist() == [800_000, 700_000, 500_000, 0]
    assert got["remote_ops"].tolist() == [70, 60, 40, 0]
    assert got["remote_peak_mem_bytes"].tolist() == [300 * MIB, 200 * MIB, 100 * MIB, 0]
    assert got["remote_peak_cpu_pct"].tolist() == [380.0, 380.0, 200.0, 0.0]
    # edge peaks not measured (estimated from requests): remote peaks empty, except p = N (nothing remote)
    unmeasured = edge.assign(peak_mem_bytes=np.full(4, np.nan), peak_cpu_pct=np.full(4, np.nan))
    est = points_rows("d", device, unmeasured)
    assert est["remote_peak_mem_bytes"].isna().tolist() == [True, True, True, False]
    assert est["remote_latency_ns"].tolist() == [800_000, 700_000, 500_000, 0]


def test_points_file_in_the_aggregate(small: Path) -> None:
    aggregate_run(small)
    frame = pd.read_csv(small / "aggregate" / "points.csv")
    d1 = frame[frame["device"] == "device1"]
    assert d1["local_latency_ns"].tolist() == [0, 1_100_000, 3_200_000, 6_200_000]
    assert d1["cut_bytes"].tolist() == [12000, 8000, 4000, 0]
    assert d1["remote_latency_ns"].tolist() == [3_000_000, 2_500_000, 1_500_000, 0]
    assert frame["device"].tolist() == ["device1"] * 4 + ["device2"] * 4
