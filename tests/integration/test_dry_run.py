"""``dit run --check``: preflight and apply in Ansible check mode report every node's changes, make none."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import dit.run.driver
import dit.run.dryrun
import dit.run.inventory
from dit.cli import app
from dit.run.dryrun import DryRun
from dit.run.procs import run_processes
from dit.run.rundir import find_runs
from dit.runtime_api import registry as runtimes
from dit.runtime_api.interface import uses_edge_service
from tests.conftest import REPO
from tests.rack_dry_runs import (
    SHIPPED,
    DryRuns,
    chosen_variants,
    dry_run_extremes,
    make_rack,
    shared_key,
    snapshot,
)

JOBS = 2  # shipped scenarios dry-run at once: CI's machine has two cores


def test_dry_run_of_quickstart_in_local_mode_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    original_inventory = dit.run.inventory.local_inventory
    original_report = dit.run.dryrun.report

    def local_inventory(run_dir: Path, devices: tuple[str, ...]) -> Any:
        inventory = original_inventory(run_dir, devices)
        seen["nodes"] = run_dir / "nodes"
        seen["before"] = snapshot(run_dir / "nodes")  # the fake nodes as created, before preflight
        return inventory

    def report(driver: dit.run.driver.Driver, error: str | None) -> DryRun:
        # the end of the dry run, before its temporary run directory is removed
        seen["work"] = driver.run.path
        seen["after"] = snapshot(driver.run.path / "nodes")
        journal = driver.run.journal
        seen["journal"] = journal.read_text(encoding="utf-8") if journal.exists() else ""
        seen["processes"] = run_processes(driver.run.run_id)
        return original_report(driver, error)

    monkeypatch.setattr(dit.run.driver, "local_inventory", local_inventory)
    monkeypatch.setattr(dit.run.dryrun, "report", report)
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
    # delay_ms: 5, recorded netem where the userspace backend cannot run (not root, no iptables), else
    # the link emulator's rules (device1's own source address only) and its process
    recorded = "tc qdisc replace dev lo root handle 1: netem delay 5ms" in sections["device1"]
    emulated = "start 'link-emulator'" in sections["device1"] and "! -s 127." in sections["device1"]
    assert recorded or emulated, sections["device1"]
    assert "start 'load'" in sections["device2"] and "start 'load'" not in sections["device1"]
    assert "nothing was changed" in text
    # the promise: no journal record, no process, no change on any node, no run left behind
    assert seen["journal"].strip() == ""
    assert seen["processes"] == []
    assert seen["after"] == seen["before"] and any(k.endswith("scaling_max_freq") for k in seen["before"])
    assert not seen["work"].exists()
    assert find_runs(runs) == []


@dataclass(frozen=True)
class RackDryRuns:
    """One shipped scenario's rack (its node directories' snapshot before), runs root and dry runs."""

    scenario: Path  # whose chosen variants were dry-run here
    nodes: Path
    before: dict[str, bytes | None]
    runs_root: Path
    future: Future[DryRuns]


def shared_keys(scenario: Path) -> list[str]:
    """The shared keys of ``scenario``'s chosen variants; none when its runtime does not load here (its
    own dry run then says why it skips)."""
    try:
        return [shared_key(v) for v in chosen_variants(scenario)]
    except pytest.skip.Exception:
        return []


@pytest.fixture(scope="module")
def rack_dry_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RackDryRuns]]:
    """Every selected shipped scenario dry-run on its own local copy of inventories/rack.example
    (:func:`tests.rack_dry_runs.make_rack`), :data:`JOBS` at a time in worker processes, started in
    the order the tests run; each test checks its own scenario's results. A scenario whose every
    chosen variant dry-runs alike (:func:`tests.rack_dry_runs.shared_key`) one of an earlier
    scenario's is not dry-run again: its test checks that scenario's rack (ch6's HeadSplit scenarios,
    three dry runs of about 15 CPU-s each)."""
    scenarios = [
        item.callspec.params["scenario"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_rack_example_dry_runs_every_shipped_scenario"
        and hasattr(item, "callspec")
    ]
    runs: dict[str, RackDryRuns] = {}
    made: dict[str, RackDryRuns] = {}  # shared key -> the rack whose dry run answers for it
    # forkserver: a fresh interpreter per worker, not a fork of pytest (and whatever threads it has)
    with ProcessPoolExecutor(JOBS, mp_context=multiprocessing.get_context("forkserver")) as pool:
        for scenario in dict.fromkeys(scenarios):
            keys = shared_keys(scenario)
            earlier = {id(made[k]): made[k] for k in keys if k in made}
            if keys and all(k in made for k in keys) and len(earlier) == 1:
                (runs[scenario.stem],) = earlier.values()
                continue
            root = tmp_path_factory.mktemp(f"rack-{scenario.stem}")
            inventory = make_rack(root)
            nodes = root / "nodes"
            rack = RackDryRuns(
                scenario,
                nodes,
                snapshot(nodes),
                root / "runs",
                pool.submit(dry_run_extremes, scenario, inventory, root / "runs"),
            )
            runs[scenario.stem] = rack
            for key in keys:
                made.setdefault(key, rack)
        try:
            yield runs
        finally:  # a session stopped early: start no more
            for run in runs.values():
                run.future.cancel()


@pytest.mark.parametrize("scenario", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_rack_example_dry_runs_every_shipped_scenario(
    scenario: Path, rack_dry_runs: dict[str, RackDryRuns]
) -> None:
    rack = rack_dry_runs[scenario.stem]
    outcome = rack.future.result()
    if outcome.skipped is not None:
        pytest.skip(outcome.skipped)
    ran = chosen_variants(rack.scenario)  # this scenario's own, or an earlier one's that dry-run alike
    assert len(outcome.results) == len(ran)
    results = {shared_key(v): (v, r) for v, r in zip(ran, outcome.results, strict=True)}
    for variant in chosen_variants(scenario):
        assert shared_key(variant) in results, (variant.label, rack.scenario.name)
        made, result = results[shared_key(variant)]
        assert result.label == made.label
        assert result.ok, result.render()
        assert result.mode == "inventory"
        assert set(result.hosts) == {"edgeserver", *variant.devices}
        for host in result.hosts:
            kinds = [c.kind for c in result.changes.get(host, [])]
            assert "directory" in kinds, f"{host}: {kinds}"  # its run directory, at least
        edge = result.changes["edgeserver"]
        # the edge inference service only for a runtime whose devices send it requests (issue 33)
        serves = any(c.kind == "process" and "start 'edge'" in c.details[0] for c in edge)
        assert serves == uses_edge_service(runtimes.get(str(variant.runtime["name"]))), variant.label
        for device, block in variant.network.items():  # the rack's interface, from its group_vars
            tc = [d for c in result.changes[device] if c.kind == "tc" for d in c.details]
            netem = any(f"dev wlan0 root handle 1: netem delay {block['delay_ms']:g}ms" in d for d in tc)
            # network_backend auto: where the kernel the nodes' facts came from has no sch_netem (this
            # machine), the userspace link emulator shapes instead: its iptables rules and its process
            rules = [d for c in result.changes[device] if c.kind == "iptables" for d in c.details]
            userspace = any("NFQUEUE" in d for d in rules) and any(
                "start 'link-emulator'" in d for c in result.changes[device] for d in c.details
            )
            assert netem or userspace, (tc, rules)
        for device in variant.load:
            assert any("start 'load'" in d for c in result.changes[device] for d in c.details)
        if variant.edge.nominal_frequency:
            sysfs = [d for c in edge if c.kind == "sysfs" for d in c.details]
            assert any(d.endswith("no_turbo: 0 -> 1") for d in sysfs), sysfs
        assert result.run_id is not None and run_processes(result.run_id) == []
    assert snapshot(rack.nodes) == rack.before  # no node directory, no sysfs value changed
    assert find_runs(rack.runs_root) == []
