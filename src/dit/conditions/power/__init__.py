"""Power traces (``power`` role): an INA260 over I2C, or a fake sensor in local mode.

Host variables choose the sensor, not the scenario (the sensors are wiring, not an experiment
parameter): ``power_sensor`` = ``ina260`` | ``fake`` | ``none``, ``power_i2c_bus`` (1),
``power_i2c_address`` (0x40), ``power_interval_s`` (0.1). Without ``power_sensor`` a device gets the
fake sensor in local mode and nothing on real hosts; the edge server only when its host variables ask.
The fake sensor is driven by the node's own processes in local mode (``node``: every node is a
directory on one machine) and by the whole machine elsewhere (``system``). Order 42: after the
monitors, before the load and the edge service.
"""

from __future__ import annotations

from typing import Any

from dit.conditions import Condition, HostContext
from dit.scenario import Scenario

CONDITION = Condition(
    name="power",
    role="power",
    order=42,
    variables=(
        "power_sensor",
        "power_i2c_bus",
        "power_i2c_address",
        "power_interval_s",
        "power_fake_activity",
    ),
)
SENSORS = ("ina260", "fake", "none")


def _int(value: Any, what: str) -> int:
    try:
        return int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: {value!r} is not an integer") from exc


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    hv = ctx.hostvars
    default = "fake" if ctx.local and ctx.role == "device" else "none"
    sensor = str(hv.get("power_sensor", default))
    if sensor not in SENSORS:
        raise ValueError(f"host {host}: power_sensor {sensor!r} is not one of {', '.join(SENSORS)}")
    if sensor == "none":
        return None
    interval = float(hv.get("power_interval_s", 0.1))
    if interval <= 0:
        raise ValueError(f"host {host}: power_interval_s {interval} is not positive")
    return {
        "power_sensor": sensor,
        "power_i2c_bus": _int(hv.get("power_i2c_bus", 1), f"host {host}: power_i2c_bus"),
        "power_i2c_address": _int(hv.get("power_i2c_address", 0x40), f"host {host}: power_i2c_address"),
        "power_interval_s": interval,
        "power_fake_activity": "node" if ctx.local else "system",
    }
