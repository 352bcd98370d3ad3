"""A run's link measurement as the aggregate stage writes it, for the map's per-link control's tests
(the API's and the browser's): no pipeline run, its two CSV files only."""

from __future__ import annotations

from pathlib import Path

from dit.analysis.links import LINKS_COLUMNS
from dit.conditions.netem.check import CHECK_COLUMNS
from dit.run.rundir import write_json


def write_measured_run(runs: Path, scenario: str, name: str) -> Path:
    """A finished run's measurement as the aggregate stage writes it: links.csv (dit.analysis.links) and
    netem_check.csv (dit.conditions.netem.check), their real columns, values from a local quickstart run."""
    run = runs / scenario / name
    (run / "aggregate").mkdir(parents=True)
    write_json(run / "status.json", {"state": "completed", "label": scenario, "started_wall_ns": 1})
    links = [
        ("device1", "edge", 44100, 27000, 72000, 12210, 4897134105.129, "fit"),
        ("device1", "device2", 26900, 13000, 64000, 14849, 4897134105.129, "fit"),
        ("device2", "edge", "", "", "", "", 3172912223.826, "fit"),  # not pinged: no measurement
    ]
    check = [("device1", "edge", "127.0.0.1", "constant", "recorded", "", "", 5.0, 0.0441, 0.027, 0.0414,
              -4.9973, 1.0, "", 10, "")]  # fmt: skip
    for file, columns, rows in (
        ("links.csv", LINKS_COLUMNS, links),
        ("netem_check.csv", CHECK_COLUMNS, check),
    ):
        lines = [",".join(columns)] + [",".join(str(v) for v in row) for row in rows]
        assert all(len(row) == len(columns) for row in rows)
        (run / "aggregate" / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run
