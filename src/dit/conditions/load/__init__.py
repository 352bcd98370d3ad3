"""Compute load per device (``load.<device>``): the ``load`` role starts the load generator.

The generator (:mod:`dit.device.load`) runs as a tagged process (tag ``load``) before the edge service
starts (order 45, after the monitors and the power trace, so both see its onset), in the run's
cgroup when the memory condition sets one. Targets are drawn on the device from a generator seeded
with the scenario seed and the device name (``load_seed`` is the scenario seed; see
:func:`dit.device.load.load_rng`), so they are logged in ``load.csv`` with their monotonic time.
The edge server never gets a load. With ``timing.settle.steady`` (the default) the generator reports
ready only once its CPU share is at its target (or the settle timeout passed), so the apply stage ends
with the loads steady; the controller records each device's settle record (:mod:`dit.conditions.load.settle`). Before
the edge service, because the edge measures its capacity profile when it starts: in local mode and on
the emulated rack the devices' load shares the machine with the edge, and a profile taken before the
load mispredicted the edge's in-run stage times by up to 1.5x (docs/optimisers.md); on real boards
the order changes nothing for the edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from dit.conditions import Applied, Condition, HostContext, StageResults
from dit.conditions.load.settle import settle_messages, settle_records
from dit.scenario import Scenario
from dit.scenario.errors import Report

CONDITION = Condition(
    name="load",
    role="load",
    order=45,
    variables=(
        "load_mode",
        "load_regime",
        "load_cpu_pct",
        "load_mem_pct",
        "load_processes",
        "load_interval_s",
        "load_seed",
        "load_settle",
    ),
)


@dataclass(frozen=True)
class Regime:
    """A compute-load regime: the ranges its CPU and memory targets are drawn from, in percent."""

    cpu_pct: tuple[float, float]
    mem_pct: tuple[float, float]


#: The thesis's compute regimes (light / moderate / heavy), in percent of CPU and of memory.
LOAD_REGIMES: Final[Mapping[str, Regime]] = MappingProxyType(
    {
        "light": Regime(cpu_pct=(10.0, 20.0), mem_pct=(10.0, 20.0)),
        "moderate": Regime(cpu_pct=(30.0, 50.0), mem_pct=(30.0, 40.0)),
        "heavy": Regime(cpu_pct=(60.0, 80.0), mem_pct=(50.0, 60.0)),
    }
)
_REGIME_MODES = (*LOAD_REGIMES, "continuous")


def check_block(block: str, dev: str, conf: Mapping[str, Any], err: Report) -> None:
    """``load.<device>``: each field only with the modes that read it."""
    mode = conf.get("mode")
    if "processes" in conf and mode != "processes":
        err([block, dev, "processes"], f"only valid with mode processes (mode is {mode})")
    for key in ("regime", "interval_s"):
        if key in conf and mode != "continuous":
            err([block, dev, key], f"only valid with mode continuous (mode is {mode})")
    for key in ("cpu_pct", "mem_pct"):
        if key in conf and mode not in _REGIME_MODES:
            err([block, dev, key], f"only valid with modes {', '.join(_REGIME_MODES)} (mode is {mode})")


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    conf = scenario.load.get(host)
    if conf is None or ctx.role != "device":
        return None
    mode = str(conf["mode"])
    if mode == "processes":
        regime: str | None = None
    elif mode == "continuous":
        regime = str(conf.get("regime", "moderate"))
    else:
        regime = mode

    def number(key: str) -> float | None:
        value = conf.get(key)
        return None if value is None else float(value)

    return {
        "load_mode": mode,
        "load_regime": regime,
        "load_cpu_pct": number("cpu_pct") if mode != "processes" else None,
        "load_mem_pct": number("mem_pct") if mode != "processes" else None,
        "load_processes": int(conf["processes"]) if mode == "processes" else None,
        "load_interval_s": float(conf.get("interval_s", 10)) if mode == "continuous" else None,
        "load_seed": int(scenario.seed),
        "load_settle": settle_config(scenario),
    }


def settle_config(scenario: Scenario) -> dict[str, float] | None:
    """The generator's ``settle`` config from ``timing.settle`` (None: report ready at once)."""
    settle = scenario.timing.settle
    if not settle.steady:
        return None
    return {"timeout_s": settle.timeout_s, "tolerance_pct": settle.tolerance_pct, "window_s": settle.window_s}


def applied(scenario: Scenario, outcome: StageResults) -> Applied | None:
    """Each device's settle record from the apply stage: into ``status.json`` as ``settle``, and said."""
    settled = settle_records(outcome, scenario.devices)
    if not settled:
        return None
    infos, warnings = settle_messages(settled)
    return Applied(status={"settle": settled}, infos=tuple(infos), warnings=tuple(warnings))
