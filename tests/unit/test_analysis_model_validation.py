"""Model validation on the hand-assembled runs: predictions, measured delays, MAPE, files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from dit.analysis.model_validation import VALIDATION_COLUMNS, validate_run, validate_runs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def small(tmp_path: Path) -> Path:
    target = tmp_path / "run_small"
    shutil.copytree(FIXTURES / "run_small", target)
    return target


def test_small_run(small: Path) -> None:
    summary = validate_run(small)
    frame = pd.read_csv(summary.csv_path)
    assert tuple(frame.columns) == VALIDATION_COLUMNS
    got = frame[["round", "vector", "device", "measured_delay_ns", "predicted_delay_ns"]].values.tolist()
    # measured = mean(local + transmission + queue + remote); predicted by hand under SJF (test_analysis_delay.py)
    assert got == [
        [0, "0,1", "device1", 20_000_000, 19_000_000],
        [0, "0,1", "device2", 12_000_000, 11_200_000],
        [1, "2,1", "device1", 10_200_000, 10_200_000],
        [1, "2,1", "device2", 12_500_000, 12_700_000],
        [2, "3,0", "device1", 6_250_000, 6_200_000],
        [2, "3,0", "device2", 12_500_000, 11_500_000],
    ]
    # APEs 5, 6.667, 0, 1.6, 0.8, 8 %
    assert frame["ape_pct"].tolist() == pytest.approx([5.0, 20 / 3, 0.0, 1.6, 0.8, 8.0])
    assert summary.mape_pct == pytest.approx((5 + 20 / 3 + 0 + 1.6 + 0.8 + 8) / 6)
    assert summary.mape_by_device["device1"] == pytest.approx((5 + 0 + 0.8) / 3)
    assert summary.mape_by_policy == {"SJF": pytest.approx(summary.mape_pct)}
    # measured remote = queue + remote: device2 round 1: 1.5 + 2.3 ms (barrier 0, return excluded)
    assert frame.loc[3, "measured_remote_ns"] == 3_800_000
    assert summary.points == 6
    # the edge's executed stages took 1.2x their profiled means, so the in-run remote prediction is 1.2x:
    # 6.6, 3.0, 1.8, 4.8, 0, 3.6 ms against measured 6.0, 2.5, 1.5, 3.8, 0, 3.5 (the zero is skipped)
    assert frame["predicted_remote_inrun_ns"].tolist() == [
        6_600_000,
        3_000_000,
        1_800_000,
        4_800_000,
        0,
        3_600_000,
    ]
    assert summary.remote_mape_inrun_pct == pytest.approx((10 + 20 + 20 + 100 / 3.8 + 100 / 35) / 5)
    assert summary.component_mape_pct["remote"] == pytest.approx(
        (100 * 0.5 / 6 + 0 + 0 + 100 * 0.2 / 3.8 + 100 * 0.5 / 3.5) / 5
    )
    assert summary.png_path == small / "aggregate" / "validation.png"
    assert summary.png_path.read_bytes()[:8] == PNG_MAGIC


def test_without_the_edge_stage_log_there_is_no_in_run_diagnostic(small: Path) -> None:
    (small / "raw" / "edge" / "edge_edge_stages.csv").unlink()
    summary = validate_run(small)
    assert summary.remote_mape_inrun_pct is None
    assert pd.read_csv(summary.csv_path)["predicted_remote_inrun_ns"].isna().all()


def test_barrier_and_return_do_not_count(small: Path) -> None:
    raw = small / "raw" / "device2" / "device2_inference.csv"
    frame = pd.read_csv(raw)
    frame["barrier_ns"] += 7_000_000
    frame["return_ns"] += 3_000_000
    frame["total_ns"] += 10_000_000
    frame.to_csv(raw, index=False)
    summary = validate_run(small)
    assert summary.mape_pct == pytest.approx((5 + 20 / 3 + 0 + 1.6 + 0.8 + 8) / 6)


def test_two_policies_together(tmp_path: Path) -> None:
    runs = []
    for policy in ("RR", "SJF"):
        target = tmp_path / f"run_{policy}"
        shutil.copytree(FIXTURES / "run_small", target)
        scenario = target / "scenario.yaml"
        scenario.write_text(
            scenario.read_text().replace("policy: SJF, nominal", f"policy: {policy}, nominal")
        )
        runs.append(target)
    summary = validate_runs(runs, tmp_path / "report")
    frame = pd.read_csv(summary.csv_path)
    assert set(frame["policy"]) == {"RR", "SJF"}
    # RR round 0 (0, 1): device2's R is 4.0 ms under RR (2.5 under SJF) -> predicted 12.7 ms
    rr = frame[(frame["policy"] == "RR") & (frame["round"] == 0) & (frame["device"] == "device2")]
    assert rr["predicted_delay_ns"].item() == 12_700_000
    assert set(summary.mape_by_policy) == {"RR", "SJF"}
    assert summary.png_path.read_bytes()[:8] == PNG_MAGIC
