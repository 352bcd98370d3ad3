"""Issue 36 item 2: a fake sensor's power and energy are labelled wherever they are shown.

The run page's optimiser view, ``dit show`` and the labels themselves, on the report fixture run
(tests/report_fixtures.py) with device1's power from local mode's fake sensor; no driver, no browser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dit.cli import app
from dit.report import labels
from dit.web.services import runpage
from tests.report_fixtures import report_run
from tests.unit.test_report import _fake_power, _section


def test_power_sensors_read_from_power_summary(tmp_path: Path) -> None:
    run = report_run(tmp_path / "run")
    assert labels.power_sensors(run / "aggregate") == {}  # no trace: nothing to label
    assert labels.fake_sensor_note([]) == ""
    _fake_power(run)
    assert labels.power_sensors(run / "aggregate") == {"device1": "fake", "edge": "ina260"}
    assert labels.fake_power_nodes(run / "aggregate") == ["device1"]


def test_optimise_view_labels_energy_from_a_fake_sensor() -> None:
    settings = {"measured_policy": "SJF"}
    energy = {"objective": "energy", "objective_value": 0.04, "objective_unit": "J", "policy": "SJF",
              "per_device": [{"device": "device1", "L_ns": 1, "E_j": 0.04}]}  # fmt: skip
    view = runpage.optimise_view(energy, settings, ["device1"])
    assert view["measured"] is True
    assert "Fake power sensor on device1" in view["energy_note"]
    assert "energy_note" not in runpage.optimise_view(energy, settings, [])  # a real sensor: no label
    delay = {**energy, "objective": "total_delay", "per_device": [{"device": "device1", "L_ns": 1}]}
    assert "energy_note" not in runpage.optimise_view(delay, settings, ["device1"])  # no energy shown
    predicted = runpage.optimise_view({**delay, "policy": "rr"}, settings, [])
    assert predicted["measured"] is False and "not RR" in predicted["prediction_reason"]


def test_dit_show_labels_an_energy_optimum_over_a_fake_sensor(tmp_path: Path) -> None:
    run = report_run(tmp_path / "run")
    plain = CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "200"})
    assert plain.exit_code == 0 and "fake" not in plain.output
    _fake_power(run)
    shown = CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if "exhaustive-energy-RR" in x)
    assert "(modelled: fake sensor)" in line
    assert "Fake power sensor on device1" in shown.output


def test_monitor_plot_names_a_fake_sensors_power_line() -> None:
    import pandas as pd

    from dit.web.services.plots import monitors_figure

    frame = pd.DataFrame(
        {"node": ["device1", "device1", "edge", "edge"], "t_ns": [0, 10**9, 0, 10**9],
         "metric": ["power_w", "power_w", "cpu_pct", "cpu_pct"], "value": [2.5, 2.7, 30.0, 40.0]}
    )  # fmt: skip
    fig = monitors_figure(frame, ["device1", "edge"])  # edge has no power line: nothing to label there
    legends = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]  # type: ignore[attr-defined]
    assert "device1 (modelled: fake sensor)" in legends and "edge" in legends


ENERGY_VALUES = [
    {"name": "tokens_per_s", "value": 3.5, "unit": "1/s", "type": "float"},
    {"name": "energy", "value": 2.4, "unit": "J", "type": "float", "description": "energy of the workers"},
    {"name": "energy_per_token", "value": 0.3, "unit": "J", "type": "float"},
    {"name": "edp", "value": 0.9, "unit": "J*s", "type": "float"},
]
ENERGY_NAMES = ("energy", "energy_per_token", "edp")


def _fake_energy_run(target: Path) -> Path:
    """The report fixture run with device1's power from a fake sensor, a power model of both devices
    (so validation compares energy too) and a runtime summary holding energy, energy per token and EDP."""
    import json

    run = report_run(target)
    _fake_power(run)
    agg = run / "aggregate"
    (agg / "power_model.csv").write_text(
        "device,idle_w,compute_w,transmit_w,method,requests,idle_windows,rmse_j\n"
        "device1,2.0,3.1,2.4,3-term,6,5,0.001\ndevice2,1.5,2.6,2.0,3-term,6,5,0.001\n"
    )
    rows = [
        f"{d},{r},0,0,0,14000000,{0.04 + r / 100},2.7,3,,,0.00056"
        for d in ("device1", "device2")
        for r in range(3)
    ]
    (agg / "energy.csv").write_text(
        "device,round,repetition,partition_point,start_ns,total_ns,energy_j,mean_power_w,samples,tokens,"
        "energy_per_token_j,edp_js\n" + "\n".join(rows) + "\n"
    )
    (agg / "summary.json").write_text(
        json.dumps({"runtime": "layers", "tables": [], "values": ENERGY_VALUES})
    )
    return run


def test_every_energy_figure_of_a_fake_sensor_run_says_modelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49 item 3: a fake sensor's energy read as measured in the validation plot, the runtime summary
    of ``dit show``, the report and NNPM. Every place an energy value is rendered says "modelled" beside
    it; a figure no power sensor gives (tokens/s) does not."""
    from dit.analysis import model_validation
    from dit.report.build import build_report
    from dit.run.rundir import RunDir
    from dit.web.services import runs as runs_mod
    from dit.web.services.store import Store

    runs = tmp_path / "runs"
    run = _fake_energy_run(runs / "small" / "20261201T100000Z-eeeeeeee")
    # the validation plot: its energy panel's axis and title, and the CLI's table
    figures: list[Any] = []
    drawn = model_validation.validation_figure
    monkeypatch.setattr(
        model_validation, "validation_figure", lambda *a: figures.append(drawn(*a)) or figures[-1]
    )
    summary = model_validation.validate_run(run)
    assert summary.energy_mape_pct is not None and summary.energy_modelled == ("device1",)
    energy_ax = figures[-1].axes[1]
    assert energy_ax.get_xlabel() == "energy per inference, modelled: fake sensor on device1 (mJ)"
    legend = [t.get_text() for t in energy_ax.get_legend().get_texts()]
    assert legend == ["device1 (modelled: fake sensor) · SJF", "device2 · SJF", "predicted = sensor"]
    assert energy_ax.get_title().startswith("Energy model vs modelled: fake sensor — MAPE")
    table = _text(summary.render_table())
    assert "energy per inference (against modelled: fake sensor energy)" in table
    # dit show: each energy value's row, and the optimiser's energy optimum
    shown = CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    for name in ENERGY_NAMES:
        assert "(modelled: fake sensor)" in next(x for x in lines if f"│ {name} " in x), name
    assert "modelled" not in next(x for x in lines if "│ tokens_per_s " in x)
    assert "(modelled: fake sensor)" in next(x for x in lines if "exhaustive-energy-RR" in x)
    assert shown.output.count("Fake power sensor on device1") == 1  # the note why, said once
    # the report: the runtime summary's rows, the energy table's rows, the validation note, the badge
    html = build_report(run)
    runtime = _section(html, "runtime")
    for name in ENERGY_NAMES:
        row = runtime[runtime.index(f"<td>{name}</td>") :].split("</tr>")[0]
        assert "(modelled: fake sensor)" in row, row
    assert "(modelled" not in runtime[runtime.index("<td>tokens_per_s</td>") :].split("</tr>")[0]
    power = _section(html, "power")
    energy_table = power[power.index("energy per inference") :].split("</table>")[0]
    device1_rows = [r for r in energy_table.split("<tr>") if "<td>device1" in r]
    assert device1_rows and all("<td>device1 (modelled: fake sensor)</td>" in r for r in device1_rows)
    assert "modelled" in _section(html, "validation")
    assert ">modelled: fake sensor</span>" in _section(html, "optimise")
    # the comparison report's runtime rows, each run's cell
    from dit.report.compare import build_comparison

    other = _fake_energy_run(runs / "small" / "20261201T110000Z-ffffffff")
    compared = build_comparison([run, other])
    for name in ENERGY_NAMES:
        row = compared[compared.index(f"<td>runtime: {name}</td>") :].split("</tr>")[0]
        assert row.count("(modelled: fake sensor)") == 2, row
    # NNPM: the run page's summary values and the optimiser's badge
    detail = runs_mod.run_detail(RunDir(run), runs, Store(tmp_path / "store.db"))
    marks = {v["name"]: v["modelled"] for v in detail["summary"]["values"]}
    assert marks == {"tokens_per_s": "", **dict.fromkeys(ENERGY_NAMES, "modelled: fake sensor")}
    assert "Fake power sensor on device1" in detail["summary"]["modelled_note"]
    view = runpage.optimise_view(
        {"objective": "energy", "objective_value": 0.04, "per_device": []}, {}, ["device1"]
    )
    assert view["energy_badge"] == "modelled: fake sensor"


def _text(renderable: Any) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()
