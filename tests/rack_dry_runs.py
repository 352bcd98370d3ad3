"""Dry runs of the shipped scenarios against inventories/rack.example made local (test_dry_run.py).

Each scenario gets a rack of its own (its own node directories and fake sysfs trees), so that its dry
runs can run in a worker process beside another scenario's and still be checked on their own: the
driver installs signal handlers (main thread only) and the shipped runtimes are registered
process-wide, hence processes, not threads. This module is what the workers import.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from dit.run.driver import RunOptions
from dit.run.dryrun import DryRun, dry_run
from dit.run.localmode import make_fake_sysfs
from dit.scenario import Scenario, load
from tests.conftest import REPO, shipped_runtime

SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory), independent of dit's own check."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))
    }


def make_rack(root: Path) -> Path:
    """inventories/rack.example under ``root``, its hosts made local: one fake sysfs and node directory
    per host (under ``root/nodes``).

    Everything else (groups, group_vars: interfaces, networks, boards) is the example's own. The
    hosts share this machine's clock (dit_shared_clock) and have no wlan0 (dit_tc_dry_run: dit_tc
    assumes the kernel's default tree and would record its commands instead of running them). Their
    inference addresses are on loopback (127.0.43.x for the example's 10.43.0.x), since preflight pings
    every link even in a dry run: nothing leaves this machine, and with one echo request a link
    (dit_ping_count; the test checks what apply would change, not the links) that answered at once the
    ping task takes no time (ten unanswered requests to the example's addresses took 6 s a dry run).
    """
    inventory = root / "rack"
    shutil.copytree(REPO / "inventories" / "rack.example", inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text(encoding="utf-8"))
    edge = set(hosts["all"]["children"]["edge"]["hosts"])
    hosts_of = dict(hosts["all"]["children"]["edge"]["hosts"])
    for group in hosts["all"]["children"]["devices"]["children"].values():
        hosts_of.update(group["hosts"])
    names = list(hosts_of)
    (inventory / "host_vars").mkdir()
    for name in names:
        base = root / "nodes" / name
        address = str(hosts_of[name]["dit_inference_address"]).replace("10.43.0.", "127.0.43.", 1)
        overrides = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "dit_python": sys.executable,
            "dit_remote_base": str(base),
            "sysfs_root": str(make_fake_sysfs(base / "sys", "edge" if name in edge else "device")),
            "dit_shared_clock": True,
            "dit_tc_dry_run": True,
            "dit_inference_address": address,
            "dit_ping_count": 1,
        }
        (inventory / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(overrides), encoding="utf-8")
    return inventory


def _dry_run_key(scenario: Scenario) -> str:
    """What a dry run of ``scenario`` depends on: everything but its runtime block, its optimisation
    (on the controller, after the run) and its edge queueing policy. A dry run stops before the profile
    stage, and no preflight or apply task reads any of them (the policy is a value in the edge
    service's config file only)."""
    doc = {k: v for k, v in scenario.to_dict().items() if k not in ("runtime", "optimisation")}
    if isinstance(doc.get("edge_server"), dict):
        doc["edge_server"] = {k: v for k, v in doc["edge_server"].items() if k != "policy"}
    return json.dumps(doc, sort_keys=True)


def shared_key(scenario: Scenario) -> str:
    """What a dry run of ``scenario`` depends on across shipped scenarios: :func:`_dry_run_key` less the
    scenario's name and description (labels no task reads), plus what of the runtime block a node sees
    before the profile stage (its runtime, which decides the edge service and the readiness checks, and
    those checks' controller, workers, port and interpreter) and what a runtime builds from (its model
    and checkpoint). ch6's HeadSplit scenarios differ only in the swept fields :func:`_dry_run_key`
    already leaves out (strategy, speculation, control, tau, tokens): one dry run answers for them all."""
    doc = json.loads(_dry_run_key(scenario))
    doc.pop("name", None)
    doc.pop("description", None)
    runtime = scenario.runtime
    doc["runtime"] = {
        k: runtime.get(k) for k in ("name", "model", "checkpoint", "controller", "workers", "port", "python")
    }
    return json.dumps(doc, sort_keys=True)


def extremes(variants: list[Scenario]) -> list[Scenario]:
    """The variants worth a dry run: of those that dry-run alike (:func:`_dry_run_key`: a strategy or
    a policy sweep), one; of the rest, the sweep's first and last points (its extremes): CI time grows
    with every shipped sweep (each dry run costs about 15 CPU-s)."""
    distinct = {_dry_run_key(s): s for s in variants}
    chosen = list(distinct.values())
    return chosen[:1] + chosen[-1:] if len(chosen) > 1 else chosen


def chosen_variants(scenario: Path) -> list[Scenario]:
    """The shipped scenario's variants to dry-run (its runtimes registered while it loads)."""
    with shipped_runtime(scenario):
        return extremes(load(scenario))


@dataclass
class DryRuns:
    """A shipped scenario's dry runs, in :func:`extremes`' order, or why it was skipped."""

    results: list[DryRun] = field(default_factory=list)
    skipped: str | None = None


def dry_run_extremes(scenario: Path, inventory: Path, runs_root: Path) -> DryRuns:
    """Dry-run the chosen variants of ``scenario`` on ``inventory`` (in a worker process)."""
    options = RunOptions(
        runs_root=runs_root, inventory=str(inventory), console=Console(file=io.StringIO(), width=200)
    )
    try:
        with shipped_runtime(scenario):
            return DryRuns([dry_run(variant, options) for variant in extremes(load(scenario))])
    except pytest.skip.Exception as exc:
        return DryRuns(skipped=str(exc.msg))
