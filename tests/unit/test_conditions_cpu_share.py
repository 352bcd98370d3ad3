"""The CPU share condition with no host: builder, process cgroups (one per v1 hierarchy), preflight
refusals naming the field, the cgroup file choice of ``dit_cgroup``, local mode's default share, and
``spawn`` joining every cgroup of a list (hand-made cgroup directories in a temporary directory)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dit.conditions import HostContext, ProcessSettings, build_conditions, cpu_share, process_settings
from dit.conditions.cgroup_roots import cgroup_cpu_root
from dit.run.localmode import default_cpu_share_pct, local_cpu_share
from dit.scenario import ScenarioError, loads
from tests.ansible_modules import library_module, module_util

SCENARIO = """
name: share
model: fake
devices: [device1, device2]
seed: 3
hardware:
  device1: {cpu_share_pct: 30, memory_limit_mb: 512}
"""
RUN = "share-20261201T000000Z-abcd"

cgroup = library_module("dit_cgroup")
procs = module_util("dit_procs")


def ctx(host: str, hostvars: dict[str, Any] | None = None, local: bool = False) -> HostContext:
    role = "edge" if host == "edge" else "device"
    return HostContext(host, role, local, RUN, "/var/lib/dit/x", "/sys", "edge", "10.0.0.1", hostvars or {})


def contexts(local: bool = False, **hostvars: dict[str, Any]) -> dict[str, HostContext]:
    return {h: ctx(h, hostvars.get(h), local) for h in ("edge", "device1", "device2")}


def test_the_share_is_a_1_ms_quota_per_period_in_a_cgroup_named_after_the_run() -> None:
    (scn,) = loads(SCENARIO)
    built = build_conditions(scn, contexts(device1={"dit_cpu_cgroup_root": "/sys/fs/cgroup/cpu/"}))
    assert built["device1"]["cpu_share"] == {
        "cgroup_cpu_path": f"/sys/fs/cgroup/cpu/dit-{RUN}-device1",
        "cgroup_cpu_quota_us": 1_000,
        "cgroup_cpu_period_us": 3_334,
        "cgroup_cpu_field": "hardware.device1.cpu_share_pct",
    }
    assert "cpu_share" not in built["device2"] and "cpu_share" not in built["edge"]
    assert cpu_share.quota_us(250) == 5_000  # two and a half cores: 5 ms per 2 ms
    # the shortest period with the kernel's 1 ms minimum quota (the finest grain: bursts of 1 ms
    # after a pause), and no shorter than 2 ms
    periods = [cpu_share.period_us(p) for p in (1, 3, 5, 10, 25, 50, 100)]
    assert periods == [100_000, 33_334, 20_000, 10_000, 4_000, 2_000, 2_000]
    assert [cpu_share.quota_us(p) for p in (1, 3, 5, 10, 25, 50, 100)] == [1_000] * 6 + [2_000]


def test_local_mode_gives_every_device_its_default_share_and_the_scenario_value_wins() -> None:
    (scn,) = loads(SCENARIO)
    default = {"dit_cpu_share_default_pct": 50}
    built = build_conditions(scn, contexts(local=True, device1=default, device2=default, edge=default))

    def share(host: str) -> tuple[int, int]:
        block = built[host]["cpu_share"]
        return block["cgroup_cpu_quota_us"], block["cgroup_cpu_period_us"]

    assert share("device1") == (1_000, 3_334)  # the scenario's 30 %
    assert share("device2") == (1_000, 2_000)  # the default 50 %
    assert "cpu_share" not in built["edge"]  # the edge server is never capped
    # Not local: the inventory default is not a scenario value.
    assert "cpu_share" not in build_conditions(scn, contexts(device2=default))["device2"]


def test_on_cgroup_v1_the_processes_join_the_memory_and_the_cpu_cgroup() -> None:
    (scn,) = loads(SCENARIO)
    v1 = {"dit_cgroup_root": "/sys/fs/cgroup/memory", "dit_cpu_cgroup_root": "/sys/fs/cgroup/cpu"}
    settings = process_settings(scn, contexts(device1=v1))
    assert settings["device1"].cgroups == (
        f"/sys/fs/cgroup/memory/dit-{RUN}-device1",
        f"/sys/fs/cgroup/cpu/dit-{RUN}-device1",
    )
    # v2: one directory holds both limits, joined once, in the old single-path form.
    v2 = process_settings(scn, contexts())["device1"]
    assert v2.cgroup == f"/sys/fs/cgroup/dit-{RUN}-device1" and v2.cgroups == (v2.cgroup,)
    assert process_settings(scn, contexts())["device2"].cgroups == ()
    assert ProcessSettings({}, None).cgroups == ()


def test_preflight_refuses_more_than_the_node_has_naming_the_field() -> None:
    (scn,) = loads(SCENARIO.replace("cpu_share_pct: 30", "cpu_share_pct: 450"))
    built = build_conditions(scn, contexts())
    facts = {"device1": {"cpu_count": 4, "cpu_controller": "v2", "cpu_cgroup_root": "/sys/fs/cgroup"}}
    assert cpu_share.preflight_problems(facts, built) == [
        "device1: hardware.device1.cpu_share_pct is 450, but device1 has 4 CPUs: at most 400 "
        "(the share is a percentage of one CPU)"
    ]
    facts["device1"]["cpu_count"] = 8
    assert cpu_share.preflight_problems(facts, built) == []


def test_preflight_names_the_cpu_root_of_a_v1_node_and_a_node_without_quota() -> None:
    (scn,) = loads(SCENARIO)
    built = build_conditions(scn, contexts())
    v1 = {"device1": {"cpu_count": 4, "cpu_controller": "v1", "cpu_cgroup_root": "/sys/fs/cgroup/cpu"}}
    (problem,) = cpu_share.preflight_problems(v1, built)
    assert problem.startswith("device1: hardware.device1.cpu_share_pct: ")
    assert problem.endswith("set dit_cpu_cgroup_root: /sys/fs/cgroup/cpu for device1 in the inventory")
    off = {"device1": {"cpu_count": 4, "cpu_controller": "disabled", "cpu_cgroup_root": None}}
    (problem,) = cpu_share.preflight_problems(off, built)
    assert "hardware.device1.cpu_share_pct needs a CPU quota" in problem


@pytest.mark.parametrize("value", [0, 25601, 12.5])
def test_the_schema_bounds_the_share_and_names_the_field(value: object) -> None:
    with pytest.raises(ScenarioError, match=r"hardware\.device1\.cpu_share_pct"):
        loads(SCENARIO.replace("cpu_share_pct: 30", f"cpu_share_pct: {value}"))


def test_dit_cgroup_writes_cpu_max_on_v2_and_the_cfs_files_on_v1(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (v2 / "cgroup.subtree_control").write_text("memory\n")
    version, problem = cgroup.detect(str(v2), "cpu")
    assert version is None and "the cpu controller is not enabled for the children of" in problem
    (v2 / "cgroup.subtree_control").write_text("cpu memory\n")
    assert cgroup.detect(str(v2), "cpu") == ("v2", None)
    assert cgroup.cpu_files("v2", 30_000, 100_000) == [("cpu.max", "30000 100000"), ("cpu.weight", "10000")]
    v1 = tmp_path / "cpu"
    v1.mkdir()
    assert "set dit_cpu_cgroup_root (cgroup v2: /sys/fs/cgroup, cgroup v1: /sys/fs/cgroup/cpu)" in str(
        cgroup.detect(str(v1), "cpu")[1]
    )
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup.detect(str(v1), "cpu") == ("v1", None)
    assert cgroup.cpu_files("v1", 30_000, 100_000) == [
        ("cpu.cfs_period_us", "100000"),
        ("cpu.cfs_quota_us", "30000"),
        ("cpu.shares", "262144"),
        ("cpu.rt_runtime_us", "10000"),  # a v1 cpu group has no RT budget: SCHED_FIFO needs one
    ]
    no_rt_groups = cgroup.cpu_files("v1", 30_000, 100_000, lambda name: name != "cpu.rt_runtime_us")
    assert [name for name, _ in no_rt_groups] == ["cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.shares"]
    assert cgroup.detect(str(v1))[0] is None  # a cpu hierarchy is no memory hierarchy


def test_spawn_joins_every_cgroup_of_a_list_and_keeps_the_single_path_form(tmp_path: Path) -> None:
    dirs = [tmp_path / "memory" / "dit-x", tmp_path / "cpu,cpuacct" / "dit-x"]
    for d in dirs:
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("")
    child = procs.spawn(
        [sys.executable, "-c", "pass"],
        {},
        str(tmp_path),
        str(tmp_path / "out"),
        str(tmp_path / "err"),
        [str(d) for d in dirs],
    )
    assert child.wait(timeout=30) == 0
    assert [(d / "cgroup.procs").read_text() for d in dirs] == [str(child.pid)] * 2
    # A single path with a comma stays one path (v1 mounts cpu,cpuacct).
    assert procs.cgroup_dirs(str(dirs[1])) == [str(dirs[1])]
    assert procs.cgroup_dirs(None) == [] and procs.cgroup_dirs([str(dirs[0])] * 2) == [str(dirs[0])]
    with pytest.raises(ValueError, match="not an absolute path"):
        procs.cgroup_dirs(["relative/dir"])
    with pytest.raises(OSError, match=r"has no cgroup\.procs"):
        procs.spawn(["true"], {}, str(tmp_path), str(tmp_path / "o"), str(tmp_path / "e"), [str(tmp_path)])


def test_local_mode_default_share_is_an_equal_split_and_the_cpu_root_is_found(tmp_path: Path) -> None:
    assert default_cpu_share_pct(1, 4) == 25
    assert default_cpu_share_pct(3, 4) == 75
    assert default_cpu_share_pct(1, 1) == 100
    assert default_cpu_share_pct(1, 200) == 1
    with pytest.raises(ValueError, match="devices"):
        default_cpu_share_pct(1, 0)
    (tmp_path / "cpu,cpuacct").mkdir()
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_root(tmp_path) == str(tmp_path / "cpu,cpuacct")
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert cgroup_cpu_root(tmp_path) == str(tmp_path)


def test_dit_local_cpu_share_turns_the_local_share_on_or_sets_it() -> None:
    assert local_cpu_share(None, True, 1, 4) == 25  # on by default (see local_cpu_share)
    assert local_cpu_share(None, False, 1, 4) is None  # where it can be applied
    assert local_cpu_share("auto", True, 1, 4) == 25
    assert local_cpu_share("off", True, 1, 4) is None
    assert local_cpu_share("60", True, 1, 4) == 60
    assert local_cpu_share("60", False, 1, 4) is None  # not root, or no cpu controller
    with pytest.raises(ValueError, match="DIT_LOCAL_CPU_SHARE='half'"):
        local_cpu_share("half", True, 1, 4)
