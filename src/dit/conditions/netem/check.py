"""Network aggregates: the netem self-check and the netem change log aligned on each device's origin.

``aggregate/netem_check.csv`` — one row per link of a device with a ``network`` block: its link
to the edge server and to every other device of the scenario (collect pings each ten times,
``<device>_ping.json``). ``intended_delay_ms`` is the RTT netem was asked to add on that path: the
device's own delay towards the target (the scenario's main profile, or the destination profile
whose address or CIDR holds the target, the most specific one; for a varying delay the mean of
``low_ms`` and ``high_ms``) plus, towards another device, that device's delay back (netem delays
egress only; the edge server is never shaped). ``baseline_rtt_ms`` is the same link measured
unshaped at preflight (``<device>_ping_baseline.json``), and ``difference_ms = measured - baseline
- intended`` (baseline 0 when unknown, so the difference then includes the unshaped RTT).

``tolerance_ms`` is how far the difference may be from 0: ``max(1 ms, 10 % of the intended
delay)``, and for a varying delay at least half its range (``(high_ms - low_ms) / 2``, pings sample
it at random phases). ``pass`` is whether ``|difference_ms| <= tolerance_ms``; it is empty when the
link was not measured or its tree was only recorded (``shaping`` = ``recorded``: local mode, or a
kernel without ``sch_netem`` and no userspace backend; the difference is then about ``-intended``).
``backend`` says what applied the delay: ``netem`` (tc) or ``userspace`` (the link emulator behind
NFQUEUE); with ``userspace``, ``emulator`` says how the emulator ended (``ok``; ``dead`` when it left
no ``<device>_link_emulator.json``: killed or crashed, its traffic dropped since, fail closed;
``overflow`` when a full queue or socket dropped packets) and a link whose emulator is not ``ok``
does not pass. ``throughput_mbit`` is
the link's iperf3 throughput when collect measured it (``network.<device>.measure_throughput``:
``<device>_iperf3.json`` towards the edge, ``<device>_iperf3_<target>.json`` towards a device).

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

from dit.analysis.links import iperf3_rate_bps
from dit.analysis.run import PROCESSES_FILE, LoadedRun, raw_file
from dit.conditions.netem import backend as netem_backend
from dit.conditions.netem import shaping as netem_shaping
from dit.conditions.netem.nfqueue import EMULATOR_TAG
from dit.conditions.netem.tc import intended_delay_ms

CHECK_COLUMNS = (
    "device",
    "target",
    "address",
    "variation",
    "shaping",
    "backend",
    "emulator",
    "intended_delay_ms",
    "measured_rtt_ms",
    "measured_rtt_min_ms",
    "baseline_rtt_ms",
    "difference_ms",
    "tolerance_ms",
    "pass",
    "pings",
    "throughput_mbit",
)
TOLERANCE_MIN_MS = 1.0  # the smallest tolerance of the self-check
TOLERANCE_FRACTION = 0.10  # of the intended delay
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


def tolerance_ms(block: Mapping[str, Any], intended_ms: float) -> float:
    """How far ``difference_ms`` may be from 0 on a link with ``intended_ms`` (module docstring)."""
    tolerance = max(TOLERANCE_MIN_MS, TOLERANCE_FRACTION * intended_ms)
    variation = block.get("variation") or {}
    if variation.get("kind", "constant") != "constant":
        tolerance = max(tolerance, (float(variation["high_ms"]) - float(variation["low_ms"])) / 2)
    return tolerance


def _addresses(run_dir: Path, devices: tuple[str, ...]) -> dict[str, str]:
    """Every node's address as the devices' pings name it (target -> address)."""
    out: dict[str, str] = {}
    for device in devices:
        for entry in _entries(_read_json(raw_file(run_dir, device, "ping.json"))):
            if entry.get("target") is not None and entry.get("address") is not None:
                out.setdefault(str(entry["target"]), str(entry["address"]))
    return out


def _throughput_mbit(run_dir: Path, device: str, target: str) -> float | None:
    name = "iperf3.json" if target == "edge" else f"iperf3_{target}.json"
    rate = iperf3_rate_bps(_read_json(raw_file(run_dir, device, name)))
    return None if rate is None else round(rate / 1e6, 3)


def emulator_state(run_dir: Path, device: str) -> tuple[str, bool]:
    """What the device's link emulator reported at exit, and whether its link can pass the check.

    The collect stage's process check found it failed (``<device>_processes.json``), or it left no
    ``<device>_link_emulator.json``: it was killed or crashed; the rules stayed (fail closed), so
    its shaped traffic was dropped from then on. A full kernel queue
    or an overflowing socket dropped packets the scenario did not ask to lose.
    """
    processes = _read_json(raw_file(run_dir, device, PROCESSES_FILE))
    for entry in processes if isinstance(processes, list) else []:
        if isinstance(entry, Mapping) and entry.get("tag") == EMULATOR_TAG and entry.get("failed"):
            state = entry.get("state", "failed")
            return f"dead: the collect stage found it {state} (its shaped traffic was dropped since)", False
    stats = _read_json(raw_file(run_dir, device, "link_emulator.json"))
    if not isinstance(stats, Mapping):
        return "dead: no link_emulator.json (killed or crashed; its shaped traffic was dropped)", False
    dropped = sum(
        int(c.get("queue_dropped", 0)) + int(c.get("user_dropped", 0))
        for c in (stats.get("kernel") or {}).values()
        if isinstance(c, Mapping)
    )
    overflows = int(stats.get("socket_overflows") or 0)
    if dropped or overflows:
        return f"overflow: {dropped} packets dropped by a full queue, {overflows} socket overflows", False
    realtime = stats.get("realtime") or {}
    fifo = realtime.get("sched_fifo") if isinstance(realtime, Mapping) else None
    return ("ok" if isinstance(fifo, int) else f"ok (SCHED_FIFO {fifo})"), True


def netem_check(run: LoadedRun | Path) -> pd.DataFrame:
    """The rows of ``netem_check.csv`` (see the module docstring)."""
    loaded = LoadedRun.of(run)
    run_dir, scenario = loaded.path, loaded.scenario
    metadata = _read_json(run_dir / "metadata.json") or {}
    network = scenario.get("network") or {}
    rows: list[dict[str, Any]] = []
    addresses = _addresses(run_dir, loaded.devices)
    for device in loaded.devices:
        block = network.get(device)
        if not isinstance(block, Mapping):
            continue
        shaping = netem_shaping(metadata, device)
        backend = netem_backend(metadata, device)
        emulator, healthy = emulator_state(run_dir, device) if backend == "userspace" else ("", True)
        baseline = {
            str(e.get("target", "edge")): _mean_ms(e.get("rtt_ns"))[0]
            for e in _entries(_read_json(raw_file(run_dir, device, "ping_baseline.json")))
        }
        for entry in _entries(_read_json(raw_file(run_dir, device, "ping.json"))):
            target = str(entry.get("target", "edge"))
            address = entry.get("address")
            address = str(address) if address is not None else None
            intended = intended_delay_ms(block, address, _resolve(block, target, address))
            back = network.get(target) if target in loaded.devices else None
            own = addresses.get(device)
            if isinstance(back, Mapping) and back:  # the other device delays its replies to this one
                intended += intended_delay_ms(back, own, _resolve(back, device, own))
            measured, fastest = _mean_ms(entry.get("rtt_ns"))
            base = baseline.get(target)
            difference = None if measured is None else measured - (base or 0.0) - intended
            tolerance = tolerance_ms(block, intended)
            verdict = None if difference is None or shaping == "recorded" else abs(difference) <= tolerance
            if verdict is not None and not healthy:
                verdict = False
            rows.append(
                {
                    "device": device,
                    "target": target,
                    "address": address,
                    "variation": (block.get("variation") or {}).get("kind", "constant"),
                    "shaping": shaping,
                    "backend": backend,
                    "emulator": emulator,
                    "intended_delay_ms": intended,
                    "measured_rtt_ms": measured,
                    "measured_rtt_min_ms": fastest,
                    "baseline_rtt_ms": base,
                    "difference_ms": difference,
                    "tolerance_ms": tolerance,
                    "pass": verdict,
                    "pings": len(entry.get("rtt_ns") or []),
                    "throughput_mbit": _throughput_mbit(run_dir, device, target),
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
