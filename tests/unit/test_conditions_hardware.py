"""Hardware conditions with no host: cpufreq caps, edge nominal frequency, memory cgroups.

The builders are pure; the refusals and the cgroup file choice live in the node modules
(``library/dit_sysfs.py``, ``library/dit_cgroup.py``), whose pure parts are exercised here against
the fake sysfs tree of local mode and hand-made cgroup directories in a temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2.nativetypes
import pytest
import yaml

from dit.conditions import HostContext, build_conditions, cpufreq, edge_frequency, memory, process_settings
from dit.run.localmode import make_fake_sysfs
from dit.scenario import Scenario, loads
from tests.ansible_modules import library_module, module_util

REPO = Path(__file__).resolve().parents[2]

SCENARIO = """
name: hw
model: fake
devices: [device1, device2, device3]
seed: 3
edge_server: {nominal_frequency: true}
hardware:
  device1: {cpu_freq_mhz: 1200, governor: performance, memory_limit_mb: 512}
  device2: {governor: powersave}
  device3: {threads: 2}
"""


sysfs = library_module("dit_sysfs")
cgroup = library_module("dit_cgroup")
files = module_util("dit_files")


def scenario(text: str = SCENARIO) -> Scenario:
    (scn,) = loads(text)
    return scn


def ctx(host: str, hostvars: dict[str, Any] | None = None) -> HostContext:
    role = "edge" if host == "edge" else "device"
    return HostContext(
        host,
        role,
        False,
        "hw-20261129T000000Z-abcd",
        "/var/lib/dit/x",
        "/sys",
        "edge",
        "10.0.0.1",
        hostvars or {},
    )


def contexts(**hostvars: dict[str, Any]) -> dict[str, HostContext]:
    return {h: ctx(h, hostvars.get(h)) for h in ("edge", "device1", "device2", "device3")}


def role_entries(role: str, names: list[str], **public: Any) -> list[dict[str, Any]]:
    """The dit_sysfs entries of ``role`` (its vars/main.yml), rendered with ``public`` variables."""
    raw = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text(encoding="utf-8"))
    env = jinja2.nativetypes.NativeEnvironment()

    def render(value: Any, scope: dict[str, Any]) -> Any:
        if isinstance(value, str) and "{{" in value:
            return env.from_string(value).render(**scope)
        if isinstance(value, dict):
            return {k: render(v, scope) for k, v in value.items()}
        if isinstance(value, list):
            return [render(v, scope) for v in value]
        return value

    scope: dict[str, Any] = dict(public)
    for key, value in raw.items():  # vars/main.yml defines names before it uses them
        if not key.endswith("files"):
            scope[key] = render(value, scope)
    return [scope[name] for name in names]


# -- builders ----------------------------------------------------------------------------------


def test_cpufreq_builder_turns_megahertz_into_a_kilohertz_cap_per_device() -> None:
    scn = scenario()
    built = build_conditions(scn, contexts())
    assert built["device1"]["cpufreq"] == {
        "cpufreq_max_khz": 1_200_000,
        "cpufreq_governor": "performance",
        "cpufreq_field": "hardware.device1",
    }
    assert built["device2"]["cpufreq"] == {
        "cpufreq_max_khz": None,
        "cpufreq_governor": "powersave",
        "cpufreq_field": "hardware.device2",
    }
    assert "cpufreq" not in built["device3"]  # threads only: nothing to write
    assert "cpufreq" not in built["edge"]
    assert cpufreq.target(scn, "device1") == cpufreq.CpufreqTarget(
        "hardware.device1", 1_200_000, "performance"
    )


def test_edge_frequency_applies_to_the_edge_server_only_and_only_when_asked() -> None:
    built = build_conditions(scenario(), contexts())
    assert built["edge"]["edge_frequency"] == {
        "edge_frequency_nominal": True,
        "edge_frequency_field": "edge_server.nominal_frequency",
    }
    assert all("edge_frequency" not in built[d] for d in ("device1", "device2", "device3"))
    off = scenario(SCENARIO.replace("nominal_frequency: true", "nominal_frequency: false"))
    assert "edge_frequency" not in build_conditions(off, contexts())["edge"]
    assert edge_frequency.CONDITION.order < 50 and cpufreq.CONDITION.order < 50


def test_memory_builder_names_the_cgroup_after_the_run_and_the_host_under_the_root() -> None:
    scn = scenario()
    built = build_conditions(scn, contexts())
    assert built["device1"]["memory"] == {
        "cgroup_memory_path": "/sys/fs/cgroup/dit-hw-20261129T000000Z-abcd-device1",
        "cgroup_memory_limit_bytes": 512 * 1024 * 1024,
        "cgroup_memory_field": "hardware.device1.memory_limit_mb",
    }
    assert all("memory" not in built[h] for h in ("edge", "device2", "device3"))
    v1 = build_conditions(scn, contexts(device1={"dit_cgroup_root": "/sys/fs/cgroup/memory/"}))
    assert v1["device1"]["memory"]["cgroup_memory_path"] == (
        "/sys/fs/cgroup/memory/dit-hw-20261129T000000Z-abcd-device1"
    )


def test_the_run_processes_of_a_limited_device_join_its_cgroup() -> None:
    settings = process_settings(scenario(), contexts(device1={"dit_cgroup_root": "/cg"}))
    assert settings["device1"].cgroup == "/cg/dit-hw-20261129T000000Z-abcd-device1"
    assert settings["device2"].cgroup is None and settings["edge"].cgroup is None
    assert settings["device3"].env["OMP_NUM_THREADS"] == "2"  # other conditions still contribute


# -- cpufreq refusals and targets (dit_sysfs against the fake sysfs of local mode) ----------


def cpufreq_plan(root: Path, **public: Any) -> tuple[list[dict[str, Any]], list[str]]:
    names = []
    if public.get("cpufreq_governor"):
        names.append("__cpufreq_governor_entry")
    if public.get("cpufreq_max_khz"):
        names.append("__cpufreq_max_entry")
    entries = role_entries("cpufreq", names, cpufreq_field="hardware.device1", **public)
    changes, _seen, problems = sysfs.plan(str(root), entries)
    return changes, problems


@pytest.mark.parametrize(
    ("mhz", "message"),
    [
        (2000, "hardware.device1.cpu_freq_mhz: 2000 MHz is above cpuinfo_max_freq 1800 MHz"),
        (500, "hardware.device1.cpu_freq_mhz: 500 MHz is below cpuinfo_min_freq 600 MHz"),
        (
            1250,
            "hardware.device1.cpu_freq_mhz: 1250 MHz is not one of scaling_available_frequencies "
            "(600 700 800 900 1000 1100 1200 1300 1400 1500 1600 1700 1800 MHz)",
        ),
    ],
)
def test_a_cap_the_board_cannot_take_is_refused_naming_the_field(
    tmp_path: Path, mhz: int, message: str
) -> None:
    root = make_fake_sysfs(tmp_path / "sys", "device")
    _changes, problems = cpufreq_plan(root, cpufreq_max_khz=mhz * 1000)
    assert problems == [message]


def test_an_unknown_governor_is_refused_naming_the_field(tmp_path: Path) -> None:
    root = make_fake_sysfs(tmp_path / "sys", "device")
    _changes, problems = cpufreq_plan(root, cpufreq_governor="turbo")
    assert problems == [
        "hardware.device1.governor: 'turbo' is not one of scaling_available_governors "
        "(conservative ondemand userspace powersave performance schedutil)"
    ]


def test_without_available_frequencies_only_the_range_is_checked(tmp_path: Path) -> None:
    root = make_fake_sysfs(tmp_path / "sys", "device")
    (root / "devices/system/cpu/cpufreq/policy0/scaling_available_frequencies").unlink()
    changes, problems = cpufreq_plan(root, cpufreq_max_khz=1_250_000)
    assert problems == []
    assert [c["target"] for c in changes] == ["1250000"]


def test_the_cap_targets_every_policy_and_journals_the_exact_prior_content(tmp_path: Path) -> None:
    root = make_fake_sysfs(tmp_path / "sys", "edge")  # four policies
    changes, problems = cpufreq_plan(root, cpufreq_max_khz=2_000_000, cpufreq_governor="performance")
    assert problems == []
    policies = root / "devices/system/cpu/cpufreq"
    assert [(c["path"], c["prior"], c["target"]) for c in changes] == [
        *[(str(policies / f"policy{i}/scaling_governor"), "powersave\n", "performance") for i in range(4)],
        *[(str(policies / f"policy{i}/scaling_max_freq"), "4900000\n", "2000000") for i in range(4)],
    ]
    for change in changes:  # once written, nothing is left to do
        Path(change["path"]).write_text(change["target"] + "\n", encoding="utf-8")
    assert cpufreq_plan(root, cpufreq_max_khz=2_000_000, cpufreq_governor="performance") == ([], [])


# -- edge nominal frequency ------------------------------------------------------------------

EDGE_NAMES = ["__edge_frequency_max_entry", "__edge_frequency_min_entry", "__edge_frequency_turbo_entries"]


def edge_plan(root: Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    maximum, minimum, turbo = role_entries("edge_frequency", EDGE_NAMES)
    changes, _seen, problems = sysfs.plan(str(root), [maximum, minimum, *turbo])
    return [(str(Path(c["path"]).relative_to(root)), c["prior"], c["target"]) for c in changes], problems


def test_intel_pstate_edge_is_pinned_to_base_frequency_with_no_turbo(tmp_path: Path) -> None:
    root = make_fake_sysfs(tmp_path / "sys", "edge")
    changes, problems = edge_plan(root)
    assert problems == []
    policy = "devices/system/cpu/cpufreq/policy{}/scaling_{}_freq"
    assert changes == [
        *[(policy.format(i, "max"), "4900000\n", "3600000") for i in range(4)],
        *[(policy.format(i, "min"), "800000\n", "3600000") for i in range(4)],
        ("devices/system/cpu/intel_pstate/no_turbo", "0\n", "1"),  # last: undone first
    ]


def test_without_intel_pstate_the_edge_uses_cpuinfo_max_freq_and_cpufreq_boost(tmp_path: Path) -> None:
    root = make_fake_sysfs(tmp_path / "sys", "edge", cpus=2)
    cpu = root / "devices/system/cpu"
    for d in (cpu / "intel_pstate").iterdir():
        d.unlink()
    (cpu / "intel_pstate").rmdir()
    for i in range(2):
        (cpu / f"cpufreq/policy{i}/base_frequency").unlink()
        (cpu / f"cpufreq/policy{i}/cpuinfo_max_freq").write_text("3200000\n", encoding="utf-8")
    (cpu / "cpufreq/boost").write_text("1\n", encoding="utf-8")
    changes, problems = edge_plan(root)
    assert problems == []
    assert changes[-1] == ("devices/system/cpu/cpufreq/boost", "1\n", "0")
    assert {c[2] for c in changes[:-1]} == {"3200000"}


# -- the file helpers both kernel-file modules share (module_utils/dit_files.py) --------------


def test_sysfs_and_cgroup_read_and_compare_files_with_the_one_shared_helper() -> None:
    for module in (sysfs, cgroup):
        assert module.read is files.read
        assert module.same is files.same
    assert sysfs.as_int is files.as_int


def test_a_file_holds_its_target_when_both_are_the_same_integer_or_the_same_text(tmp_path: Path) -> None:
    (tmp_path / "max").write_text("1200000\n")
    assert files.read(str(tmp_path / "max")) == "1200000\n"
    assert files.read(str(tmp_path / "missing")) is None
    assert files.same("1200000\n", 1200000)
    assert files.same("0100\n", "100")  # numerically equal
    assert files.same("performance\n", "performance")
    assert not files.same("powersave\n", "performance")
    assert not files.same(None, "0")  # an unreadable file never holds anything
    assert files.as_int(" 42\n") == 42
    assert files.as_int("max") is None


# -- memory cgroups: v1 / v2 file choice, preflight advice ------------------------------------


def test_cgroup_v2_is_detected_from_the_parent_and_gets_memory_max_and_swap_max(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert cgroup.detect(str(tmp_path)) == ("v2", None)
    limit = 512 << 20
    assert cgroup.limit_files("v2", limit, 0, lambda name: True) == [
        ("memory.max", str(limit)),
        ("memory.swap.max", "0"),
    ]
    no_swap_accounting = cgroup.limit_files("v2", limit, 0, lambda name: name != "memory.swap.max")
    assert no_swap_accounting == [("memory.max", str(limit))]


def test_cgroup_v2_without_memory_for_children_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu\n")
    version, problem = cgroup.detect(str(tmp_path))
    assert version is None
    assert (
        problem
        == f"the memory controller is not enabled for the children of {tmp_path} (cgroup.subtree_control: cpu)"
    )


def test_cgroup_v1_gets_limit_in_bytes_and_memsw_when_swap_accounting_exists(tmp_path: Path) -> None:
    (tmp_path / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup.detect(str(tmp_path)) == ("v1", None)
    limit = 64 << 20
    assert cgroup.limit_files("v1", limit, 0, lambda name: True) == [
        ("memory.limit_in_bytes", str(limit)),
        ("memory.memsw.limit_in_bytes", str(limit)),
    ]
    assert cgroup.limit_files("v1", limit, 0, lambda name: "memsw" not in name) == [
        ("memory.limit_in_bytes", str(limit))
    ]


def test_a_root_that_is_no_memory_hierarchy_names_the_variable_to_set(tmp_path: Path) -> None:
    version, problem = cgroup.detect(str(tmp_path))
    assert version is None
    assert "set dit_cgroup_root (cgroup v2: /sys/fs/cgroup, cgroup v1: /sys/fs/cgroup/memory)" in problem


def test_preflight_refuses_a_disabled_memory_controller_with_the_exact_advice() -> None:
    built = build_conditions(scenario(), contexts())
    nodes: dict[str, dict[str, Any]] = {
        "edge": {"memory_controller": "disabled"},  # no limit asked there: no problem
        "device1": {"memory_controller": "disabled", "memory_cgroup_root": None},
        "device2": {"memory_controller": "disabled"},
    }
    assert memory.preflight_problems(nodes, built) == [
        "device1: hardware.device1.memory_limit_mb needs the cgroup memory controller, which is disabled "
        "on device1: add cgroup_enable=memory cgroup_memory=1 to /boot/firmware/cmdline.txt "
        "(Raspberry Pi OS; /boot/cmdline.txt on older releases) and reboot"
    ]


def test_preflight_names_the_root_of_a_cgroup_v1_node() -> None:
    built = build_conditions(scenario(), contexts())  # default root: the v2 one
    v1 = {"device1": {"memory_controller": "v1", "memory_cgroup_root": "/sys/fs/cgroup/memory"}}
    (problem,) = memory.preflight_problems(v1, built)
    assert problem.endswith("set dit_cgroup_root: /sys/fs/cgroup/memory for device1 in the inventory")
    v2 = {"device1": {"memory_controller": "v2", "memory_cgroup_root": "/sys/fs/cgroup"}}
    assert memory.preflight_problems(v2, built) == []
