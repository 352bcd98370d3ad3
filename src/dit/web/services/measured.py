"""What the latest run of a scenario measured on each link, for the map's per-link control (issue 36).

A run of scenario ``NAME`` lives in ``<runs>/NAME/<run id>/``; its ``aggregate/links.csv`` holds each
device's ping RTT towards its targets (:mod:`dit.analysis.links`, nanoseconds), and
``aggregate/netem_check.csv`` (:mod:`dit.conditions.netem.check`) the same links' unshaped baseline RTT
from preflight and the delay netem was asked to add. The newest run directory that has a
``links.csv`` is the measurement; none means "no measurement".

A measured RTT offered as a link's delay: netem delays a device's egress only, so a device → edge
link adds its delay once per round trip (delay = RTT) and a device ↔ device link, shaped at both
ends, twice (delay = RTT / 2 at each end).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from dit.analysis.inputs import EDGE_HOST
from dit.run.rundir import STATUS, read_json_object
from dit.web.services.runs import SEGMENT

LINKS = Path("aggregate") / "links.csv"
CHECK = Path("aggregate") / "netem_check.csv"


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return None if value is None or math.isnan(value) else value  # NaN: not measured


def _ms(ns: str | None) -> float | None:
    value = _number(ns)
    return None if value is None else round(value / 1e6, 6)


def latest_measured_run(runs_root: Path, scenario: str) -> Path | None:
    """The newest run directory of ``scenario`` with a ``links.csv`` (names sort by their start time)."""
    folder = runs_root / scenario
    if not folder.is_dir():
        return None
    found = [p for p in folder.iterdir() if (p / STATUS).is_file() and (p / LINKS).is_file()]
    return max(found, key=lambda p: p.name) if found else None


def measured_links(runs_root: Path, scenario: str) -> dict[str, Any]:
    """``{"scenario", "run", "state", "links"}``: each measured link of the latest run (``run`` None and
    no links when there is none). ``scenario`` must be a run directory's name (ValueError otherwise)."""
    if not SEGMENT.match(scenario):
        raise ValueError(
            f"{scenario!r} is not a scenario name (letters, digits, '_', '.', '-'; up to 128 characters)"
        )
    run = latest_measured_run(runs_root, scenario)
    if run is None:
        return {"scenario": scenario, "run": None, "state": None, "links": []}
    check = {(r.get("device"), r.get("target")): r for r in _rows(run / CHECK)}
    links: list[dict[str, Any]] = []
    for row in _rows(run / LINKS):
        device, target = row.get("device") or "", row.get("target") or ""
        rtt = _ms(row.get("rtt_ns_mean"))
        if not device or not target or rtt is None:
            continue  # a link collect could not ping: nothing measured
        both_ends = target != EDGE_HOST
        extra = check.get((device, target)) or {}
        links.append(
            {
                "device": device,
                "target": target,
                "rtt_ms_mean": rtt,
                "rtt_ms_min": _ms(row.get("rtt_ns_min")),
                "rtt_ms_max": _ms(row.get("rtt_ns_max")),
                "baseline_rtt_ms": _number(extra.get("baseline_rtt_ms")),
                "intended_delay_ms": _number(extra.get("intended_delay_ms")),
                "pings": int(_number(extra.get("pings")) or 0) or None,
                # the delay that gives this RTT: once per round trip to the edge, at both ends between devices
                "delay_ms": round(rtt / 2 if both_ends else rtt, 6),
                "delay_rule": (
                    "half the RTT: a device ↔ device link is shaped at both ends"
                    if both_ends
                    else "the RTT: netem adds a device's delay to the edge once per round trip"
                ),
            }
        )
    state = read_json_object(run / STATUS).get("state")
    return {"scenario": scenario, "run": f"{scenario}/{run.name}", "state": state, "links": links}
