"""Pure parts of the driver: inventory generation, playbook rendering, collected archives, gates."""

from __future__ import annotations

import importlib
import io
import shutil
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dit.ansible_data import load_unsafe_yaml
from dit.models.resolve import ModelError, resolve_model
from dit.run.ansible_exec import render_playbook
from dit.run.collect import extract_collected
from dit.run.driver import Driver, RunOptions, StageFailed
from dit.run.inventory import local_inventory
from dit.run.localmode import make_fake_sysfs, snapshot_tree
from dit.run.rundir import RunDir
from dit.scenario import loads

STAGES = ("preflight", "apply", "profile", "collect", "teardown")


def test_local_inventory_has_edge_and_devices_with_fake_sysfs(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ("device1", "device2"))
    assert inv.local and inv.edge_host == "edge" and inv.hosts == ("edge", "device1", "device2")
    assert inv.limit == "edge:device1:device2"
    data = load_unsafe_yaml(Path(inv.source).read_text())
    assert data["all"]["vars"]["ansible_connection"] == "local"
    assert set(data["all"]["children"]["devices"]["hosts"]) == {"device1", "device2"}
    sysfs = Path(inv.hostvars["device1"]["sysfs_root"])
    policy = sysfs / "devices/system/cpu/cpufreq/policy0"
    assert (policy / "scaling_max_freq").read_text().strip() == "1800000"
    assert "600000" in (policy / "scaling_available_frequencies").read_text()
    edge_sysfs = Path(inv.hostvars["edge"]["sysfs_root"])
    assert (edge_sysfs / "devices/system/cpu/intel_pstate/no_turbo").read_text().strip() == "0"


def test_local_devices_send_from_loopback_addresses_of_their_own(tmp_path: Path) -> None:
    """Each local device its own 127.A.B.x source address (the userspace link emulator's rules select
    a device by it), distinct per device and per run, clear of the edge's 127.0.0.1."""
    import ipaddress

    inv = local_inventory(tmp_path / "a", ("device1", "device2"))
    first = [inv.source_of(d) for d in ("device1", "device2")]
    assert inv.source_of("edge") == "" and len(set(first)) == 2
    for address in first:
        parsed = ipaddress.ip_address(address)
        assert parsed.is_loopback and parsed not in ipaddress.ip_network("127.0.0.0/16")
    assert local_inventory(tmp_path / "b", ("device1",)).source_of("device1") != first[0]
    data = load_unsafe_yaml(Path(inv.source).read_text())
    assert data["all"]["children"]["devices"]["hosts"]["device2"]["dit_source_address"] == first[1]


