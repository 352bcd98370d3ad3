"""The run page's data, optimiser results, diffs and benchmark options (issue 16 items 4-7), server side.

One hand-assembled run (tests/fixtures/run_small, aggregated) behind a TestClient: no ``dit run``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from dit import units
from dit.optimise.api import optimise_run
from dit.run.rundir import RunDir, write_json
from dit.web.app import WebConfig
from dit.web.services import runs as runs_mod
from dit.web.services.benchmark import PROFILING_FIELDS, benchmark_document
from dit.web.services.plots import TIME_AXIS, monitor_axis, monitors_figure
from tests.conftest import REPO
from tests.integration.conftest import StartNnpm
from tests.integration.test_web_api import finished_run

SCENARIO = {
    "name": "pages",
    "model": "fake",
    "devices": ["device1", "device2"],
    "repetitions": 3,
    "inference": {"enabled": True, "repetitions": 2},
}


@pytest.fixture
def client(tmp_path: Path, nnpm: StartNnpm) -> Iterator[tuple[TestClient, RunDir]]:
    run = finished_run(tmp_path / "runs")
    status = json.loads((run.path / "status.json").read_text("utf-8"))
    # written alphabetically, as json.dump(sort_keys=True) would
    status["stage_ns"] = {s: 1_500_000 * (i + 1) for i, s in enumerate(sorted(
        ("preflight", "apply", "profile", "collect", "aggregate", "optimise", "teardown")))}  # fmt: skip
    write_json(run.path / "status.json", status)
    write_json(run.path / "metadata.json", {"model": {"spec": {"name": "fake", "params": {"stages": 3}}}})
    optimise_run(run.path, "greedy", "total_delay", "SJF", None)  # aggregates first
    config = WebConfig(
        inventory=tmp_path / "inventory.yml", runs_dir=tmp_path / "runs", scenarios_dir=REPO / "scenarios"
    )
    yield nnpm(config), run


def key(run: RunDir) -> str:
    return f"{run.path.parent.name}/{run.path.name}"


def test_run_detail_reads_like_the_cli(client: Any) -> None:
    http, run = client
    detail = http.get(f"/api/runs/{key(run)}").json()
    assert [s["stage"] for s in detail["stages"]] == [
        "preflight", "apply", "profile", "collect", "aggregate", "optimise", "teardown"
    ]  # fmt: skip
    assert detail["stages"][0] == {"stage": "preflight", "ns": 7_500_000, "text": "7.50 ms"}
    phases = detail["phases"]
    keys = [c["key"] for c in phases["columns"]]
    labels = {c["key"]: c["label"] for c in phases["columns"]}
    assert labels["local_ns"] == "local" and labels["partition_point"] == "p"
    assert all(c["description"] for c in phases["columns"])
    first = dict(zip(keys, phases["rows"][0], strict=True))
    assert first["transmission_ns"] == {"text": "14.0 ms", "value": 14_000_000.0}
    assert first["total_ns"]["text"] == "20.2 ± 1.27 ms" and first["request_bytes"]["text"] == "12.0 kB"
    assert first["total_percentiles"]["text"] == "20.1 / 20.4 / 20.4 ms"  # dit.results.spread
    assert detail["model"] == {"name": "fake", "stand_in_for": None, "params": {"stages": 3}}
    assert detail["inference_ran"] is True and detail["duration_text"] == "2.00 s"
    # the run's own optimisation settings, and the policy its edge server ran
    assert detail["settings"] == {"algorithm": "greedy", "objective": "total_delay", "policy": "SJF",
                                  "inference": True, "measured_policy": "SJF"}  # fmt: skip


def test_optimise_results_have_units_and_mark_predictions(client: Any) -> None:
    http, run = client
    assert http.post(f"/api/runs/{key(run)}/optimise", json={"policy": "RR"}).status_code == 200
    listed = http.get(f"/api/runs/{key(run)}/optimise").json()
    assert set(listed["terms"]) >= {"L", "T", "R", "D"} and listed["terms"]["L"][0] == "local"
    by_policy = {r["policy"]: r for r in listed["results"]}
    sjf, rr = by_policy["SJF"], by_policy["RR"]
    assert sjf["measured"] is True and "prediction_reason" not in sjf
    assert rr["measured"] is False and "ran SJF" in rr["prediction_reason"]
    assert sjf["objective_text"].endswith(" ms") and "e+" not in sjf["objective_text"]
    assert sjf["objective_text"] == units.duration(sjf["objective_value"])
    row = sjf["per_device"][0]
    assert row["D_text"].endswith(" ms") and row["L_text"] != ""


def test_a_benchmark_run_measured_nothing_to_confirm(client: Any) -> None:
    http, run = client
    scenario = (run.path / "scenario.yaml").read_text("utf-8")
    (run.path / "scenario.yaml").write_text(
        scenario.replace("inference: {enabled: true,", "inference: {enabled: false,"), "utf-8"
    )
    (run.path / "aggregate" / "phases_summary.csv").write_text("host,round,partition_point,n\n", "utf-8")
    detail = http.get(f"/api/runs/{key(run)}").json()
    assert detail["inference_ran"] is False and detail["settings"]["measured_policy"] is None
    results = http.get(f"/api/runs/{key(run)}/optimise").json()["results"]
    assert results and all(r["measured"] is False for r in results)


def test_diff_is_always_older_to_newer(client: Any) -> None:
    http, _ = client
    old = http.post("/api/scenarios", json={"document": SCENARIO}).json()["version"]["hash"]
    new = http.post("/api/scenarios", json={"document": {**SCENARIO, "seed": 42}}).json()["version"]["hash"]
    for a, b in ((old, new), (new, old)):
        d = http.get(f"/api/diff?a={a}&b={b}").json()
        assert (d["a"]["hash"], d["b"]["hash"]) == (old, new)
        assert "+seed: 42" in d["unified"] and "-seed: 0" in d["unified"]


def test_benchmark_options_are_validated_and_set(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    http, _ = client
    spec = http.get("/api/benchmark").json()
    assert spec["fields"] == list(PROFILING_FIELDS)
    assert spec["schema"]["properties"]["repetitions"]["minimum"] == 1
    assert "profile_capacity" in spec["schema"]["properties"]["edge_server"]["properties"]
    digest = http.post("/api/scenarios", json={"document": SCENARIO}).json()["version"]["hash"]
    launched: list[Any] = []
    monkeypatch.setattr(runs_mod, "launch", lambda version, kind, *a: launched.append((version, kind)) or
                        runs_mod.Launch("x", version.hash, kind, "local", 1, Path("log"), []))  # fmt: skip
    bad = http.post(
        "/api/runs", json={"version": digest, "kind": "benchmark", "profiling": {"repetitions": 0}}
    )
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "repetitions"
    wrong = http.post("/api/runs", json={"version": digest, "kind": "benchmark", "profiling": {"model": "x"}})
    assert wrong.status_code == 422 and wrong.json()["errors"][0]["path"] == "profiling.model"
    assert launched == []
    profiling = {"repetitions": 7, "warmup": 0, "monitors": {"interval_s": 0.5}, "seed": None}
    ok = http.post("/api/runs", json={"version": digest, "kind": "benchmark", "profiling": profiling})
    assert ok.status_code == 202, ok.text
    ((version, kind),) = launched
    assert kind == "benchmark" and version.derived_from == digest
    doc = version.document
    assert doc["repetitions"] == 7 and doc["warmup"] == 0 and doc["monitors"]["interval_s"] == 0.5
    assert doc["inference"]["enabled"] is False and doc["optimisation"]["enabled"] is False


def test_benchmark_document_keeps_the_rest_and_resets_emptied_options() -> None:
    doc, errors = benchmark_document({**SCENARIO, "seed": 3, "timing": {"start_lead_s": 2}},
                                     {"seed": None, "timing": {"settle_s": 1}})  # fmt: skip
    assert errors == [] and "seed" not in doc
    assert doc["timing"] == {"start_lead_s": 2, "settle_s": 1} and doc["devices"] == SCENARIO["devices"]
    assert benchmark_document(SCENARIO, [1])[1] == [
        {"path": "profiling", "message": "an object of profiling options"}
    ]


def test_monitor_axes_carry_units_and_the_common_origin() -> None:
    assert monitor_axis("cpu_pct") == ("CPU (%)", 1.0)
    assert monitor_axis("cpu0_freq_khz") == ("cpu0 frequency (MHz)", 1000.0)
    assert monitor_axis("thermal_zone0_temp_c") == ("thermal_zone0 temperature (°C)", 1.0)
    assert monitor_axis("power_w") == ("power (W)", 1.0)
    frame = pd.DataFrame({"node": ["device1"] * 4, "t_ns": [0, 10**9, 0, 10**9],
                          "metric": ["cpu_pct", "cpu_pct", "cpu0_freq_khz", "cpu0_freq_khz"],
                          "value": [10.0, 20.0, 1_500_000.0, 600_000.0]})  # fmt: skip
    fig: Any = monitors_figure(frame)
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["CPU (%)", "cpu0 frequency (MHz)"]
    assert axes[-1].get_xlabel() == TIME_AXIS and "common origin" in TIME_AXIS
    assert list(axes[1].get_lines()[0].get_ydata()) == [1500.0, 600.0]
    import matplotlib.pyplot as plt

    plt.close(fig)
