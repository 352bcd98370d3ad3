"""Every role's molecule scenario, one test per role: molecule's default test sequence with check
(converge, idempotence, the converge playbook in check mode, verify, cleanup, also cleanup before
create), so ``molecule test`` covers every step ``molecule check`` runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(REPO.glob("roles/*/molecule/default/molecule.yml"))
# Roles whose scenario changes real kernel state (cgroups) and therefore needs root.
NEEDS_ROOT = {"cgroup_memory", "cgroup_cpu"}


def in_order(steps: list[str], sequence: list[str]) -> bool:
    """Whether ``steps`` occur in ``sequence`` in this order (others may come between)."""
    rest = iter(sequence)
    return all(step in rest for step in steps)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.parents[2].name for s in SCENARIOS])
def test_the_scenario_runs_every_step_of_molecule_check(scenario: Path) -> None:
    molecule_constants = pytest.importorskip("molecule.constants")
    check = [s for s in molecule_constants.DEFAULT_CONFIG["scenario"]["check_sequence"] if s != "dependency"]
    sequence = yaml.safe_load(scenario.read_text(encoding="utf-8"))["scenario"]["test_sequence"]
    assert in_order(check, sequence), f"{sequence} does not run {check}"
    assert in_order(["converge", "idempotence", "verify"], sequence)
    assert sequence[0] == "cleanup", "cleanup must cope with a scenario that was never created"


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
