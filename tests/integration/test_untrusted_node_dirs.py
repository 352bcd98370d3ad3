"""Node directories another user could have prepared, and a zipapp swapped after it was shipped (issue
46, item 1): as root, in local mode and through a user inventory on this machine, the run is refused with
a sentence naming the directory, and nothing the other user put there is read or run."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from dit.run.driver import Driver, RunOptions
from dit.run.journal import Journal
from dit.run.localmode import make_fake_sysfs
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from dit.scenario import load
from tests.integration.leases import dit, only_run, tiny_scenario

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown to another user")


def nobodys(path: Path) -> Path:
    path.mkdir(mode=0o755)
    os.chown(path, NOBODY, NOBODY)
    return path


def test_a_lease_planted_in_a_lease_directory_another_user_owns_refuses_the_run_naming_it(
    scenario_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted_dir = nobodys(tmp_path / "lease")
    planted = planted_dir / "lease.json"
    planted.write_text('{"run_id": "forged-20261201T060000Z-abababab-0123abcd"}\n')
    monkeypatch.setenv("DIT_LOCAL_LEASE_DIR", str(planted_dir))

    refused = dit("run", str(tiny_scenario(scenario_dir)), "--runs-dir", str(tmp_path / "runs"))

    assert refused.returncode == 1
    said = " ".join((refused.stdout + refused.stderr).split())
    assert (
        f"local mode's lease directory (DIT_LOCAL_LEASE_DIR) {planted_dir} is owned by nobody (uid 65534)"
        in said
    )
    assert f"chown root:root {planted_dir}" in said
    assert "forged" not in said  # refused for where the lease is, not for what it says
    run = only_run(tmp_path / "runs")
    assert Journal(run.journal).records() == []
    assert not (run.path / "nodes").exists()
    assert run_processes(run.run_id) == []
    assert planted.read_text().startswith('{"run_id": "forged')


def test_a_node_dit_directory_another_user_owns_is_refused_before_the_node_changes(
    scenario_dir: Path, tmp_path: Path
) -> None:
    """A user inventory (this machine as its nodes) whose dit_remote_base another user owns: the node
    modules refuse it in preflight, at the lease, the first thing dit would have written there."""
    base = nobodys(tmp_path / "dit")
    hostvars: dict[str, Any] = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "dit_python": sys.executable,
        "dit_remote_base": str(base),
        "dit_shared_clock": True,
        "dit_inference_address": "127.0.0.1",
        "dit_ping_count": 1,
    }
    hosts = {
        name: {**hostvars, "sysfs_root": str(make_fake_sysfs(tmp_path / "sys" / name, role))}
        for name, role in (("edge", "edge"), ("device1", "device"))
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "edge": {"hosts": {"edge": hosts["edge"]}},
                        "devices": {"hosts": {"device1": hosts["device1"]}},
                    }
                }
            }
        )
    )

    refused = dit(
        "run", str(tiny_scenario(scenario_dir)), "-i", str(inventory), "--runs-dir", str(tmp_path / "runs")
    )

    assert refused.returncode == 1
    said = " ".join((refused.stdout + refused.stderr).split())
    assert f"the node's lease directory {base} is owned by nobody (uid 65534)" in said, said[-3000:]
    run = only_run(tmp_path / "runs")
    assert Journal(run.journal).records() == []
    assert list(base.iterdir()) == []
    assert run_processes(run.run_id) == []


def test_a_zipapp_swapped_on_the_node_after_apply_is_refused_and_never_runs(
    scenario_dir: Path, runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ran as root in issue 46: a dit-device.pyz of the attacker's in place of the shipped one,
    put there after it was shipped. The profile stage's launch checks it against the shipped SHA-256."""
    ran = tmp_path / "trojan-ran"
    trojan = f"import os, pathlib\npathlib.Path({str(ran)!r}).write_text(f'uid={{os.getuid()}}')\n"
    swapped: list[Path] = []
    real_apply = Driver._apply

    def apply_then_swap(driver: Driver) -> None:
        real_apply(driver)
        for context in driver.contexts.values():
            pyz = Path(context.node_root) / "dit-device.pyz"
            pyz.write_text(trojan)
            swapped.append(pyz)

    monkeypatch.setattr(Driver, "_apply", apply_then_swap)
    (scenario,) = load(tiny_scenario(scenario_dir))
    console = io.StringIO()
    result = Driver(
        scenario, RunOptions(runs_root=runs_dir, console=Console(file=console, width=400))
    ).execute()

    assert result.state == "failed" and result.error is not None
    assert swapped
    assert any(f"{pyz} has SHA-256 " in result.error for pyz in swapped), result.error
    assert "shipped with this run: it was changed after it was shipped" in result.error
    assert not ran.exists()  # the attacker's file never ran, as profile or anything else
    run = RunDir(result.run_dir)
    assert run.status()["teardown"]["ok"] is True
    assert run_processes(run.run_id) == []
