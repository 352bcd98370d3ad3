"""Corrupted run files get a one-line error naming the file from the CLI, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from dit.analysis.aggregate import AggregateError, aggregate_run, read_model_inputs
from dit.cli import app
from dit.run.rundir import DRIVER, STATUS, write_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args))
    # an uncaught exception is a traceback for a user; typer.Exit is not
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert "Traceback" not in result.output
    return result


def error_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


def fake_run(runs: Path, name: str = "20260101T000000Z-0123abcd", state: str = "completed") -> Path:
    run = runs / "s" / name
    (run / "optimise").mkdir(parents=True)
    write_json(run / STATUS, {"state": state, "stage": None, "label": "s", "stage_ns": {"apply": 10**9}})
    write_json(run / DRIVER, {"pid": 1, "host": "elsewhere", "local": True})
    return run


@pytest.fixture
def small(tmp_path: Path) -> Path:
    target = tmp_path / "run_small"
    shutil.copytree(FIXTURES / "run_small", target)
    return target


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\udcff"])
def test_show_with_a_corrupted_status_json(tmp_path: Path, text: str) -> None:
    run = fake_run(tmp_path)
    (run / STATUS).write_bytes(text.encode("utf-8", "surrogateescape"))
    result = invoke("show", str(run))
    assert result.exit_code != 0
    lines = error_lines(result)
    assert len(lines) == 1 and f"{run / STATUS}:" in lines[0], result.output


def test_show_with_a_corrupted_optimise_result(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    bad = run / "optimise" / "greedy-total_delay-SJF.json"
    bad.write_text('{"vector": [1, 2]', encoding="utf-8")
    result = invoke("show", str(run))
    assert result.exit_code != 0
    lines = error_lines(result)
    assert len(lines) == 1 and f"{bad}:" in lines[0], result.output


def test_optimise_with_a_scenario_yaml_that_is_not_utf8(small: Path) -> None:
    (small / "scenario.yaml").write_bytes(b"name: s\ndevices: [device1]\ndescription: caf\xe9\n")
    result = invoke("optimise", str(small))
    assert result.exit_code != 0
    lines = error_lines(result)
    assert len(lines) == 1 and f"{small / 'scenario.yaml'}:" in lines[0], result.output
    assert "UTF-8" in lines[0]


def test_optimise_with_a_scenario_yaml_that_is_not_yaml(small: Path) -> None:
    (small / "scenario.yaml").write_text("devices: [device1\n", encoding="utf-8")
    result = invoke("optimise", str(small))
    assert result.exit_code != 0
    lines = error_lines(result)
    assert len(lines) == 1 and f"{small / 'scenario.yaml'}:" in lines[0], result.output


def test_ls_lists_an_unreadable_run_as_unreadable(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fake_run(runs, "20260101T000000Z-0000aaaa")
    broken = fake_run(runs, "20260101T000001Z-1111bbbb")
    (broken / STATUS).write_text("{torn", encoding="utf-8")
    result = invoke("ls", "--runs-dir", str(runs))
    assert result.exit_code == 0
    rows = {line.split("│")[2].strip(): line for line in result.output.splitlines() if "│" in line}
    assert "completed" in rows["20260101T000000Z-0000aaaa"]
    assert "unreadable" in rows["20260101T000001Z-1111bbbb"]


def test_a_nan_cumulative_latency_is_reported_as_nan(small: Path) -> None:
    aggregate_run(small)
    layers = small / "aggregate" / "layers.csv"
    lines = layers.read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    column = header.index("cum_latency_ns")
    for i, line in enumerate(lines[1:], start=1):
        cells = line.split(",")
        if cells[header.index("host")] == "device1" and cells[header.index("stage")] == "2":
            cells[column] = "NaN"
            lines[i] = ",".join(cells)
    layers.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(AggregateError, match=r"layers.csv device1 cum_latency_ns is NaN"):
        read_model_inputs(small)
    result = invoke("optimise", str(small))
    assert result.exit_code != 0
    assert "is empty" not in result.output
    assert "cum_latency_ns is NaN" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("driver.json", "{not json"),
        ("driver.json", "[1]"),
        ("scenario.yaml", "devices: [\n"),
        ("inventory.json", "{}"),
    ],
)
def test_cleanup_with_a_corrupted_run_file_names_it(tmp_path: Path, name: str, text: str) -> None:
    run = fake_run(tmp_path, state="running")
    write_json(run / DRIVER, {"pid": 0, "host": "elsewhere", "local": True})  # no driver to ask about
    (run / "scenario.yaml").write_text("name: s\ndevices: [device1]\n", encoding="utf-8")
    write_json(
        run / "inventory.json", {"all": {"children": {"edge": {"hosts": {}}, "devices": {"hosts": {}}}}}
    )
    (run / name).write_text(text, encoding="utf-8")
    result = invoke("cleanup", str(run))
    assert result.exit_code != 0
    (line,) = error_lines(result)
    assert name in line or str(run) in line


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_status_json_that_cannot_be_read_is_kept_aside_and_written_anew(tmp_path: Path, text: str) -> None:
    from dit.run.rundir import RunDir

    run = fake_run(tmp_path)
    (run / STATUS).write_text(text, encoding="utf-8")
    RunDir(run).set_status(state="failed", error="cleaned up")
    assert RunDir(run).status()["state"] == "failed"
    assert (run / (STATUS + ".unreadable")).read_text(encoding="utf-8") == text


@pytest.mark.parametrize(
    ("variable", "value"), [("DIT_LOCAL_MEMORY_MB", "4G"), ("DIT_LOCAL_CPU_SHARE", "half")]
)
def test_a_malformed_local_setting_fails_before_a_run_directory_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """A typo in a local-mode variable is one error line naming it, and leaves no failed run behind
    (it was raised while the inventory was built, inside a fresh run directory)."""
    monkeypatch.setenv(variable, value)
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"
    runs = tmp_path / "runs"
    result = invoke("run", str(scenario), "--runs-dir", str(runs))
    assert result.exit_code == 2
    (line,) = error_lines(result)
    assert line.startswith(f"error: {variable}={value!r}: expected auto, off or "), line
    assert not runs.exists() or not any(runs.rglob("status.json"))
