"""dit.results (issue 49, item 7): runs as tidy DataFrames with their scenario values, the spread of a
sample (percentiles, the mean's confidence interval) and `dit export`."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dit import results
from dit.analysis.run import AggregateError
from dit.cli import app
from dit.run.rundir import NoRunsError
from dit.scenario import load_yaml
from dit.scenario.spec import content_hash
from tests.report_fixtures import report_run

# --------------------------------------------------------------------------- spread


def test_spread_of_a_known_sample_gives_the_t_interval_and_nearest_rank_percentiles() -> None:
    s = results.spread(range(1, 11))  # mean 5.5, sd 3.0277, t(0.975, 9) = 2.262157
    assert (s.n, s.mean) == (10, 5.5)
    half = 2.2621571628 * math.sqrt(sum((v - 5.5) ** 2 for v in range(1, 11)) / 9) / math.sqrt(10)
    assert s.ci_low == pytest.approx(5.5 - half, abs=1e-9) and s.ci_high == pytest.approx(
        5.5 + half, abs=1e-9
    )
    assert s.ci_half == pytest.approx(2.16585, abs=1e-5)
    assert (s.p50, s.p95, s.p99) == (5, 10, 10)  # nearest rank: below 20 values the p95 is the maximum
    big = results.spread(float(v) for v in range(1, 201))
    assert (big.p50, big.p95, big.p99) == (100, 190, 198)


def test_spread_leaves_out_missing_values_and_has_no_interval_for_one_value() -> None:
    s = results.spread(pd.Series([4e6, float("nan"), None]))
    assert (s.n, s.mean, s.ci_low, s.ci_high, s.p99) == (1, 4e6, None, None, 4e6)
    assert s.mean_text() == "4.00 ms"
    with pytest.raises(ValueError, match="no values"):
        results.spread([float("nan")])


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [(0.975, 1, 12.7062047362), (0.975, 9, 2.2621571628), (0.975, 30, 2.0422724563), (0.995, 5, 4.0321429836),
     (0.975, 1000, 1.9623390808)],
)  # fmt: skip
def test_t_quantile_matches_the_tables(p: float, df: int, table: float) -> None:
    assert results.t_quantile(p, df) == pytest.approx(table, abs=1e-9)


def test_spread_texts_say_the_unit_once_per_scale() -> None:
    s = results.spread([12_000_000, 13_000_000, 11_500_000])
    assert s.mean_text() == "12.2 ± 1.90 ms"
    assert s.percentiles_text() == "12.0 / 13.0 / 13.0 ms"


# --------------------------------------------------------------------------- tables


def _sweep(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two runs of run_small under one directory; the second with device1's delay at 5 ms."""
    sweep = tmp_path / "sweep"
    a = report_run(sweep / "20261201T000000Z-aaaa")
    b = report_run(sweep / "20261201T000100Z-bbbb")
    scenario = b / "scenario.yaml"
    scenario.write_text(scenario.read_text().replace("device1: {delay_ms: 1,", "device1: {delay_ms: 5,"))
    return sweep, a, b


def test_a_sweep_loads_into_tables_with_the_varying_scenario_values_as_columns(tmp_path: Path) -> None:
    sweep, a, b = _sweep(tmp_path)
    res = results.load([sweep])
    assert res.run_dirs == [a, b]
    assert res.varying == ["network.device1.delay_ms"]
    phases = res.phases
    assert list(phases.columns[:4]) == ["run_id", "run_dir", "scenario_hash", "network.device1.delay_ms"]
    assert len(phases) == 2 * len(pd.read_csv(a / "aggregate" / "phases.csv"))
    assert phases.groupby("network.device1.delay_ms")["run_dir"].unique().to_dict() == {
        1: [str(a)],
        5: [str(b)],
    }
    assert set(phases["run_id"]) == {"sweep-20261201T000000Z-aaaa", "sweep-20261201T000100Z-bbbb"}
    assert set(phases["scenario_hash"]) == {content_hash(load_yaml(a / "scenario.yaml")),
                                            content_hash(load_yaml(b / "scenario.yaml"))}  # fmt: skip
    assert set(res.layers["host"]) == {"device1", "device2", "edge"}
    summary = res.summary
    assert summary[summary["metric"] == "tokens_per_s"]["value"].tolist() == [3.5, 3.5]
    assert not summary["modelled"].any()
    # the runs table has every scenario value, lists as JSON text
    runs = res.runs.set_index("run_dir")
    assert (
        runs.loc[str(b), "network.device1.delay_ms"] == 5 and runs.loc[str(a), "edge_server.policy"] == "SJF"
    )
    assert json.loads(runs.loc[str(a), "devices"]) == ["device1", "device2"]
    # a table no run has is empty, with the run columns
    assert res.netem.empty and list(res.netem.columns) == ["run_id", "run_dir", "scenario_hash"]


