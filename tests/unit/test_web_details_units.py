"""NNPM's run page details (issue 49 item 6): summary values written as dit show writes them, a monitor
series of one sample visible, each plot drawn once per version of its inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from dit import units
from dit.web.services import plots
from dit.web.services.runpage import stamp
from dit.web.services.runs import runtime_summary


def test_summary_values_are_written_as_dit_show_writes_them(tmp_path: Path) -> None:
    """The page's own formatter said 13.59 % where dit show and the report said 13.6 %."""
    values = [{"name": "model_mape", "value": 13.5912, "unit": "%"}, {"name": "energy", "value": 2.4, "unit": "J"},
              {"name": "edp", "value": 0.9, "unit": "J*s"}, {"name": "tokens", "value": 32, "unit": ""}]  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps({"runtime": "layers", "values": values}), "utf-8")
    summary = runtime_summary(tmp_path)
    assert summary is not None
    texts = {v["name"]: v["text"] for v in summary["values"]}
    assert texts == {"model_mape": "13.6 %", "energy": "2.40 J", "edp": "900 mJ·s", "tokens": "32"}
    assert all(texts[v["name"]] == units.with_unit(v["value"], v["unit"]) for v in values)


def test_a_monitor_series_of_one_sample_is_drawn_as_a_marker() -> None:
    """A load's CPU target set once was one sample: a line through it drew nothing."""
    frame = pd.DataFrame(
        [("device1", t, "cpu_pct", 40.0 + t) for t in range(5)]
        + [("device1", 0, "load_cpu_target_pct", 50.0)],
        columns=["node", "t_ns", "metric", "value"],
    )
    fig = plots.monitors_figure(frame)
    axes = fig.axes  # type: ignore[attr-defined]
    target = next(ax for ax in axes if ax.get_ylabel() == "load: CPU target (%)")
    (line,) = target.get_lines()
    assert line.get_marker() == "o" and list(line.get_ydata()) == [50.0]
    (cpu,) = next(ax for ax in axes if ax.get_ylabel() == "CPU (%)").get_lines()
    assert cpu.get_marker() in ("None", None, "")  # a real trace stays a plain line


def test_a_plot_is_drawn_once_per_version_of_its_inputs(tmp_path: Path) -> None:
    """Reopening a run page drew each plot again (8.1 s); now once, until its CSV changes."""
    csv = tmp_path / "monitors.csv"
    csv.write_text("node,t_ns,metric,value\ndevice1,0,cpu_pct,1\n", "utf-8")
    drawn: list[Path] = []

    def make(path: Path) -> bytes:
        drawn.append(path)
        return f"png {len(drawn)}".encode()

    assert plots.cached_png(make, csv) == plots.cached_png(make, csv) == b"png 1"
    assert len(drawn) == 1
    before = stamp(csv)
    csv.write_text("node,t_ns,metric,value\ndevice1,0,cpu_pct,1\ndevice1,1,cpu_pct,2\n", "utf-8")
    os.utime(csv, ns=(csv.stat().st_atime_ns, csv.stat().st_mtime_ns + 10**9))
    assert stamp(csv) != before  # the page's address changes with it
    assert plots.cached_png(make, csv) == b"png 2" and len(drawn) == 2
