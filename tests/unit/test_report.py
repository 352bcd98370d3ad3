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
    assert units.with_unit(12.5, "J*s") == "12.5 J·s"  # not 12500 mJ·s


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


def _fake_power(run: Path) -> None:
    """device1's power from local mode's fake sensor, as aggregate_monitors writes it (power_summary.csv)."""
    import json

    import pandas as pd

    agg = run / "aggregate"
    (agg / "power_summary.csv").write_text(
        "node,sensor,samples,duration_ns,energy_j,mean_power_w\ndevice1,fake,40,9750000000,26.3,2.7\n"
        "edge,ina260,40,9750000000,50.0,5.1\n"
    )
    (agg / "monitors.csv").write_text(
        "node,t_ns,metric,value\n" + "".join(f"device1,{i * 250_000_000},power_w,2.{i}\n" for i in range(9))
    )
    (agg / "energy.csv").write_text(
        "device,round,repetition,partition_point,start_ns,total_ns,energy_j,mean_power_w,samples,tokens,"
        "energy_per_token_j,edp_js\ndevice1,0,0,0,0,14000000,0.04,2.7,3,,,0.00056\n"
    )
    validation = pd.read_csv(agg / "validation.csv")
    validation["energy_ape_pct"] = 5.7
    validation.to_csv(agg / "validation.csv", index=False)
    # an energy optimum under RR: the run measured SJF, so a prediction, over a fake sensor's energy
    own = next((run / "optimise").glob("*.json"))
    result = json.loads(own.read_text())
    result.update(objective="energy", objective_value=0.04, objective_unit="J", policy="RR")
    (run / "optimise" / "exhaustive-energy-RR.json").write_text(json.dumps(result))


def _section(html: str, anchor: str) -> str:
    start = html.index(f'<section id="{anchor}">')
    return html[start : html.index("</section>", start)]


def test_fake_sensor_power_and_energy_are_labelled(tmp_path: Path) -> None:
    """Issue 36 item 2: every power/energy figure from a fake sensor says so; a real sensor's does not."""
    run = report_run(tmp_path / "run")
    _fake_power(run)
    html = build_report(run)
    power = _section(html, "power")
    assert "Fake power sensor on device1 (local mode)" in power and "not measured" in power
    assert "<td>device1 (modelled: fake sensor)</td><td>fake</td>" in power  # the energy table's row
    assert "power trace (fake sensor: modelled, not measured)" in power
    assert "edge (modelled" not in html  # the INA260 node is not labelled fake
    validation = _section(html, "validation")
    assert "energy model MAPE 5.70 % against a fake power sensor on device1" in validation
    optimise = _section(html, "optimise")
    assert 'class="badge fake-sensor"' in optimise


def test_report_marks_predictions(tmp_path: Path) -> None:
    """Issue 36 item 2: a policy the run did not measure keeps its "prediction" badge, as on the run page."""
    run = report_run(tmp_path / "run")
    _fake_power(run)
    optimise = _section(build_report(run), "optimise")
    tables = optimise.split("<table>")[1:]
    measured = next(t for t in tables if "· SJF:" in t)
    predicted = next(t for t in tables if "· RR:" in t)
    assert "badge prediction" not in measured  # the edge server ran SJF: measured
    assert '<span class="badge prediction"' in predicted
    assert "the edge server ran SJF during the run, not RR" in predicted


def test_report_of_a_run_without_power_labels_nothing(tmp_path: Path) -> None:
    html = build_report(report_run(tmp_path / "run")).lower()
    assert "fake sensor" not in html and "fake power" not in html


def _skipped_run(target: Path, reason: str) -> Path:
    """A finished run whose optimise stage the driver skipped: status.json says why, optimise/ is empty."""
    import json
    import shutil

    run = report_run(target)
    shutil.rmtree(run / "optimise")
    status = json.loads((run / "status.json").read_text())
    status["skipped"] = {"optimise": reason}
    (run / "status.json").write_text(json.dumps(status))
    return run


def test_a_skipped_optimise_stage_says_why_in_the_report_and_on_the_run_page(tmp_path: Path) -> None:
    """Issue 33 item 5: the reason from status.json, never a bare missing section; a reason is text."""
    from dit.run.rundir import RunDir
    from dit.web.services import runs as runs_mod
    from dit.web.services.store import Store

    run = _skipped_run(
        tmp_path / "runs" / "echo" / "20261201T100000Z-dddddddd", "no optimiser for runtime <b>echo</b>"
    )
    html = build_report(run)
    shown = "optimise: skipped (no optimiser for runtime &lt;b&gt;echo&lt;/b&gt;)"
    assert shown in _section(html, "optimise")
    assert "The optimiser did not run" not in html
    stages = _section(html, "stages")  # the stage keeps its row, in run order, with the reason
    assert "<td>optimise</td><td>skipped (no optimiser for runtime &lt;b&gt;echo&lt;/b&gt;)</td>" in stages
    assert stages.index(">profile<") < stages.index(">optimise<") < stages.index(">teardown<")
    assert "<b>echo</b>" not in html

    detail = runs_mod.run_detail(RunDir(run), tmp_path / "runs", Store(tmp_path / "store.db"))
    assert [s["stage"] for s in detail["stages"]] == ["preflight", "profile", "optimise", "teardown"]
    # raw text in the JSON: the page sets it as a text node (api.js el), so no markup is interpreted
    assert detail["stages"][2] == {
        "stage": "optimise", "ns": None, "text": "skipped (no optimiser for runtime <b>echo</b>)",
        "skipped": "no optimiser for runtime <b>echo</b>",
    }  # fmt: skip
    assert detail["skipped"] == [
        {"stage": "optimise", "reason": "no optimiser for runtime <b>echo</b>",
         "text": "optimise: skipped (no optimiser for runtime <b>echo</b>)"}
    ]  # fmt: skip
