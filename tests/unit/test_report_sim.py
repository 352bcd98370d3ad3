"""dit report on a simulation's result directory: the per-placement table, latency over tokens, memory per
device, migrations, and for a replay simulated beside measured with the MAPE; a missing file is said, not
hidden. The last test goes through the CLI: dit simulate --out, then dit report."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dit.cli import app
from dit.report.build import ReportError, build_report
from dit.report.section import Section
from dit.report.sim import MEMORY_FILE, TOKENS_FILE, read_memory, read_tokens, sample, sim_sections
from dit.units import MISSING


def result_dir(tmp_path: Path, *, kind: str = "simulation", calibration: str | None = None) -> Path:
    """Two placements over two devices and three tokens; greedy migrates once; a replay has measured times."""
    out = tmp_path / "sim"
    out.mkdir()
    doc: dict[str, Any] = {
        "kind": kind,
        "source": "scenarios/sim/x.yaml",
        "model": "gpt2-tiny",
        "tokens": 3,
        "prompt_tokens": 0,
        "speculation": False,
        "replacement": True,
        "devices": [
            {"name": "a", "flops_per_s": 2e9, "memory_bytes": 4_000_000, "rtt_s": 0.01,
             "bandwidth_bytes_per_s": 12.5e6, "call_overhead_s": 0.0004},
            {"name": "b", "flops_per_s": 1e9, "memory_bytes": 2_000_000, "rtt_s": 0.008,
             "bandwidth_bytes_per_s": 12.5e6, "call_overhead_s": 0.0004},
        ],
        "placements": [
            {"placement": "layerwise", "tokens": 3, "simulated_s": 1.5, "tokens_per_s": 2.0,
             "token_latency_mean_s": 0.5, "migrations": [], "oom": None, "events": 1234},
            {"placement": "greedy", "tokens": 3, "simulated_s": 0.6, "tokens_per_s": 5.0,
             "token_latency_mean_s": 0.2,
             "migrations": [{"token": 1, "moved_units": 3, "bytes": 5_400_000, "seconds": 0.25}],
             "oom": None, "events": 99},
        ],
    }  # fmt: skip
    if kind == "replay":
        doc["placements"] = doc["placements"][:1]
        doc["replay"] = {
            "measured_tokens_per_s": 1.9, "simulated_tokens_per_s": 2.0, "mape_percent": 12.5,
            "decode_from": 1, "call_overhead_s": 0.0089, "calibration": calibration, "speculation": False,
        }  # fmt: skip
    (out / "simulation.json").write_text(json.dumps(doc), encoding="utf-8")
    with (out / TOKENS_FILE).open("w", newline="", encoding="utf-8") as handle:
        w = csv.writer(handle)
        w.writerow(["placement", "token", "simulated_s", *(["measured_s"] if kind == "replay" else [])])
        for name, times in (("layerwise", (0.7, 0.4, 0.4)), ("greedy", (0.3, 0.2, 0.1))):
            if kind == "replay" and name != "layerwise":
                continue
            for t, s in enumerate(times):
                w.writerow([name, t, s, *([(0.5, 0.5, 0.4)[t]] if kind == "replay" else [])])
    with (out / MEMORY_FILE).open("w", newline="", encoding="utf-8") as handle:
        w = csv.writer(handle)
        w.writerow(["placement", "token", "device", "bytes"])
        for name in ("layerwise", "greedy"):
            for t in range(3):
                w.writerow([name, t, "a", 1_000_000 + t * 100_000])
                w.writerow([name, t, "b", 1_500_000 if name == "layerwise" else 500_000])
    return out


def by_anchor(path: Path) -> dict[str, Section]:
    return {s.anchor: s for s in sim_sections(path)[1]}


def rows(section: Section, index: int = 0) -> list[list[Any]]:
    return list(section.tables[index]["rows"])


def test_the_placement_table_has_tokens_per_s_times_memory_migrations_per_placement(tmp_path: Path) -> None:
    table = rows(by_anchor(result_dir(tmp_path))["placements"])
    assert table[0] == ["layerwise", 3, "2.00 tokens/s", "1.50 s", "500 ms", "400 ms",
                        "1.50 MB (b)", 0, "0 B", "no", "1,234"]  # fmt: skip
    assert table[1][0] == "greedy" and table[1][2] == "5.00 tokens/s" and table[1][5] == "100 ms"
    assert table[1][6] == "1.20 MB (a)"  # a's peak at its last token; b holds 0.5 MB
    assert table[1][7:9] == [1, "5.40 MB"]


def test_latency_over_tokens_and_memory_per_device(tmp_path: Path) -> None:
    sections = by_anchor(result_dir(tmp_path))
    latency = sections["latency"]
    assert latency.tables[0]["columns"] == ["token", "layerwise", "greedy"]
    assert rows(latency)[1] == [1, "400 ms", "200 ms"]
    assert len(latency.figures) == 1
    memory = sections["memory"]
    assert memory.tables[0]["columns"][:4] == ["device", "limit", "layerwise: peak", "layerwise: last token"]
    assert rows(memory)[1] == ["b", "2.00 MB", "1.50 MB", "1.50 MB", "500 kB", "500 kB"]
    assert rows(sections["migrations"]) == [["greedy", 1, 3, "5.40 MB", "250 ms"]]
    assert "Not a replay" in sections["replay"].note


def test_a_missing_tokens_csv_or_memory_csv_is_said(tmp_path: Path) -> None:
    out = result_dir(tmp_path)
    (out / TOKENS_FILE).unlink()
    (out / MEMORY_FILE).write_text("not,the,columns\n1,2,3\n", encoding="utf-8")
    sections = by_anchor(out)
    assert sections["latency"].note == "No per-token latencies: tokens.csv is missing or unreadable."
    assert not sections["latency"].tables
    assert sections["memory"].note == "No memory records: memory.csv is missing or unreadable."
    assert "Missing: tokens.csv, memory.csv" in sections["placements"].note
    assert rows(sections["placements"])[0][5:7] == [MISSING, MISSING]  # last token, largest memory


def test_a_replay_sets_simulated_beside_measured_with_the_mape(tmp_path: Path) -> None:
    section = by_anchor(result_dir(tmp_path, kind="replay"))["replay"]
    assert rows(section) == [
        ["tokens/s", "2.00 tokens/s", "1.90 tokens/s"],
        ["decode token latency, mean", "400 ms", "450 ms"],  # tokens 1-2; token 0 is the prefill
        ["per-token latency MAPE (decode tokens)", "12.5 %", ""],
    ]
    assert rows(section, 1)[0] == ["0 (prefill)", "700 ms", "500 ms", "40.0 %"]
    assert rows(section, 1)[1] == ["1", "400 ms", "500 ms", "-20.0 %"]
    assert "fitted on this run itself" in section.note and "not an independent prediction" in section.note


def test_a_replay_calibrated_on_another_run_is_called_a_prediction(tmp_path: Path) -> None:
    section = by_anchor(result_dir(tmp_path, kind="replay", calibration="runs/other"))["replay"]
    assert "another run, runs/other" in section.note and "the MAPE is a prediction" in section.note


def test_a_replay_without_tokens_csv_says_so(tmp_path: Path) -> None:
    out = result_dir(tmp_path, kind="replay")
    (out / TOKENS_FILE).unlink()
    section = by_anchor(out)["replay"]
    assert rows(section)[1] == ["decode token latency, mean", MISSING, MISSING]
    assert "No per-token table: tokens.csv is missing" in section.note


def test_no_migration_is_said(tmp_path: Path) -> None:
    out = result_dir(tmp_path)
    doc = json.loads((out / "simulation.json").read_text())
    doc["placements"][1]["migrations"] = []
    (out / "simulation.json").write_text(json.dumps(doc))
    section = by_anchor(out)["migrations"]
    assert section.note == "No migration in any placement." and not section.tables


def test_an_unreadable_simulation_json_is_refused_naming_it(tmp_path: Path) -> None:
    out = result_dir(tmp_path)
    (out / "simulation.json").write_text("{", encoding="utf-8")
    with pytest.raises(ReportError, match=r"simulation.json: cannot be read as JSON"):
        build_report(out)


def test_readers_and_sample() -> None:
    assert read_tokens(Path("/nonexistent/tokens.csv")) is None
    assert read_memory(Path("/nonexistent/memory.csv")) is None
    assert sample(3) == [0, 1, 2]
    assert sample(1000) == [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 999]


def test_dit_simulate_out_then_dit_report_renders_simulated_and_replayed(tmp_path: Path) -> None:
    pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")
    from tests.sim_fixtures import write_run

    spec = tmp_path / "two.yaml"
    spec.write_text(
        "model: gpt2-tiny\ntokens: 4\nprompt_tokens: 4\nplacement: greedy\ndevices:\n"
        "  - {name: w, count: 2, flops_per_s: 1.0e+10, memory_mb: 1000, rtt_ms: 2, bandwidth_mbps: 100}\n",
        encoding="utf-8",
    )
    runner = CliRunner()
    done = runner.invoke(app, ["simulate", str(spec), "--placement", "layerwise,greedy", "--out",
                               str(tmp_path / "sim")])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "placement layerwise" in done.output and "placement greedy" in done.output
    done = runner.invoke(app, ["report", str(tmp_path / "sim")])
    assert done.exit_code == 0, done.output
    html = (tmp_path / "sim" / "report.html").read_text(encoding="utf-8")
    for anchor in ("facts", "placements", "latency", "memory", "migrations", "replay"):
        assert f'<section id="{anchor}">' in html
    assert "<td>layerwise</td>" in html and "<td>greedy</td>" in html

    run = write_run(tmp_path / "r", 0.003)
    done = runner.invoke(app, ["simulate", "--replay", str(run), "--out", str(tmp_path / "replayed")])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["report", str(tmp_path / "replayed"), "-o", str(tmp_path / "r.html")])
    assert done.exit_code == 0, done.output
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    mape = re.search(r"<td>per-token latency MAPE \(decode tokens\)</td><td>([0-9.]+) %</td>", html)
    assert mape is not None and float(mape.group(1)) < 0.01  # a run the simulator made replays exactly


def test_every_placement_is_checked_before_any_is_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("simpy", reason="the sim extra (SimPy) is not installed")
    from dit.sim import cli as sim_cli

    simulated: list[object] = []
    monkeypatch.setattr(sim_cli, "run_config", simulated.append)
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "model: gpt2-tiny\ntokens: 4\ndevices:\n"
        "  - {name: w, count: 2, flops_per_s: 1.0e+10, memory_mb: 1000, rtt_ms: 2, bandwidth_mbps: 100}\n",
        encoding="utf-8",
    )
    done = CliRunner().invoke(app, ["simulate", str(spec), "--placement", "layerwise,fast", "--out",
                                    str(tmp_path / "sim")])  # fmt: skip
    assert done.exit_code == 2
    assert "placement: 'fast' is not one of layerwise, roundrobin, greedy, galaxy" in done.output
    assert simulated == [] and not (tmp_path / "sim").exists()
