"""CPU frequency caps per device (``hardware.<device>.cpu_freq_mhz``, optional ``governor``).

A 1.8 GHz board stands in for a 1.2 or 0.6 GHz one: every cpufreq policy of the device gets
``scaling_max_freq`` = the cap in kHz (and ``scaling_governor`` when asked). The ``cpufreq`` role
writes them through ``dit_sysfs``, which refuses, naming the scenario field, a cap outside
``cpuinfo_min_freq..cpuinfo_max_freq`` or missing from ``scaling_available_frequencies``, and a
governor missing from ``scaling_available_governors``; the prior values are journaled and
restored at teardown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dit.conditions import Condition, HostContext
from dit.scenario import Scenario

CONDITION = Condition(
    name="cpufreq",
    role="cpufreq",
    order=10,
    variables=("cpufreq_max_khz", "cpufreq_governor", "cpufreq_field"),
)

KHZ_PER_MHZ = 1000


@dataclass(frozen=True)
class CpufreqTarget:
    """What every cpufreq policy of one device is set to."""

    field: str  # the scenario path of the device's hardware block, e.g. hardware.device1
    max_khz: int | None
    governor: str | None

    def variables(self) -> dict[str, Any]:
        return {
            "cpufreq_max_khz": self.max_khz,
            "cpufreq_governor": self.governor,
            "cpufreq_field": self.field,
        }


def target(scenario: Scenario, host: str) -> CpufreqTarget | None:
    """The cap and governor of ``host``, or None when its scenario asks for neither."""
    if host not in scenario.devices:
        return None
    hardware = scenario.hardware.get(host, {})
    mhz = hardware.get("cpu_freq_mhz")
    governor = hardware.get("governor")
    if mhz is None and governor is None:
        return None
    return CpufreqTarget(
        field=f"hardware.{host}",
        max_khz=None if mhz is None else int(mhz) * KHZ_PER_MHZ,
        governor=None if governor is None else str(governor),
    )


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    found = target(scenario, host)
    return None if found is None else found.variables()
