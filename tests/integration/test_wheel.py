"""A non-editable install carries the Ansible content and runs the pipeline on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, write_scenario

CONTENT = (
    "dit/_content/ansible.cfg",
    "dit/_content/playbooks/apply.yml.j2",
    "dit/_content/library/dit_restore.py",
    "dit/_content/module_utils/dit_procs.py",
    "dit/_content/module_utils/dit_trusted.py",  # a link to src/dit/trusted.py in the checkout
    "dit/_content/action_plugins/dit_proc.py",
    "dit/_content/doc_fragments/dit.py",
    "dit/_content/scenarios/scenario.schema.json",
    "dit/_content/scenarios/quickstart.yaml",
    "dit/device/agent.py",
    "dit/models/catalogue.json",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        # Offline: the build backend (hatchling) comes from the locked dev environment, not from the index
        # that build isolation would download it from (issue 49, item 10).
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        timeout=600,
    )
    (built,) = out.glob("dit-*.whl")
    return built


def test_wheel_ships_the_ansible_content(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in CONTENT if name not in names]
    assert not missing


def test_installed_wheel_runs_a_scenario_from_anywhere(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=600,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = subprocess.run(
        [sys.executable, "-c", "import dit.paths; print(dit.paths.content_root())"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(probe.stdout.strip()) == target / "dit" / "_content"
    # one device profiled once: what is asserted is that the installed content renders and runs
    scenario = write_scenario(
        work,
        devices=["device1"],
        repetitions=1,
        warmup=0,
        inference={"enabled": False},
        optimisation={"enabled": False},
    )
    run = subprocess.run(
        [sys.executable, "-m", "dit", "run", str(scenario), "--runs-dir", str(work / "runs")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (run_dir,) = (work / "runs" / "itest").iterdir()
    rendered = (run_dir / "ansible" / "apply" / "project" / "apply.yml").read_text()
    assert "dit_node:" in rendered
    assert (run_dir / "aggregate" / "layers.csv").is_file()