def test_local_devices_stand_for_a_board_s_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local device's load takes its memory targets from a Pi 4's 4096 MiB, not this machine's
    MemTotal (DIT_LOCAL_MEMORY_MB: auto, off or MiB); the edge has no load."""
    monkeypatch.delenv("DIT_LOCAL_MEMORY_MB", raising=False)
    inv = local_inventory(tmp_path / "a", ("device1", "device2"))
    assert [inv.hostvars[d]["load_board_memory_mb"] for d in ("device1", "device2")] == [4096, 4096]
    assert "load_board_memory_mb" not in inv.hostvars["edge"]
    monkeypatch.setenv("DIT_LOCAL_MEMORY_MB", "2048")
    assert local_inventory(tmp_path / "b", ("device1",)).hostvars["device1"]["load_board_memory_mb"] == 2048
    monkeypatch.setenv("DIT_LOCAL_MEMORY_MB", "off")
    assert "load_board_memory_mb" not in local_inventory(tmp_path / "c", ("device1",)).hostvars["device1"]
    monkeypatch.setenv("DIT_LOCAL_MEMORY_MB", "4G")
    with pytest.raises(ValueError, match="DIT_LOCAL_MEMORY_MB='4G'"):
        local_inventory(tmp_path / "d", ("device1",))


def test_fake_sysfs_snapshot_is_stable(tmp_path: Path) -> None:
    root = make_fake_sysfs(tmp_path / "sys", "device")
    before = snapshot_tree(root)
    assert before == snapshot_tree(make_fake_sysfs(tmp_path / "sys", "device"))
    (root / "class/thermal/thermal_zone0/temp").write_text("80000\n")
    assert snapshot_tree(root) != before


@pytest.mark.parametrize("stage", STAGES)
def test_stage_playbooks_render_to_valid_yaml_without_scenario_text(stage: str, tmp_path: Path) -> None:
    path = render_playbook(stage, tmp_path, {})
    plays = yaml.safe_load(path.read_text())
    assert isinstance(plays, list) and plays
    for play in plays:
        assert play["gather_facts"] is False
        assert play["tasks"]
    # Ansible's own expressions pass through the driver's rendering untouched.
    assert "{{ dit_run_id }}" in path.read_text() or stage == "preflight"


def _archive(raw: Path, host: str, members: dict[str, bytes]) -> None:
    with tarfile.open(raw / f"{host}.tar.gz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_extract_collected_lays_out_raw_host_dirs(tmp_path: Path) -> None:
    _archive(tmp_path, "device1", {"results/device1_layers.csv": b"a", "logs/device1_profile.err": b"b"})
    names = extract_collected(tmp_path, "device1")
    assert sorted(names) == ["device1/device1_layers.csv", "device1/logs/device1_profile.err"]
    assert (tmp_path / "device1" / "device1_layers.csv").read_bytes() == b"a"
    assert not (tmp_path / "device1.tar.gz").exists()


@pytest.mark.parametrize("bad", ["results/../../etc/passwd", "results/other_layers.csv", "results/a/b"])
def test_extract_collected_refuses_unexpected_members(tmp_path: Path, bad: str) -> None:
    _archive(tmp_path, "device1", {bad: b"x"})
    with pytest.raises(StageFailed, match="unexpected member"):
        extract_collected(tmp_path, "device1")
    assert not (tmp_path.parent / "etc").exists()


def _driver(tmp_path: Path, text: str) -> Driver:
    (scenario,) = loads(text)
    return Driver(scenario, RunOptions(runs_root=tmp_path))


def test_ntp_gate_names_the_node_and_offset(tmp_path: Path) -> None:
    driver = _driver(
        tmp_path, "name: n\nmodel: fake\ndevices: [device1]\ntiming: {max_clock_offset_ms: 1.0}\n"
    )
    driver._ntp_gate(
        {"device1": {"ntp": {"source": "chrony", "offset_ms": 0.4}}, "edge": {"ntp": {"source": "local"}}}
    )
    with pytest.raises(StageFailed, match=r"device1: clock offset -2\.500 ms exceeds 1\.0 ms"):
        driver._ntp_gate({"device1": {"ntp": {"source": "chrony", "offset_ms": -2.5}}})
    with pytest.raises(StageFailed, match=r"device1: clock offset unknown \(chronyc not found"):
        driver._ntp_gate(
            {"device1": {"ntp": {"source": "none", "offset_ms": None, "error": "chronyc not found"}}}
        )


def test_fake_model_resolves_to_its_builder() -> None:
    resolved = resolve_model("fake", {"profile": "tiny"}, {"kind": "synthetic", "seed": 1}, 1, True, True)
    assert resolved.stand_in_for is None
    assert resolved.spec["builder"] == "dit.device.fakemodel:build"


def test_a_model_without_its_framework_gets_its_fake_stand_in_in_local_mode_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AlexNet without TensorFlow: local mode runs the fake model with AlexNet's stage profile and
    records the substitution; --no-stand-in and a real host refuse it, naming the extra to install."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a)
    )
    data = {"kind": "synthetic", "seed": 1}
    resolved = resolve_model("alexnet", {}, data, 3, True, True)
    assert resolved.stand_in_for == "alexnet"
    assert resolved.spec == {
        "name": "fake",
        "builder": "dit.device.fakemodel:build",
        "params": {"profile": "alexnet"},
        "input": data,
        "seed": 3,
    }
    with pytest.raises(ModelError, match=r"needs tensorflow.*pip install 'dit\[keras\]'"):
        resolve_model("alexnet", {}, data, 3, True, False)
    assert resolve_model("alexnet", {}, data, 3, False, True).stand_in_for is None  # a real host


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ModelError, match="unknown model 'nope'"):
        resolve_model("nope", {}, {}, 0, True, True)


def test_local_inventory_keeps_the_edge_server_off_the_devices_cpus(tmp_path: Path) -> None:
    import os

    inv = local_inventory(tmp_path, ("device1", "device2"))
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        assert "dit_cpu_affinity" not in inv.hostvars["edge"]
        return
    assert inv.hostvars["edge"]["dit_cpu_affinity"] == cpus[:1]
    for device in ("device1", "device2"):
        assert inv.hostvars[device]["dit_cpu_affinity"] == cpus[1:]


def test_inference_addresses_of_every_host() -> None:
    from dit.run.inventory import RunInventory

    hostvars = {
        "edge": {"ansible_host": "192.168.1.10", "dit_inference_address": "10.0.0.1"},
        "device1": {"ansible_host": "192.168.1.11", "dit_inference_address": "10.0.0.11"},
        "device2": {"ansible_host": "192.168.1.12"},
    }
    real = RunInventory("inv", False, "edge", ("device1", "device2", "device3"), "10.0.0.1", hostvars)
    assert real.address_of("edge") == "10.0.0.1"
    assert real.address_of("device1") == "10.0.0.11"  # the Wi-Fi address, not the wired one
    assert real.address_of("device2") == "192.168.1.12"
    assert real.address_of("device3") == "device3"
    local = RunInventory("inv", True, "edge", ("device1",), "127.0.0.1", {})
    assert local.address_of("device1") == "127.0.0.1"


def test_the_driver_finds_the_edge_service_task_by_its_name(tmp_path: Path) -> None:
    from dit.run.driver import EDGE_SERVICE_TASK

    plays = yaml.safe_load(render_playbook("apply", tmp_path, {}).read_text())
    tasks = [t for play in plays for t in play["tasks"] if "dit_proc" in t]
    assert [t["name"] for t in tasks] == [EDGE_SERVICE_TASK]
    assert tasks[0]["when"] == "inventory_hostname in groups['edge']"


def test_apply_lets_each_node_go_its_own_way_up_to_the_edge_service(tmp_path: Path) -> None:
    """A node's run directory, its conditions before the edge service and the service itself are one
    play in the free strategy: the edge starts its service (seconds of capacity profile) while a device
    still waits for its load generator to settle, rather than every node waiting for the slowest at
    every task. The conditions after the service (background traffic towards it) wait for it."""
    from dit.conditions import EDGE_SERVICE_ORDER, conditions
    from dit.run.driver import EDGE_SERVICE_TASK

    roles = [c for c in conditions() if c.role is not None]
    context = {
        "conditions_before": [c for c in roles if c.order < EDGE_SERVICE_ORDER],
        "conditions_after": [c for c in roles if c.order >= EDGE_SERVICE_ORDER],
    }
    plays = yaml.safe_load(render_playbook("apply", tmp_path, context).read_text())
    first, after = plays
    assert first["hosts"] == "all" and first["strategy"] == "ansible.builtin.free"
    names = [t["name"] for t in first["tasks"]]
    assert names[0].startswith("Create the node run directory")
    assert names[1:-1] == [f"Apply condition: {c.name}" for c in context["conditions_before"]]
    assert names[-1] == EDGE_SERVICE_TASK
    assert "strategy" not in after  # linear: every node's service is up before any traffic is sent
    assert [t["name"] for t in after["tasks"]] == [
        f"Apply condition: {c.name}" for c in context["conditions_after"]
    ]


# -- condition hooks: the driver calls every condition package's preflight and aggregate ----------

FAKE_CONDITION = """
from dit.conditions import Condition

