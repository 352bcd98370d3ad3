"""Issue 36 item 2: a fake sensor's power and energy are labelled wherever they are shown.

The run page's optimiser view, ``dit show`` and the labels themselves, on the report fixture run
(tests/report_fixtures.py) with device1's power from local mode's fake sensor; no driver, no browser.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dit.cli import app
from dit.report import labels
from dit.web.services import runpage
from tests.report_fixtures import report_run
from tests.unit.test_report import _fake_power


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
    assert "(fake power sensor)" in line
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
    assert "device1 (fake sensor)" in legends and "edge" in legends
