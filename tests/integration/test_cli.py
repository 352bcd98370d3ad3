"""The `dit` command as a user types it."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, dit_env, write_scenario


def dit(*args: str, cwd: Path = REPO, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DIT, *args], cwd=cwd, env=dit_env(), capture_output=True, text=True, timeout=timeout
    )


def test_validate_accepts_the_articles_example_and_lists_its_sweep() -> None:
    result = dit("validate", "scenarios/ch4_validation.yaml")
    assert result.returncode == 0, result.stderr
    assert "ch4_validation[edge_server.policy=RR]" in result.stdout
    assert "ch4_validation[edge_server.policy=SJF]" in result.stdout


def test_validate_names_the_offending_fields_and_exits_non_zero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nmodel: fake\ndevices: [device1]\n"
        "load:\n  device7: {mode: light}\n"
        "edge_server: {policy: FIFO}\n"
        "inference: {partition_points: [0, 12]}\n"
    )
    result = dit("validate", str(bad))
    assert result.returncode == 2
    assert "load.device7: device7 is not in devices" in result.stderr
    assert "edge_server.policy" in result.stderr and "FIFO" in result.stderr
    assert "inference.partition_points" in result.stderr and "12" in result.stderr


def test_run_refuses_an_invalid_scenario_before_creating_anything(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: fake\ndevices: [device1, device1]\n")
    result = dit("run", str(bad), "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 2
    assert "devices[1]" in result.stderr
    assert not (tmp_path / "runs").exists()


@dataclass(frozen=True)
class FinishedRun:
    """One ``dit run`` of the small scenario from a directory, with the default (relative) runs dir."""

    cwd: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """One run shared by the tests below that need a finished run (each of its own would cost CI
    about 30 s): the default-runs-directory test checks the run itself, the optimise tests read it."""
    cwd = tmp_path_factory.mktemp("finished-run")
    scenario_dir = cwd / "scenarios"
    scenario_dir.mkdir()
    path = write_scenario(scenario_dir, optimisation={"enabled": False})
    return FinishedRun(cwd, dit("run", str(path), cwd=cwd))


def the_run_dir(run: FinishedRun) -> Path:
    assert run.result.returncode == 0, run.result.stderr[-3000:]
    (run_dir,) = (run.cwd / "runs" / "itest").iterdir()
    return run_dir


@pytest.mark.parametrize("bad_vector", ["1,x", "99,99,99,99"])
def test_optimise_rejects_bad_vectors_with_a_message(bad_vector: str, finished_run: FinishedRun) -> None:
    run_dir = the_run_dir(finished_run)
    result = dit("optimise", str(run_dir), "--vector", bad_vector)
    assert result.returncode == 2
    assert "vector" in result.stderr
    good = dit("optimise", str(run_dir), "--vector", "2,2", "--json")
    assert good.returncode == 0, good.stderr
    data = json.loads(good.stdout)
    assert data["vector"] == [2, 2]


def test_run_with_the_default_relative_runs_directory(finished_run: FinishedRun) -> None:
    """`dit run SCENARIO` from any directory: runs/ relative to it, as the README's quickstart does."""
    run_dir = the_run_dir(finished_run)
    assert RunDir(run_dir).status()["state"] == "completed"
    cleanup = dit("cleanup", f"runs/itest/{run_dir.name}", cwd=finished_run.cwd)
    assert cleanup.returncode == 0, cleanup.stderr
