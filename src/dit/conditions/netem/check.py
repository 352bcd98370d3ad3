"""Network aggregates: the netem self-check and the netem change log aligned on each device's origin.

``aggregate/netem_check.csv`` — one row per device and ping target: the delay netem was asked to
add on that path (the scenario's main profile, or the destination profile whose address or CIDR
holds the target, the most specific one; for a varying delay the mean of ``low_ms`` and
``high_ms``), the RTT measured by collect's pings (``<device>_ping.json``), the baseline RTT when a
``<device>_ping_baseline.json`` exists, and ``difference_ms = measured - baseline - intended``
(baseline 0 when unknown, so the difference then includes the unshaped RTT). netem delays only
the device's egress, so the intended *added RTT* is the delay itself. ``shaping`` says whether the
tree was applied or only recorded (local mode: no ``sch_netem`` here), in which case the
difference is expected to be about ``-intended``.

``aggregate/netem_changes.csv`` — every change of the ``netem-vary`` process
(``<device>_netem_changes.csv``) with ``t_ns = t_mono_ns - origin_mono_ns`` from the device's
``<device>_origin.json``, so the delay in force lines up with the monitor traces and the
inference records by arithmetic. Changes before the start signal have a negative ``t_ns``.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dit.analysis.run import LoadedRun, raw_file
from dit.conditions.netem.tc import intended_delay_ms

CHECK_COLUMNS = (
    "device",
    "target",
    "address",
    "variation",
    "shaping",
    "intended_delay_ms",
    "measured_rtt_ms",
    "measured_rtt_min_ms",
    "baseline_rtt_ms",
    "difference_ms",
    "pings",
)
CHANGE_COLUMNS = ("device", "step", "t_mono_ns", "t_ns", "delay_ms", "ok", "dry_run")


@dataclass(frozen=True)
class NetworkSummary:
    check_rows: int
    change_rows: int
    files: tuple[str, ...]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _entries(doc: Any) -> list[Mapping[str, Any]]:
    items = doc if isinstance(doc, list) else [doc]
    return [e for e in items if isinstance(e, Mapping)]


def _mean_ms(rtts: Any) -> tuple[float | None, float | None]:
    values = [float(v) for v in rtts or [] if isinstance(v, int | float) and not isinstance(v, bool)]
    if not values:
        return None, None
    return sum(values) / len(values) / 1e6, min(values) / 1e6


def _resolve(block: Mapping[str, Any], target: str, address: str | None) -> dict[str, str]:
    """Destination keys as addresses: literal IPs and CIDRs, and the ping target by its name."""
    out: dict[str, str] = {}
    for key in block.get("destinations") or {}:
        try:
            out[key] = str(ipaddress.ip_network(key, strict=False))
        except ValueError:
            if key == target and address:
                out[key] = address
    return out


def _shaping(metadata: Mapping[str, Any], device: str) -> str:
    conditions = metadata.get("conditions") or {}
    netem = (conditions.get(device) or {}).get("netem") if isinstance(conditions, Mapping) else None
    if isinstance(netem, Mapping):
        return "recorded" if netem.get("netem_dry_run") else "applied"
    return "recorded" if metadata.get("mode") == "local" else "none"


def netem_check(run: LoadedRun | Path) -> pd.DataFrame:
    """The rows of ``netem_check.csv`` (see the module docstring)."""
    loaded = LoadedRun.of(run)
    run_dir, scenario = loaded.path, loaded.scenario
    metadata = _read_json(run_dir / "metadata.json") or {}
    network = scenario.get("network") or {}
    rows: list[dict[str, Any]] = []
    for device in loaded.devices:
        block = network.get(device)
        if not isinstance(block, Mapping):
            continue
        baseline = {
            str(e.get("target", "edge")): _mean_ms(e.get("rtt_ns"))[0]
            for e in _entries(_read_json(raw_file(run_dir, device, "ping_baseline.json")))
        }
        for entry in _entries(_read_json(raw_file(run_dir, device, "ping.json"))):
            target = str(entry.get("target", "edge"))
            address = entry.get("address")
            address = str(address) if address is not None else None
            intended = intended_delay_ms(block, address, _resolve(block, target, address))
            measured, fastest = _mean_ms(entry.get("rtt_ns"))
            base = baseline.get(target)
            rows.append(
                {
                    "device": device,
                    "target": target,
                    "address": address,
                    "variation": (block.get("variation") or {}).get("kind", "constant"),
                    "shaping": _shaping(metadata, device),
                    "intended_delay_ms": intended,
                    "measured_rtt_ms": measured,
                    "measured_rtt_min_ms": fastest,
                    "baseline_rtt_ms": base,
                    "difference_ms": None if measured is None else measured - (base or 0.0) - intended,
                    "pings": len(entry.get("rtt_ns") or []),
                }
            )
    return pd.DataFrame(rows, columns=list(CHECK_COLUMNS))


def netem_changes(run: LoadedRun | Path) -> pd.DataFrame:
    """The rows of ``netem_changes.csv`` (see the module docstring)."""
    loaded = LoadedRun.of(run)
    run_dir = loaded.path
    frames: list[pd.DataFrame] = []
    for device in loaded.devices:
        path = raw_file(run_dir, device, "netem_changes.csv")
        if not path.is_file():
            continue
        frame = pd.read_csv(path)
        origin = _read_json(raw_file(run_dir, device, "origin.json")) or {}
        mono = origin.get("origin_mono_ns")
        frame.insert(0, "device", device)
        frame["t_ns"] = (frame["t_mono_ns"] - int(mono)).astype("int64") if isinstance(mono, int) else pd.NA
        frames.append(frame[list(CHANGE_COLUMNS)])
    if not frames:
        return pd.DataFrame(columns=list(CHANGE_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def aggregate_network(run: LoadedRun | Path) -> NetworkSummary:
    """Write ``aggregate/netem_check.csv`` and ``aggregate/netem_changes.csv`` for a collected run."""
    loaded = LoadedRun.of(run)
    out = loaded.aggregate_dir
    out.mkdir(parents=True, exist_ok=True)
    check = netem_check(loaded)
    changes = netem_changes(loaded)
    check.to_csv(out / "netem_check.csv", index=False)
    changes.to_csv(out / "netem_changes.csv", index=False)
    return NetworkSummary(len(check), len(changes), ("netem_check.csv", "netem_changes.csv"))
