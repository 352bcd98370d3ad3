"""A third-party package registers an optimiser under ``dit.optimisers`` and dit runs it.

The fixture package (tests/fixtures/plugin_pkg) is really installed with pip, offline, into a temporary
``--target`` directory put on PYTHONPATH of a subprocess, so the venv is left untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import install_fixture_package

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = install_fixture_package("plugin_pkg", tmp_path_factory.mktemp("plugin"))
    assert (site / "dit_optimiser_fixture-0.1.0.dist-info" / "entry_points.txt").is_file()
    return site


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    target = tmp_path / "run_small"
    shutil.copytree(FIXTURES / "run_small", target)
    return target


def env_with(site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def test_not_installed_in_this_process() -> None:
    from dit.optimise import registry

    assert "max_local" not in registry.available()


def test_plugin_is_registered_and_runs_through_the_api(plugin_site: Path, run_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from dit.optimise import registry
        from dit.optimise.api import optimise_run
        assert registry.available()["max_local"] == "dit_optimiser_fixture:max_local"
        result = optimise_run(Path({str(run_dir)!r}), "max_local", None, None, None)
        print(result.to_json())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env_with(plugin_site), capture_output=True, text=True, check=True
    )
    result = json.loads(done.stdout)
    # run_small's feasible maxima are (2, 1); SJF (the scenario's policy): D = 10.2 + 12.7 ms
    assert result["algorithm"] == "max_local"
    assert result["vector"] == [2, 1]
    assert result["objective_value"] == pytest.approx(22_900_000)
    assert (run_dir / "optimise" / "max_local-total_delay-SJF.json").is_file()


def test_plugin_runs_through_the_cli(plugin_site: Path, run_dir: Path) -> None:
    dit = Path(sys.executable).with_name("dit")
    argv = [str(dit)] if dit.is_file() else [sys.executable, "-m", "dit"]
    done = subprocess.run(
        [*argv, "optimise", str(run_dir), "--algorithm", "max_local", "--policy", "RR", "--json"],
        env=env_with(plugin_site),
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["algorithm"] == "max_local"
    assert result["vector"] == [2, 1]
    assert (run_dir / "optimise" / "max_local-total_delay-RR.json").is_file()


def test_plugin_optimises_energy_through_the_cli(plugin_site: Path, run_dir: Path) -> None:
    """The energy objective reaches a plug-in through Problem.evaluate, with the run's power model."""
    dit = Path(sys.executable).with_name("dit")
    argv = [str(dit)] if dit.is_file() else [sys.executable, "-m", "dit"]
    subprocess.run([*argv, "optimise", str(run_dir)], capture_output=True, check=True)  # aggregates first
    (run_dir / "aggregate" / "power_model.csv").write_text(
        "device,idle_w,compute_w,transmit_w,method,requests,idle_windows,rmse_j\n"
        "device1,2.0,5.0,3.0,3-term,10,2,0.001\n"
        "device2,1.0,4.0,2.0,3-term,10,2,0.001\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [*argv, "optimise", str(run_dir), "--algorithm", "max_local", "--objective", "energy", "--json"],
        env=env_with(plugin_site),
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    assert (result["algorithm"], result["objective"], result["objective_unit"]) == (
        "max_local",
        "energy",
        "J",
    )
    # vector (2, 1) under SJF: device1 L 3.2, T 5.5, R 1.5 ms; device2 L 2.2, T 6.5, R 4.0 ms
    expected = (5.0 * 3.2 + 3.0 * 5.5 + 2.0 * 1.5 + 4.0 * 2.2 + 2.0 * 6.5 + 1.0 * 4.0) * 1e-3
    assert result["objective_value"] == pytest.approx(expected)
    assert (run_dir / "optimise" / "max_local-energy-SJF.json").is_file()
