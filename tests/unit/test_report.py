"""dit report: a run's and a sweep's HTML, every section present, units instead of raw nanoseconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dit import units
from dit.report.build import ReportError, build_report, write_report
from tests.report_fixtures import report_run

SECTIONS = ("facts", "stages", "runtime", "phases", "layers", "feasibility", "monitors", "power",
            "validation", "optimise", "netem")  # fmt: skip


def test_units() -> None:
    assert units.duration(16_710_247) == "16.7 ms"
    assert units.duration(1_960_000_000) == "1.96 s"
    assert units.duration(5_420) == "5.42 µs"
    assert units.duration(219) == "219 ns"
    assert units.duration(None) == units.MISSING == units.duration(float("nan"))
    assert units.size(393_216) == "393 kB"
    assert units.size(0) == "0 B"
    assert units.energy(0.6217) == "622 mJ"
    assert units.energy(1.5) == "1.50 J"
    assert units.power(2.712) == "2.71 W"
    assert units.with_unit(123_456_789, "ns") == "123 ms"
    assert units.with_unit(3.5, "1/s") == "3.50 1/s"
    assert units.with_unit(12, "") == "12"
    assert units.with_unit(1.2e12, "ns^2") == "1.20 ms²"
    assert units.with_unit(0.143, "J*s") == "143 mJ·s"


def test_run_report_has_every_section_with_units(tmp_path: Path) -> None:
    run = report_run(tmp_path / "run")
    html = build_report(run)
    for anchor in SECTIONS:
        assert f'<section id="{anchor}">' in html, anchor
    assert "ab" * 32 in html  # the scenario version
    # stages in run order, readable
    assert html.index(">preflight<") < html.index(">profile<") < html.index(">teardown<")
    assert "1.96 s" in html and "16.0 µs" in html
    # phases of round 0 in ms, a timeline figure inlined, the optimiser's result in ms
    phases = html[html.index('<section id="phases">') : html.index('<section id="layers">')]
    assert re.search(r"<td>\d+(\.\d+)? ms</td>", phases)
    assert "data:image/png;base64," in phases
    assert "exhaustive · total_delay · SJF" in html
    # runtime summary values with their units
    assert "123 ms" in html and "3.50 1/s" in html
    # what the run lacks is said, not left out
    assert "No power trace" in html and "No monitor traces" in html
    # no raw nanosecond counts in table cells (7+ digit integers)
    assert not re.search(r"<td>\d{7,}</td>", html)
    # self-contained: no external resource
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_sweep_report_lists_every_variant_and_plots_along_the_axis(tmp_path: Path) -> None:
    runs = tmp_path / "small"
    runs.mkdir()
    for rtt, speed in ((0, 4.0), (5, 3.0), (15, 2.0)):
        report_run(runs / f"run-{rtt}", [["network.device1.delay_ms", rtt]], speed)
    path = write_report(runs, tmp_path / "sweep.html")
    html = path.read_text()
    assert html.count("<tr><td>run-") == 3
    assert "network.device1.delay_ms" in html
    assert "tokens_per_s along network.device1.delay_ms" in html
    assert "model MAPE along network.device1.delay_ms" in html


def test_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="holds no run directories"):
        build_report(tmp_path)
    with pytest.raises(ReportError, match="is not a directory"):
        build_report(tmp_path / "missing")
