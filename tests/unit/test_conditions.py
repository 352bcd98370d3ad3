"""The condition registry: discovery, variable contracts, process settings (threads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dit import conditions as registry
from dit.conditions import Condition, HostContext, build_conditions, process_settings
from dit.run.ansible_exec import render_playbook
from dit.scenario import loads

SCENARIO = """
name: c
model: fake
devices: [device1, device2]
seed: 11
hardware:
  device1: {threads: 2}
"""


def contexts() -> dict[str, HostContext]:
    def ctx(host: str, role: str) -> HostContext:
        return HostContext(host, role, True, "run", f"/tmp/{host}/run", "/sys", "edge", "127.0.0.1")

    return {
        "edge": ctx("edge", "edge"),
        "device1": ctx("device1", "device"),
        "device2": ctx("device2", "device"),
    }


def test_threads_reach_only_the_device_that_asks_and_seeds_reach_every_host() -> None:
    (scenario,) = loads(SCENARIO)
    settings = process_settings(scenario, contexts())
    assert settings["device1"].env["OMP_NUM_THREADS"] == "2"
    assert settings["device1"].env["TF_NUM_INTRAOP_THREADS"] == "2"
    assert settings["device1"].env["DIT_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in settings["device2"].env
    assert all(s.env["PYTHONHASHSEED"] == "11" for s in settings.values())
    assert all(s.cgroup is None for s in settings.values())


def test_a_builder_returning_other_variables_than_declared_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    fake = types.ModuleType("dit.conditions.fake_condition")
    fake.CONDITION = Condition("fake_condition", "fake_role", 60, ("fake_a",))  # type: ignore[attr-defined]
    fake.build = lambda scenario, host, ctx: {"fake_b": 1}  # type: ignore[attr-defined]
    monkeypatch.setattr(registry, "_modules", lambda: [fake])
    (scenario,) = loads(SCENARIO)
    with pytest.raises(
        ValueError, match=r"condition fake_condition: builder returned variables \['fake_b'\]"
    ):
        build_conditions(scenario, contexts())


def test_apply_playbook_includes_each_active_role_with_its_variables(tmp_path: Path) -> None:
    before = [Condition("pin", "edge_pin", 10, ("pin_khz",))]
    after = [Condition("load", "load", 70, ("load_mode", "load_cpu"))]
    text = render_playbook(
        "apply", tmp_path, {"conditions_before": before, "conditions_after": after}
    ).read_text()
    assert (
        text.index("name: edge_pin")
        < text.index("Start the edge inference service")
        < text.index("name: load")
    )
    assert "pin_khz: \"{{ dit_conditions[inventory_hostname]['pin']['pin_khz'] }}\"" in text
    assert "load_cpu: \"{{ dit_conditions[inventory_hostname]['load']['load_cpu'] }}\"" in text
    assert "when: \"'load' in dit_conditions[inventory_hostname] | default({})\"" in text


def test_cpu_sets_come_from_the_inventory() -> None:
    (scenario,) = loads(SCENARIO)
    ctxs = contexts()
    ctxs["edge"] = HostContext(
        "edge", "edge", True, "run", "/tmp/edge/run", "/sys", "edge", "127.0.0.1", {"dit_cpu_affinity": [0]}
    )
    settings = process_settings(scenario, ctxs)
    assert settings["edge"].cpus == (0,)
    assert settings["device1"].cpus is None


def test_every_condition_is_a_package_with_its_hooks_found_by_the_scan() -> None:
    modules = {m.CONDITION.name: m for m in registry._modules()}
    assert all(hasattr(m, "__path__") for m in modules.values()), "a condition is one package"
    assert {c.name for c, _ in registry.aggregate_hooks()} >= {"netem"}
    assert {name for name, m in modules.items() if hasattr(m, "preflight")} >= {"memory", "netem"}


def test_preflight_refusals_come_from_the_condition_hooks_in_condition_order() -> None:
    (scenario,) = loads(
        SCENARIO.replace("{threads: 2}", "{memory_limit_mb: 64}")
        + "network:\n  device2: {delay_ms: 20, interface: wlan0}\n"
    )
    built = build_conditions(scenario, contexts())
    nodes = {
        "device1": {"memory_controller": "disabled"},
        "device2": {"kernel": "6.1", "netem": {"available": False, "reason": "no module"}},
    }
    facts = registry.PreflightFacts(scenario, nodes, built, {}, local=False)
    memory, netem = registry.preflight_refusals(facts)
    assert memory.startswith("memory limit refused: device1: hardware.device1.memory_limit_mb needs")
    assert netem.startswith("network shaping refused: device2: kernel 6.1 lacks sch_netem (no module)")
    # local mode records the tc commands instead of running them: only the memory gate applies
    local = registry.PreflightFacts(scenario, nodes, built, {}, local=True)
    assert registry.preflight_refusals(local) == [memory]
