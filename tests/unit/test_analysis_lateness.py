"""Start lateness over a sweep: the nearest-rank p99 and max per device, ``dit show`` of several runs
or of a directory of runs, and how each agent waited (recorded from its ``origin.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dit.analysis.lateness import Lateness, lateness_over_runs, percentile_nearest_rank
from dit.cli import app
from dit.run.profile import start_waits
from dit.run.rundir import STATUS, write_json
from dit.runtimes import LaunchOutcome


def test_the_p99_is_the_nearest_rank_never_an_interpolation() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile_nearest_rank(values, 99) == 99
    assert percentile_nearest_rank(values, 50) == 50
    assert percentile_nearest_rank([7, 3, 5], 99) == 7  # fewer than 100 runs: the maximum
    assert percentile_nearest_rank([4], 50) == 4
    with pytest.raises(ValueError, match="no values"):
        percentile_nearest_rank([], 99)
    with pytest.raises(ValueError, match="percentile 0"):
        percentile_nearest_rank([1], 0)


def test_lateness_over_runs_is_per_device_over_the_runs_that_have_it() -> None:
    runs = [{"device1": 100, "device2": 900}, {"device1": 300}, {"device1": 200, "device2": 50}]
    assert lateness_over_runs(runs) == [
        Lateness("device1", 3, 200, 300, 300),
        Lateness("device2", 2, 50, 900, 900),
    ]
    assert lateness_over_runs([]) == []


def fake_run(root: Path, name: str, lateness: dict[str, int], **extra: Any) -> Path:
    run = root / "sweep" / name
    run.mkdir(parents=True)
    status = {"state": "completed", "label": f"sweep[{name}]", "stage_ns": {}, "lateness_ns": lateness}
    write_json(run / STATUS, {**status, **extra})
    return run


def test_show_of_a_sweep_prints_p99_and_max_per_device(tmp_path: Path) -> None:
    fake_run(tmp_path, "20260101T000000Z-aa", {"device1": 150_000, "device2": 2_500_000})
    fake_run(tmp_path, "20260101T000001Z-bb", {"device1": 90_000, "device2": 400_000})
    result = CliRunner().invoke(app, ["show", str(tmp_path / "sweep")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "start lateness over 2 runs" in result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if "│ device" in line}
    # device, runs, median, p99, max
    assert [c.strip() for c in rows["device1"].split("│")[2:6]] == ["2", "90.0 µs", "150 µs", "150 µs"]
    assert [c.strip() for c in rows["device2"].split("│")[2:6]] == ["2", "400 µs", "2.50 ms", "2.50 ms"]
    # several run directories given one by one: the same table
    both = sorted(str(p) for p in (tmp_path / "sweep").iterdir())
    again = CliRunner().invoke(app, ["show", *both], terminal_width=200)
    assert again.exit_code == 0 and "start lateness over 2 runs" in again.output


def test_show_of_one_run_says_how_each_device_waited(tmp_path: Path) -> None:
    wait = {
        "policy": "SCHED_FIFO",
        "priority": 10,
        "wait": "clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME)",
        "prepared_to_start_ns": 1_250_000_000,
        "start_margin_ns": -312_000_000,
    }
    run = fake_run(tmp_path, "20260101T000000Z-aa", {"device1": 120_000}, start_wait={"device1": wait})
    result = CliRunner().invoke(app, ["show", str(run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert (
        "120 µs" in result.output
        and "SCHED_FIFO clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME)" in result.output
    )
    assert (
        "prepared ahead" in result.output and "1.25 s" in result.output
    )  # waited, prepared, for the instant
    # the start task reached the node 312 ms after the instant (the lead was too short for it)
    assert "start task ahead" in result.output and "-312 ms" in result.output


def test_show_of_a_directory_without_runs_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["show", str(tmp_path)])
    assert result.exit_code != 0
    assert "is not a dit run directory and has none under it" in result.output


def test_the_start_wait_is_taken_from_a_result_file_with_start_sched() -> None:
    sched = {"policy": "SCHED_OTHER", "priority": 0, "detail": "not root", "wait": "time.sleep"}
    outcomes = [
        LaunchOutcome(
            "device1", "profile", 0, {"results/origin.json": {"lateness_ns": 5, "start_sched": sched}}
        ),
        LaunchOutcome("device2", "profile", 0, {"results/origin.json": None}),
    ]
    assert start_waits(outcomes) == {"device1": sched}


SUMMARY = {
    "runtime": "echo",
    "tables": ["echo_rtt.csv"],
    "values": [
        {"name": "throughput", "value": 63.04866216641814, "unit": "1/s", "type": "float", "description": ""},
        {
            "name": "rtt_mean",
            "value": 1_234_567,
            "unit": "ns",
            "type": "int",
            "description": "Mean round trip.",
        },
        {"name": "payload", "value": 2048, "unit": "B", "type": "int", "description": ""},
    ],
}


def test_show_prints_the_runtimes_summary_values_in_their_units(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "20260101T000000Z-aa", {})
    (run / "aggregate").mkdir()
    write_json(run / "aggregate" / "summary.json", SUMMARY)
    result = CliRunner().invoke(app, ["show", str(run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "runtime echo" in result.output
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 3}
    assert "63.0 1/s" in lines["throughput"] and "63.048" not in result.output
    assert "1.23 ms" in lines["rtt_mean"] and "Mean round trip." in lines["rtt_mean"]
    assert "2.05 kB" in lines["payload"]


def test_run_log_says_the_runtimes_summary_values_in_their_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dit.analysis import monitors, power_model
    from dit.analysis.run import LoadedRun
    from dit.run import analyse
    from dit.runtimes import Results, SummaryValue

    monkeypatch.setattr(monitors, "aggregate_monitors", lambda run: None)
    monkeypatch.setattr(power_model, "write_power_models", lambda run: None)
    monkeypatch.setattr(analyse, "aggregate_hooks", lambda: [])

    class Stub:
        name = "stub"

        def parse_results(self, run: Any) -> Results:
            return Results(
                tables=(),
                summary=(
                    SummaryValue("throughput", 63.04866216641814, "1/s", "float"),
                    SummaryValue("ttft", 12_345_678, "ns", "int"),
                ),
            )

    said: list[str] = []
    analyse.aggregate(LoadedRun(tmp_path), Stub(), said.append)  # type: ignore[arg-type]
    assert said == ["stub: throughput = 63.0 1/s", "stub: ttft = 12.3 ms"]


def test_the_optimise_stage_says_why_it_is_skipped(tmp_path: Path) -> None:
    from dit.run.analyse import optimise_skipped
    from dit.scenario import expand

    base = {"name": "o", "model": "fake", "devices": ["device1"], "inference": {"enabled": False}}
    (plugin,) = expand({**base, "runtime": {"name": "headsplit"}})
    assert optimise_skipped(plugin) == "no optimiser for runtime headsplit"
    (off,) = expand({**base, "optimisation": {"enabled": False}})
    assert optimise_skipped(off) == "optimisation.enabled is false"
    run = fake_run(
        tmp_path, "20260101T000000Z-aa", {}, skipped={"optimise": "no optimiser for runtime headsplit"}
    )
    result = CliRunner().invoke(app, ["show", str(run)], terminal_width=200)
    assert "optimise: skipped (no optimiser for runtime headsplit)" in result.output
