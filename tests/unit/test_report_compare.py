"""Runs side by side (issue 36 item 9): `dit report RUN RUN`, NNPM's Compare."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dit.report.compare import CompareError, build_comparison, load, scenario_differences, side_by_side
from dit.units import MISSING
from tests.report_fixtures import report_run


def _with_document(run: Path, document: dict[str, Any], label: str) -> Path:
    meta = json.loads((run / "metadata.json").read_text())
    meta["scenario"].update(document=document, label=label)
    (run / "metadata.json").write_text(json.dumps(meta))
    return run


def _two(tmp_path: Path) -> tuple[Path, Path]:
    base = {"name": "small", "devices": ["device1", "device2"], "edge_server": {"policy": "SJF"}}
    a = _with_document(report_run(tmp_path / "a", tokens_per_s=4.0), base, "small")
    b = report_run(tmp_path / "b", tokens_per_s=2.0)
    other = {**base, "edge_server": {"policy": "RR"}, "network": {"device1": {"delay_ms": 20}}}
    _with_document(b, other, "small-rr")
    (b / "status.json").write_text(
        json.dumps({**json.loads((b / "status.json").read_text()), "state": "stopped"})
    )
    return a, b


def test_two_runs_side_by_side_with_their_figures_in_units(tmp_path: Path) -> None:
    a, b = _two(tmp_path)
    rows = {row[0]: row[1:] for row in side_by_side(load([a, b]))}
    assert rows["state"] == ("completed", "stopped")
    assert rows["policy"] == ("SJF", "RR")
    assert rows["runtime: tokens_per_s"] == ("4.00 1/s", "2.00 1/s")
    assert rows["runtime: token_p99"] == ("123 ms", "123 ms")
    assert re.fullmatch(r"\d+(\.\d+)? ms", rows["mean end to end (D)"][0])
    assert rows["optimum exhaustive-total_delay-SJF"][0].startswith("[")
    assert rows["energy (all nodes)"] == (
        MISSING,
        MISSING,
    )  # no power trace in these runs: a dash, not a zero


def test_scenario_differences_list_only_the_paths_that_differ(tmp_path: Path) -> None:
    a, b = _two(tmp_path)
    rows = scenario_differences(load([a, b]))
    assert rows == [("edge_server.policy", "SJF", "RR"), ("network.device1.delay_ms", MISSING, "20")]


def test_the_comparison_report_is_one_self_contained_page(tmp_path: Path) -> None:
    a, b = _two(tmp_path)
    (a / "aggregate" / "power_summary.csv").write_text(
        "node,sensor,samples,duration_ns,energy_j,mean_power_w\ndevice1,fake,40,9750000000,26.3,2.7\n"
    )
    html = build_comparison([a, b])
    assert '<section id="side-by-side">' in html and '<section id="scenario-differences">' in html
    assert "small vs small-rr — compared" in html
    assert "26.3 J (fake sensor: modelled, not measured)" in html
    assert "Fake power sensor on device1" in html
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_fewer_than_two_a_non_run_or_the_same_run_twice_is_refused(tmp_path: Path) -> None:
    a, _ = _two(tmp_path)
    with pytest.raises(CompareError, match="two or more"):
        load([a])
    with pytest.raises(CompareError, match="is not a run directory"):
        load([a, tmp_path])
    with pytest.raises(CompareError, match="given twice"):
        load([a, tmp_path / "b" / ".." / "a"])


def test_dit_report_of_several_runs_writes_the_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from dit.cli import app

    a, b = _two(tmp_path)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["report", str(a), str(b)])
    assert done.exit_code == 0, done.output
    assert "compare.html" in done.output and "small vs small-rr" in (tmp_path / "compare.html").read_text()
    refused = CliRunner().invoke(app, ["report", str(a), str(b), "--round", "1"])
    assert refused.exit_code != 0 and "--round: a comparison has no phase timeline" in refused.output
    twice = CliRunner().invoke(app, ["report", str(a), str(a)])
    assert twice.exit_code != 0 and "given twice" in twice.output
