"""Model validation on the hand-assembled runs: predictions, measured delays, MAPE, files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from dit.validation import VALIDATION_COLUMNS, validate_run, validate_runs

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
    # measured = mean(local + transmission + queue + remote); predicted by hand under SJF (test_delay.py)
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
    assert summary.png_path == small / "aggregate" / "validation.png"
    assert summary.png_path.read_bytes()[:8] == PNG_MAGIC


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
