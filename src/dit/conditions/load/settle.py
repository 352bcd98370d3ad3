"""Settle until steady: what each device's load generator reported after the apply stage.

With ``timing.settle.steady`` (the default) the load generator of every device with a load reports
ready only once its CPU share is within ``tolerance_pct`` of its target over ``window_s``, or after
``timeout_s`` (:mod:`dit.device.load`); the ``dit_proc`` task that starts it waits for that ready file and
returns its content. :func:`settle_records` picks each device's ``settle`` record out of the apply
stage's results, :func:`settle_messages` turns them into report lines, a warning for every device that
did not settle (timeout or stopped) — never silent. The load condition's ``applied`` hook hands the
records to the driver, which stores them in ``status.json`` as ``settle`` (``{device: record}``;
docs/raw-results.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dit.conditions import StageResults

LOAD_TAG = "load"


def settle_records(outcome: StageResults, devices: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{device: settle record}`` for every device whose load generator reported one."""
    records: dict[str, dict[str, Any]] = {}
    for device in devices:
        for event in reversed(outcome.results.get(device, [])):
            if event.action != "dit_proc" or event.status not in ("ok", "changed"):
                continue
            ready = event.result.get("ready")
            if isinstance(ready, Mapping) and isinstance(ready.get("settle"), Mapping):
                records[device] = dict(ready["settle"])
                break
    return records


def settle_messages(records: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """(info lines, warning lines) for the run log: one line per device."""
    infos: list[str] = []
    warnings: list[str] = []
    for device, rec in records.items():
        achieved = rec.get("achieved_pct")
        shown = "not measured" if achieved is None else f"{float(achieved):.1f} %"
        target = rec.get("target_pct")
        if rec.get("steady"):
            if target is None:
                infos.append(f"{device}: load settled ({rec.get('reason', 'steady')})")
            else:
                infos.append(
                    f"{device}: load steady after {float(rec.get('elapsed_s', 0.0)):.2f} s "
                    f"({shown} of a core, target {float(target):.1f} ± {float(rec.get('tolerance_pct', 0)):.1f})"
                )
        else:
            warnings.append(
                f"{device}: load not steady ({rec.get('reason', 'unknown')} after "
                f"{float(rec.get('elapsed_s', 0.0)):.2f} s: {shown} of a core, target "
                f"{'?' if target is None else f'{float(target):.1f}'} ± {float(rec.get('tolerance_pct', 0)):.1f}); "
                "the run goes on with the load as it is"
            )
    return infos, warnings