CONDITION = Condition(name="zz_fake", role=None, order=99, variables=())
CALLS = []


def build(scenario, host, ctx):
    return None


def preflight(facts):
    CALLS.append(("preflight", dict(facts.nodes), facts.local))
    reason = facts.nodes.get("device1", {}).get("fake_refusal")
    return f"fake condition refused: {reason}" if reason else None


def aggregate(run):
    CALLS.append(("aggregate", run))
"""


@pytest.fixture
def fake_condition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A condition package ``dit.conditions.zz_fake`` that exists only for the test."""
    import dit.conditions as registry

    extra = tmp_path / "extra_conditions"
    (extra / "zz_fake").mkdir(parents=True)
    (extra / "zz_fake" / "__init__.py").write_text(FAKE_CONDITION)
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(extra)])
    try:
        yield importlib.import_module("dit.conditions.zz_fake").CALLS
    finally:
        sys.modules.pop("dit.conditions.zz_fake", None)


def test_driver_calls_the_preflight_hook_of_every_condition_package(
    tmp_path: Path, fake_condition: list[Any]
) -> None:
    driver = _driver(tmp_path, "name: n\nmodel: fake\ndevices: [device1]\n")
    driver.inventory = local_inventory(tmp_path / "inv", ("device1",))
    driver.conditions = {"edge": {}, "device1": {}}
    driver._condition_gates({"device1": {}, "edge": {}})
    assert fake_condition == [("preflight", {"device1": {}, "edge": {}}, True)]
    with pytest.raises(StageFailed, match=r"^preflight: fake condition refused: no fake kernel$"):
        driver._condition_gates({"device1": {"fake_refusal": "no fake kernel"}})