def test_all_scenario_values_and_a_name_the_table_has_already(tmp_path: Path) -> None:
    run = report_run(tmp_path / "r")
    (run / "scenario.yaml").write_text((run / "scenario.yaml").read_text() + "description: fans off\n")
    one = results.load([run])
    assert one.varying == [] and "seed" not in one.phases.columns  # nothing differs in one run
    every = results.load([run], scenario_columns="all")
    assert every.phases["seed"].tolist() == [7] * len(every.phases)
    summary = every.summary
    assert summary["scenario.description"].tolist() == ["fans off", "fans off"]
    assert summary["description"].tolist() == ["", ""]  # the summary value's own, not the scenario's


def test_tokens_energy_and_monitors_of_a_run(tmp_path: Path) -> None:
    run = report_run(tmp_path / "r")
    (run / "raw" / "device1" / "device1_tokens.csv").write_text(
        "rep,token,start_ns,latency_ns,kv_len\n0,0,0,9000000,4\n0,1,9000000,3000000,5\n1,0,0,8000000,4\n"
        "1,1,8000000,4000000,5\n"
    )
    agg = run / "aggregate"
    (agg / "hs_tokens.csv").write_text(
        "token,token_id,total_ns,attention_ns\n0,17,50000000,1\n1,18,40000000,1\n"
    )
    (agg / "power_summary.csv").write_text(
        "node,sensor,samples,duration_ns,energy_j,mean_power_w\ndevice1,fake,4,1,1.0,2.0\ndevice2,ina219,4,1,1.0,2.0\n"
    )
    (agg / "energy.csv").write_text(
        "device,round,repetition,partition_point,start_ns,total_ns,energy_j,mean_power_w,samples,tokens,"
        "energy_per_token_j,edp_js\ndevice1,0,0,0,0,10,0.1,2.0,3,,,1e-9\ndevice2,0,0,1,0,10,0.1,2.0,3,,,1e-9\n"
    )
    (agg / "monitors.csv").write_text(
        "node,t_ns,metric,value\ndevice1,0,cpu_pct,50\ndevice1,1000,cpu_pct,60\n"
    )
    res = results.load([run])
    tokens = res.tokens
    assert tokens[tokens["source"] == "tokens.csv"]["latency_ns"].tolist() == [9e6, 3e6, 8e6, 4e6]
    assert tokens[tokens["source"] == "hs_tokens.csv"]["latency_ns"].tolist() == [50e6, 40e6]
    assert res.energy.set_index("device")["modelled"].to_dict() == {"device1": True, "device2": False}
    assert res.monitors["value"].tolist() == [50, 60]
    spreads = results.token_spreads(run)  # the decode tokens: token 0, the prefill, left out
    assert spreads["device1"].mean == 3.5e6 and spreads["device1"].n == 2
    assert (spreads["headsplit"].n, spreads["headsplit"].p50) == (1, 40e6)


def test_an_unreadable_table_names_its_file(tmp_path: Path) -> None:
    run = report_run(tmp_path / "r")
    (run / "aggregate" / "phases.csv").write_text("host,round\ndevice1,0\n")
    with pytest.raises(AggregateError, match=r"phases\.csv lacks the columns"):
        _ = results.load([run]).phases
    (run / "aggregate" / "summary.json").write_text("{not json")
    with pytest.raises(AggregateError, match=r"summary\.json: not readable JSON"):
        _ = results.load([run]).summary
    (run / "aggregate" / "summary.json").write_text("{}")
    assert results.load([run]).summary.empty  # an empty summary is no value, not an error
    with pytest.raises(NoRunsError, match="is not a dit run directory"):
        results.load([tmp_path / "nothing"])


def test_phase_total_spreads_follow_the_rows_of_the_phase_summary(tmp_path: Path) -> None:
    run = report_run(tmp_path / "r")
    summary = pd.read_csv(run / "aggregate" / "phases_summary.csv")
    spreads = results.phase_total_spreads(run)
    assert list(spreads) == [
        (str(r.host), int(r.round), int(r.partition_point)) for r in summary.itertuples()
    ]
    for r in summary.itertuples():
        s = spreads[(str(r.host), int(r.round), int(r.partition_point))]
        assert s.n == r.n and round(s.mean) == r.total_ns


# --------------------------------------------------------------------------- dit export


