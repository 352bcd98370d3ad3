"""``dit run --check``: preflight and apply in Ansible check mode report every node's changes, make none."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

import dit.driver
import dit.dryrun
import dit.inventory
from dit.cli import app
from dit.driver import RunOptions
from dit.dryrun import DryRun, dry_run
from dit.localmode import make_fake_sysfs
from dit.procs import run_processes
from dit.rundir import find_runs
from dit.scenario import load
from tests.conftest import REPO, shipped_runtime

SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory), independent of dit's own check."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))
    }


def test_dry_run_of_quickstart_in_local_mode_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    original_inventory = dit.inventory.local_inventory
    original_report = dit.dryrun.report

    def local_inventory(run_dir: Path, devices: tuple[str, ...]) -> Any:
        inventory = original_inventory(run_dir, devices)
        seen["nodes"] = run_dir / "nodes"
        seen["before"] = snapshot(run_dir / "nodes")  # the fake nodes as created, before preflight
        return inventory

    def report(driver: dit.driver.Driver, error: str | None) -> DryRun:
        # the end of the dry run, before its temporary run directory is removed
        seen["work"] = driver.run.path
        seen["after"] = snapshot(driver.run.path / "nodes")
        journal = driver.run.journal
        seen["journal"] = journal.read_text(encoding="utf-8") if journal.exists() else ""
        seen["processes"] = run_processes(driver.run.run_id)
        return original_report(driver, error)

    monkeypatch.setattr(dit.driver, "local_inventory", local_inventory)
    monkeypatch.setattr(dit.dryrun, "report", report)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app, ["run", "--check", str(REPO / "scenarios" / "quickstart.yaml"), "--runs-dir", str(runs)]
    )
    assert result.exit_code == 0, result.output
    text = result.stdout
    sections = {
        host: text.split(f"\n{host}: ", 1)[1].split("\n\n", 1)[0] for host in ("edge", "device1", "device2")
    }
    assert "[directory]" in sections["edge"] and "start 'edge'" in sections["edge"]
    assert "tc qdisc replace dev lo root handle 1: netem delay 5ms" in sections["device1"]  # delay_ms: 5
    assert "start 'load'" in sections["device2"] and "start 'load'" not in sections["device1"]
    assert "nothing was changed" in text
    # the promise: no journal record, no process, no change on any node, no run left behind
    assert seen["journal"].strip() == ""
    assert seen["processes"] == []
    assert seen["after"] == seen["before"] and any(k.endswith("scaling_max_freq") for k in seen["before"])
    assert not seen["work"].exists()
    assert find_runs(runs) == []


@pytest.fixture(scope="module")
def rack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """inventories/rack.example, its hosts made local: one fake sysfs and node directory per host.

    Everything else (groups, group_vars: interfaces, addresses, boards) is the example's own. The
    hosts share this machine's clock (dit_shared_clock) and have no wlan0 (dit_tc_dry_run: dit_tc
    assumes the kernel's default tree and would record its commands instead of running them).
    """
    root = tmp_path_factory.mktemp("rack")
    inventory = root / "rack"
    shutil.copytree(REPO / "inventories" / "rack.example", inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text(encoding="utf-8"))
    edge = set(hosts["all"]["children"]["edge"]["hosts"])
    names = [*edge]
    for group in hosts["all"]["children"]["devices"]["children"].values():
        names += list(group["hosts"])
    (inventory / "host_vars").mkdir()
    for name in names:
        base = root / "nodes" / name
        overrides = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "dit_python": sys.executable,
            "dit_remote_base": str(base),
            "sysfs_root": str(make_fake_sysfs(base / "sys", "edge" if name in edge else "device")),
            "dit_shared_clock": True,
            "dit_tc_dry_run": True,
        }
        (inventory / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(overrides), encoding="utf-8")
    return inventory


@pytest.mark.parametrize("scenario", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_rack_example_dry_runs_every_shipped_scenario(rack: Path, scenario: Path, tmp_path: Path) -> None:
    nodes = rack.parent / "nodes"
    before = snapshot(nodes)
    options = RunOptions(
        runs_root=tmp_path / "runs", inventory=str(rack), console=Console(file=io.StringIO(), width=200)
    )
    with shipped_runtime(scenario):
        variants = load(scenario)
        # A dry run stops before the profile stage, so variants that differ only in their runtime block
        # (a strategy sweep) dry-run alike: one of each is enough; of those, the sweep's extremes.
        distinct = {
            json.dumps({k: v for k, v in s.to_dict().items() if k != "runtime"}, sort_keys=True): s
            for s in variants
        }
        chosen = list(distinct.values())
        # the sweep's first and last points (its extremes): CI time grows with every shipped sweep
        for variant in chosen[:1] + chosen[-1:] if len(chosen) > 1 else chosen:
            result = dry_run(variant, options)
            assert result.ok, result.render()
            assert result.mode == "inventory"
            assert set(result.hosts) == {"edgeserver", *variant.devices}
            for host in result.hosts:
                kinds = [c.kind for c in result.changes.get(host, [])]
                assert "directory" in kinds, f"{host}: {kinds}"  # its run directory, at least
            edge = result.changes["edgeserver"]
            assert any(c.kind == "process" and "start 'edge'" in c.details[0] for c in edge)
            for device, block in variant.network.items():  # the rack's interface, from its group_vars
                tc = [d for c in result.changes[device] if c.kind == "tc" for d in c.details]
                assert any(
                    f"dev wlan0 root handle 1: netem delay {block['delay_ms']:g}ms" in d for d in tc
                ), tc
            for device in variant.load:
                assert any("start 'load'" in d for c in result.changes[device] for d in c.details)
            if variant.edge.nominal_frequency:
                sysfs = [d for c in edge if c.kind == "sysfs" for d in c.details]
                assert any(d.endswith("no_turbo: 0 -> 1") for d in sysfs), sysfs
            assert result.run_id is not None and run_processes(result.run_id) == []
    assert snapshot(nodes) == before  # no node directory, no sysfs value changed
    assert find_runs(tmp_path / "runs") == []
