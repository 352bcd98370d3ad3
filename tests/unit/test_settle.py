"""The controller's view of settling: each device's settle record from the apply stage, reported."""

from __future__ import annotations

from typing import Any

from dit.conditions.load.settle import settle_messages, settle_records
from dit.run.ansible_exec import HostEvent, StageOutcome


def proc_event(host: str, task: str, ready: dict[str, Any] | None) -> HostEvent:
    return HostEvent(host, "ansible", "changed", task, "dit_proc", {"ready": ready} if ready else {})


STEADY = {
    "steady": True,
    "reason": "steady",
    "elapsed_s": 1.3,
    "achieved_pct": 39.1,
    "target_pct": 40.0,
    "tolerance_pct": 5.0,
    "window_s": 1.0,
    "timeout_s": 60.0,
}
TIMEOUT = {**STEADY, "steady": False, "reason": "timeout", "elapsed_s": 60.0, "achieved_pct": 21.0}


def test_records_come_from_the_load_generators_ready_result() -> None:
    outcome = StageOutcome(
        "apply",
        "successful",
        0,
        {
            "device1": [
                proc_event("device1", "Start the monitor", {"pid": 1}),
                proc_event("device1", "load : Start the load generator", {"pid": 2, "settle": STEADY}),
            ],
            "device2": [
                proc_event("device2", "load : Start the load generator", {"pid": 3, "settle": TIMEOUT})
            ],
            "device3": [proc_event("device3", "Start the monitor", {"pid": 4})],  # no load: no record
            "edge": [proc_event("edge", "Start the edge inference service", {"port": 1})],
        },
    )
    records = settle_records(outcome, ["device1", "device2", "device3"])
    assert records == {"device1": STEADY, "device2": TIMEOUT}


def test_a_timeout_is_a_warning_not_silence() -> None:
    infos, warnings = settle_messages({"device1": STEADY, "device2": TIMEOUT})
    assert infos == ["device1: load steady after 1.30 s (39.1 % of a core, target 40.0 ± 5.0)"]
    assert len(warnings) == 1 and warnings[0].startswith("device2: load not steady (timeout after 60.00 s")
    assert "21.0 % of a core" in warnings[0]