def test_export_csv_writes_one_file_per_table_that_reads_back(tmp_path: Path) -> None:
    sweep, _, _ = _sweep(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", str(sweep), "--format", "csv", "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    assert names == {f"{t}.csv" for t in (*results.TABLES, "runs")}
    res = results.load([sweep])
    back = pd.read_csv(out / "phases.csv")
    pd.testing.assert_frame_equal(back, res.phases, check_dtype=False)
    assert back.groupby("network.device1.delay_ms")["total_ns"].count().to_dict() == {1: 12, 5: 12}


def test_export_parquet_round_trip_or_one_line_saying_what_to_install(tmp_path: Path) -> None:
    run = report_run(tmp_path / "r")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", str(run), "--format", "parquet", "--out", str(out)])
    if importlib.util.find_spec("pyarrow") or importlib.util.find_spec("fastparquet"):
        assert result.exit_code == 0, result.output
        pd.testing.assert_frame_equal(pd.read_parquet(out / "phases.parquet"), results.load([run]).phases)
    else:
        assert result.exit_code == 2
        assert "needs pyarrow: pip install pyarrow" in result.output
        assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_export_refuses_an_unknown_format_and_a_path_without_runs(tmp_path: Path) -> None:
    run = report_run(tmp_path / "r")
    bad = CliRunner().invoke(app, ["export", str(run), "--format", "xlsx", "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "--format xlsx: one of csv, parquet" in bad.output
    none = CliRunner().invoke(app, ["export", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    assert none.exit_code == 2 and "has none under it" in none.output


# --------------------------------------------------------------------------- where the spread is shown

TOKENS_CSV = (
    "rep,token,start_ns,latency_ns,kv_len\n0,0,0,9000000,4\n0,1,9000000,3000000,5\n0,2,12000000,5000000,6\n"
    "1,0,0,8000000,4\n1,1,8000000,4000000,5\n1,2,12000000,6000000,6\n"
)
# device1's round 0 in run_small: totals 20.15 and 20.35 ms -> 20.25 ± t(0.975, 1) · 0.1414 / √2 = 1.27 ms
DEVICE1_ROUND0 = ("20.2 ± 1.27 ms", "20.1 / 20.4 / 20.4 ms")
# the decode tokens 3, 5, 4, 6 ms (the prefills, 9 and 8 ms, left out): sd 1.29, t(0.975, 3) = 3.18
DEVICE1_TOKENS = ("4.50 ± 2.05 ms", "4.00 / 6.00 / 6.00 ms")


def _with_tokens(run: Path) -> Path:
    (run / "raw" / "device1" / "device1_tokens.csv").write_text(TOKENS_CSV)
    return run


def test_dit_show_gives_the_spread_of_the_total_and_of_the_tokens(tmp_path: Path) -> None:
    run = _with_tokens(report_run(tmp_path / "r"))
    shown = CliRunner().invoke(app, ["show", str(run)], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if "device1" in line and "12.0 kB" in line)
    assert all(text in row for text in DEVICE1_ROUND0)
    assert "total p50 / p95 / p99" in shown.output
    tokens = next(line for line in shown.output.splitlines() if DEVICE1_TOKENS[0] in line)
    assert tokens.split("│")[1:3] == [" device1 ", "      4 "] and DEVICE1_TOKENS[1] in tokens
    assert "decode token latency" in shown.output


def test_the_report_gives_the_spread_beside_the_means(tmp_path: Path) -> None:
    from dit.report.build import run_sections

    run = _with_tokens(report_run(tmp_path / "r"))
    _, sections = run_sections(run)
    by_anchor = {s.anchor: s for s in sections}
    phases = by_anchor["phases"].tables[0]
    assert phases["columns"][-2:] == ["total", "total p50 / p95 / p99"]
    assert tuple(phases["rows"][0][-2:]) == DEVICE1_ROUND0
    tokens = by_anchor["runtime"].tables[-1]
    assert tokens["rows"] == [["device1", 4, *DEVICE1_TOKENS]]  # 4 decode tokens


def test_the_comparison_overlays_the_runs_distributions_in_one_plot(tmp_path: Path) -> None:
    from dit.report.compare import comparison_sections, load

    a = _with_tokens(report_run(tmp_path / "a"))
    b = report_run(tmp_path / "b")
    frame = pd.read_csv(b / "aggregate" / "phases.csv")
    frame["total_ns"] *= 2
    frame.to_csv(b / "aggregate" / "phases.csv", index=False)
    _, sections = comparison_sections(load([a, b]))
    section = next(s for s in sections if s.anchor == "distributions")
    assert len(section.figures) == 1  # both runs, both measures, one figure
    delay, tokens = section.tables
    means = {row[0]: row[2] for row in delay["rows"]}
    assert set(means) == {f"small ({a.name})", f"small ({b.name})"}
    low, high = (float(means[f"small ({r.name})"].split(" ")[0]) for r in (a, b))
    assert high == pytest.approx(2 * low, rel=0.01)
    assert tokens["rows"] == [[f"small ({a.name})", 4, *DEVICE1_TOKENS]]


def test_the_run_page_gives_the_spread_beside_the_means(tmp_path: Path) -> None:
    from dit.web.services import runpage

    run = _with_tokens(report_run(tmp_path / "r"))
    table = runpage.phase_table(run / "aggregate" / "phases_summary.csv")
    assert table is not None
    keys = [c["key"] for c in table["columns"]]
    assert keys[keys.index("total_ns") + 1] == "total_percentiles"
    assert table["columns"][keys.index("total_ns")]["stat"] == "mean ± 95 % CI"
    first = dict(zip(keys, table["rows"][0], strict=True))
    assert (first["total_ns"]["text"], first["total_percentiles"]["text"]) == DEVICE1_ROUND0
    assert runpage.token_spread(run) == [
        {"host": "device1", "n": 4, "mean_text": DEVICE1_TOKENS[0], "percentiles_text": DEVICE1_TOKENS[1]}
    ]
