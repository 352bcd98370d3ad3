"""Every role's molecule scenario (converge, idempotence, verify, cleanup), one test per role."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(REPO.glob("roles/*/molecule/default/molecule.yml"))
# Roles whose scenario changes real kernel state (cgroups) and therefore needs root.
NEEDS_ROOT = {"cgroup_memory"}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.parents[2].name for s in SCENARIOS])
def test_molecule_scenario(scenario: Path) -> None:
    role_dir = scenario.parents[2]
    bindir = Path(sys.executable).parent
    molecule = bindir / "molecule"
    if role_dir.name in NEEDS_ROOT and os.geteuid() != 0:
        pytest.skip(f"the {role_dir.name} scenario changes real cgroups and needs root")
    if not molecule.exists():
        pytest.skip(f"molecule is not installed in {bindir}")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run(
        [str(molecule), "test"], cwd=role_dir, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, (
        f"molecule test of {role_dir.name} failed:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
    )