class _QuietReporter:
    def stage(self, stage: str, state: str, ms: float | None = None) -> None:
        pass

    def info(self, text: str) -> None:
        pass


def test_driver_calls_the_aggregate_hook_of_every_condition_package_with_one_loaded_run(
    tmp_path: Path, fake_condition: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dit.analysis.run as run_module

    run = RunDir.create(tmp_path / "runs", "n", "0" * 64)
    run_dir = run.path
    shutil.copytree(
        Path(__file__).resolve().parents[1] / "fixtures" / "run_small", run_dir, dirs_exist_ok=True
    )
    reads: list[Path] = []
    real_load_yaml = run_module.load_yaml
    monkeypatch.setattr(run_module, "load_yaml", lambda path: reads.append(path) or real_load_yaml(path))
    # the driver's own scenario says which steps run; the analysis reads the run's scenario.yaml
    driver = _driver(
        tmp_path,
        "name: n\nmodel: fake\ndevices: [device1, device2]\ninference: {enabled: true}\n"
        "optimisation: {enabled: true, algorithm: greedy, objective: total_delay, policy: SJF}\n",
    )
    driver.run = run
    driver.reporter = _QuietReporter()  # type: ignore[assignment]
    driver._aggregate()
    optimum = driver._optimise()
    assert fake_condition == [("aggregate", driver.analysed)]
    assert driver.analysed.path == run_dir
    assert (run_dir / "aggregate" / "netem_check.csv").is_file()  # netem's own aggregate hook ran too
    assert (run_dir / "aggregate" / "validation.csv").is_file()
    assert optimum is not None and optimum["vector"] == [2, 1]
    assert reads == [run_dir / "scenario.yaml"]  # one read for every analysis step and the optimiser


def test_the_runtimes_processes_use_the_nodes_interpreter_in_local_mode(tmp_path: Path) -> None:
    import sys

    from dit.run.inventory import local_inventory
    from dit.run.launch import launch_vars

    driver = _driver(tmp_path, "name: n\nmodel: fake\ndevices: [device1]\ninference: {enabled: false}\n")
    driver.run = RunDir.create(tmp_path / "runs", "n", "0" * 64)
    driver.node = driver.variant.node(driver.run)  # the run id and journal on the nodes (not a sweep's)
    driver.inventory = local_inventory(driver.run.path, ("device1",))
    driver.contexts = driver._host_contexts()
    driver.model = resolve_model("fake", {"profile": "tiny"}, {"kind": "synthetic", "seed": 1}, 1, True, True)
    ctx = driver._launch_context({})
    assert ctx.pythons == {"edge": sys.executable, "device1": sys.executable}
    (agent,) = launch_vars(driver.runtime, ctx, driver.inv.hosts)["device1"]["main"]
    assert agent["argv"][0] == sys.executable  # the venv's, which has the model's framework
