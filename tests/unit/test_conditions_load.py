"""Builders of the load, monitors and power conditions (no host), and their place in apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dit.conditions import EDGE_SERVICE_ORDER, HostContext, active, build_conditions, conditions
from dit.run.ansible_exec import render_playbook
from dit.scenario import loads

SCENARIO = """
name: c
model: fake
devices: [device1, device2, device3, device4]
seed: 11
load:
  device1: {mode: heavy}
  device2: {mode: continuous, regime: light, interval_s: 2, mem_pct: 5}
  device3: {mode: processes, processes: 3}
"""


def contexts(local: bool = True, hostvars: dict[str, dict[str, Any]] | None = None) -> dict[str, HostContext]:
    hostvars = hostvars or {}

    def ctx(host: str, role: str) -> HostContext:
        return HostContext(
            host, role, local, "run", f"/tmp/{host}/run", "/sys", "edge", "127.0.0.1", hostvars.get(host, {})
        )

    return {"edge": ctx("edge", "edge")} | {f"device{i}": ctx(f"device{i}", "device") for i in range(1, 5)}


def built(local: bool = True, hostvars: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    (scenario,) = loads(SCENARIO)
    return build_conditions(scenario, contexts(local, hostvars))


def test_load_variables_per_mode() -> None:
    b = built()
    assert b["device1"]["load"] == {
        "load_mode": "heavy",
        "load_regime": "heavy",
        "load_cpu_pct": None,
        "load_mem_pct": None,
        "load_processes": None,
        "load_interval_s": None,
        "load_seed": 11,
        "load_settle": {"timeout_s": 10.0, "tolerance_pct": 5.0, "window_s": 1.0},
    }
    assert b["device2"]["load"] == {
        "load_mode": "continuous",
        "load_regime": "light",
        "load_cpu_pct": None,
        "load_mem_pct": 5.0,
        "load_processes": None,
        "load_interval_s": 2.0,
        "load_seed": 11,
        "load_settle": {"timeout_s": 10.0, "tolerance_pct": 5.0, "window_s": 1.0},
    }
    assert b["device3"]["load"]["load_processes"] == 3
    assert b["device3"]["load"]["load_regime"] is None
    assert "load" not in b["device4"] and "load" not in b["edge"]


def test_settle_follows_timing_settle() -> None:
    text = SCENARIO + "timing: {settle: {timeout_s: 5, tolerance_pct: 2.5, window_s: 0.5}}\n"
    (scenario,) = loads(text)
    b = build_conditions(scenario, contexts())
    assert b["device1"]["load"]["load_settle"] == {"timeout_s": 5.0, "tolerance_pct": 2.5, "window_s": 0.5}
    (off,) = loads(SCENARIO + "timing: {settle: {steady: false}}\n")
    assert build_conditions(off, contexts())["device1"]["load"]["load_settle"] is None


def test_continuous_defaults_come_from_the_schema() -> None:
    (scenario,) = loads("name: c\nmodel: fake\ndevices: [d1]\nload:\n  d1: {mode: continuous}\n")
    ctx = {"d1": contexts()["device1"]}
    variables = build_conditions(scenario, ctx)["d1"]["load"]
    assert (variables["load_regime"], variables["load_interval_s"]) == ("moderate", 10.0)


def test_monitors_run_on_every_node_at_1_hz() -> None:
    b = built()
    assert all(b[host]["monitors"] == {"monitors_interval_s": 1.0} for host in b)


def test_power_is_fake_on_local_devices_and_absent_elsewhere_unless_the_inventory_says() -> None:
    b = built(local=True)
    assert b["device1"]["power"] == {
        "power_sensor": "fake",
        "power_i2c_bus": 1,
        "power_i2c_address": 0x40,
        "power_interval_s": 0.1,
        "power_fake_activity": "node",
    }
    assert "power" not in b["edge"]
    rack = built(
        local=False,
        hostvars={
            "device1": {"power_sensor": "ina260", "power_i2c_address": "0x41", "power_interval_s": 0.05},
            "device2": {"power_sensor": "none"},
        },
    )
    assert rack["device1"]["power"]["power_sensor"] == "ina260"
    assert rack["device1"]["power"]["power_i2c_address"] == 0x41
    assert rack["device1"]["power"]["power_interval_s"] == 0.05
    assert "power" not in rack["device2"] and "power" not in rack["device3"] and "power" not in rack["edge"]
    with pytest.raises(ValueError, match="host device1: power_sensor 'ina219'"):
        built(local=False, hostvars={"device1": {"power_sensor": "ina219"}})


def test_orders_put_them_before_the_edge_service_monitors_first() -> None:
    """The edge's capacity profile runs under the devices' load, as its inference will (issue 14)."""
    order = {c.name: c.order for c in conditions()}
    assert order["netem"] < order["monitors"] < order["power"] < order["load"] < EDGE_SERVICE_ORDER
    names = [c.name for c in active(built())]
    assert names.index("monitors") < names.index("power") < names.index("load")


def test_apply_includes_the_roles_before_the_edge_service(tmp_path: Path) -> None:
    mine = [c for c in active(built()) if c.name in ("monitors", "power", "load")]
    text = render_playbook("apply", tmp_path, {"conditions_before": mine, "conditions_after": []}).read_text()
    edge = text.index("Start the edge inference service")
    assert text.index("name: monitors") < text.index("name: power") < text.index("name: load") < edge
    assert "load_seed: \"{{ dit_conditions[inventory_hostname]['load']['load_seed'] }}\"" in text
