"""The condition hooks the run engine calls without naming a condition: ``applied`` and ``undo_scope``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dit.conditions import after_apply, undo_scope
from dit.run.ansible_exec import HostEvent, StageOutcome
from dit.run.journal import undo_scopes
from dit.scenario import loads

SCENARIO = """
name: hooks
model: {name: fake, params: {profile: tiny}}
devices: [device1, device2]
inference: {enabled: false}
load: {device1: {mode: moderate}}
"""
NETEM = {"netem_interface": "veth1", "netem_netns": "ns1", "netem_log": "/tmp/tc.log"}


def test_the_load_conditions_settle_records_come_back_as_status_and_lines() -> None:
    settle = {
        "steady": False,
        "reason": "timeout",
        "elapsed_s": 60.0,
        "achieved_pct": 21.0,
        "target_pct": 40.0,
    }
    event = HostEvent(
        "device1", "ansible", "changed", "load : Start", "dit_proc", {"ready": {"settle": settle}}
    )
    outcome = StageOutcome("apply", "successful", 0, {"device1": [event]})
    (applied,) = after_apply(loads(SCENARIO)[0], outcome)
    assert applied.status == {"settle": {"device1": settle}}
    assert (
        applied.infos == ()
        and len(applied.warnings) == 1
        and "device1: load not steady" in applied.warnings[0]
    )
    assert after_apply(loads(SCENARIO)[0], StageOutcome("apply", "successful", 0, {})) == []


def test_the_undo_scope_joins_what_every_condition_may_touch() -> None:
    v1 = {"dit_cgroup_root": "/sys/fs/cgroup/memory", "dit_cpu_cgroup_root": "/sys/fs/cgroup/cpu,cpuacct"}
    assert undo_scope("device1", {"netem": NETEM}, v1) == {
        "interfaces": [{"dev": "veth1", "netns": "ns1", "log": "/tmp/tc.log"}],
        "cgroup_root": "/sys/fs/cgroup",  # v1: the common parent of the memory and cpu hierarchies
    }
    v2 = {
        "dit_cgroup_root": "/sys/fs/cgroup/dit-rack/device1",
        "dit_cpu_cgroup_root": "/sys/fs/cgroup/dit-rack/device1",
    }
    assert undo_scope("device1", {}, v2) == {
        "interfaces": [],
        "cgroup_root": "/sys/fs/cgroup/dit-rack/device1",
    }


class _Inventory:
    hosts = ("edge", "device1")
    hostvars: Mapping[str, Mapping[str, Any]] = {"edge": {}, "device1": {"dit_lease_dir": "/srv/dit"}}

    def node_root(self, host: str, run_id: str) -> str:
        return f"/var/lib/dit/{run_id}"


def test_the_journals_scopes_come_from_the_inventory_and_the_conditions_the_run_built(tmp_path: Path) -> None:
    metadata = tmp_path / "metadata.json"
    metadata.write_text(
        json.dumps({"conditions": {"device1": {"netem": NETEM}, "edge": {}}}), encoding="utf-8"
    )
    scopes = undo_scopes("r1", _Inventory(), metadata)  # type: ignore[arg-type]
    assert scopes["device1"] == {
        "node_root": "/var/lib/dit/r1",
        "sysfs_root": "/sys",
        "interfaces": [{"dev": "veth1", "netns": "ns1", "log": "/tmp/tc.log"}],
        "cgroup_root": "/sys/fs/cgroup",
        "lease_dir": "/srv/dit",
    }
    assert scopes["edge"]["interfaces"] == [] and "lease_dir" not in scopes["edge"]
    assert undo_scopes("r1", _Inventory(), tmp_path / "none.json")["device1"]["interfaces"] == []  # type: ignore[arg-type]
