"""Monitor, power and load traces of a run: one timeline, throttling, energy.

:func:`aggregate_monitors` reads ``raw/<host>/<host>_*`` of a run directory and writes under ``aggregate/``:

``monitors.csv`` — tidy (long): ``node,t_ns,metric,value``, sorted by node, time, metric.
    Every column of every node's ``monitor.csv`` (``cpu_pct``, ``cpu0_pct`` …, ``mem_*``,
    ``thermal_zoneN_temp_c``, ``cpuN_freq_khz``, ``throttled``), every column of ``power.csv``
    (``current_a``, ``voltage_v``, ``power_w``) and the load generator's targets from ``load.csv``
    (``load_cpu_target_pct``, ``load_mem_target_pct``, ``load_mem_bytes``; one row per change — a step
    series). Empty cells are left out. ``t_ns`` is integer nanoseconds since the run's **common start
    instant**: ``start_at_ns`` of the devices' ``origin.json`` (the wall-clock instant every device slept
    until); without one, the earliest ``origin_wall_ns`` of any node. A node's monotonic sample time becomes
    ``t_ns = t_mono_ns - origin_mono_ns + (origin_wall_ns - start)`` with the node's own origin pair from
    ``<host>_origin.json`` (devices: taken at the start signal; the edge service: at its start), or, for a
    node without one, the pair in the trace's own header (``monitor.json`` / ``power.json`` /
    ``load.json``). Clocks of different nodes agree to the NTP offset the preflight gate allowed.

``throttling.csv`` — one row per node with a monitor trace:
    ``node,samples,source,throttled_during_run,under_voltage,freq_capped,throttled,soft_temp_limit,``
    ``flags_seen,flags_at_start,max_temp_c,min_freq_khz``. A flag counts for the run when its *now* bit
    (0-3) is set in any sample or its *has occurred* bit (16-19) rises during the trace (an occurred bit
    already set in the first sample happened before the run: it is reported in ``flags_at_start`` only).
    ``throttled_during_run`` is any of the four; empty where the node has no flag source (``source`` none).
    ``flags_seen`` is the OR of every sample, in hexadecimal.

``energy.csv`` — one row per inference request of every device with a power trace:
    ``device,round,repetition,partition_point,start_ns,total_ns,energy_j,mean_power_w,samples,tokens,``
    ``energy_per_token_j,edp_js``. The energy is the trapezoid integral of ``power_w`` over
    ``[start_ns, start_ns + total_ns]`` (device-origin time, as in ``inference.csv``), with the power
    interpolated linearly at both ends (exact for a piecewise-linear trace); ``samples`` counts the trace
    points strictly inside. A request outside the trace gets empty energy. ``tokens`` comes from an
    inference ``tokens`` column where a runtime writes one (then ``energy_per_token_j``), else empty.
    ``edp_js`` = energy * delay (``total_ns`` in seconds), the energy-delay product in J·s.
    Token generation (``runtime: {tokens: N}``, a decoder model) adds one row per generation
    repetition of a device (its ``tokens.csv``): ``round`` and ``partition_point`` empty (the whole model
    runs on the device), ``repetition`` the generation's, ``start_ns`` its first token's start,
    ``total_ns`` to the end of its last token, ``tokens`` = N and ``energy_per_token_j`` = energy / N.
    Runs without token generation have no such rows.

``power_summary.csv`` — one row per node with a power trace: ``node,sensor,samples,duration_ns,energy_j,``
    ``mean_power_w`` over the whole trace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd

from dit.analysis.run import AggregateError, LoadedRun, raw_file

MONITOR_COLUMNS: Final = ("node", "t_ns", "metric", "value")
THROTTLE_COLUMNS: Final = (
    "node",
    "samples",
    "source",
    "throttled_during_run",
    "under_voltage",
    "freq_capped",
    "throttled",
    "soft_temp_limit",
    "flags_seen",
    "flags_at_start",
    "max_temp_c",
    "min_freq_khz",
)
ENERGY_COLUMNS: Final = (
    "device",
    "round",
    "repetition",
    "partition_point",
    "start_ns",
    "total_ns",
    "energy_j",
    "mean_power_w",
    "samples",
    "tokens",
    "energy_per_token_j",
    "edp_js",
)
POWER_SUMMARY_COLUMNS: Final = ("node", "sensor", "samples", "duration_ns", "energy_j", "mean_power_w")
#: (name, now bit, has-occurred bit) of the Raspberry Pi firmware flags.
FLAGS: Final = (
    ("under_voltage", 0, 16),
    ("freq_capped", 1, 17),
    ("throttled", 2, 18),
    ("soft_temp_limit", 3, 19),
)
LOAD_METRICS: Final = {
    "cpu_pct": "load_cpu_target_pct",
    "mem_pct": "load_mem_target_pct",
    "mem_bytes": "load_mem_bytes",
}


def _json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AggregateError(f"{path} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else None


def _csv(path: Path, required: Iterable[str]) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError as exc:
        raise AggregateError(f"{path} is empty (no header)") from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise AggregateError(f"{path} lacks the columns {missing}")
    return frame


def nodes_of(run_dir: Path) -> list[str]:
    raw = run_dir / "raw"
    return sorted(p.name for p in raw.iterdir() if p.is_dir()) if raw.is_dir() else []


def _pair(doc: Mapping[str, Any] | None) -> tuple[int, int] | None:
    if doc is None or doc.get("origin_wall_ns") is None or doc.get("origin_mono_ns") is None:
        return None
    return int(doc["origin_wall_ns"]), int(doc["origin_mono_ns"])


def common_start_ns(run_dir: Path, nodes: Iterable[str]) -> int | None:
    """The run's common start instant (wall ns): the devices' ``start_at_ns``, else the earliest origin."""
    starts: list[int] = []
    walls: list[int] = []
    for node in nodes:
        origin = _json(raw_file(run_dir, node, "origin.json"))
        if origin is not None and origin.get("start_at_ns") is not None:
            starts.append(int(origin["start_at_ns"]))
        for name in ("origin.json", "monitor.json", "power.json", "load.json"):
            pair = _pair(_json(raw_file(run_dir, node, name)))
            if pair is not None:
                walls.append(pair[0])
    if starts:
        return min(starts)
    return min(walls) if walls else None


def _offset(run_dir: Path, node: str, header: Mapping[str, Any] | None, start: int) -> int | None:
    """What to add to a raw monotonic time of ``node`` to get ns since the common start."""
    pair = _pair(_json(raw_file(run_dir, node, "origin.json"))) or _pair(header)
    if pair is None:
        return None
    wall, mono = pair
    return wall - start - mono


def _tidy(
    node: str, frame: pd.DataFrame, offset: int, rename: Mapping[str, str] | None = None
) -> pd.DataFrame:
    t = frame["t_mono_ns"].astype("int64") + offset
    keep = [c for c in frame.columns if c != "t_mono_ns" and (rename is None or c in rename)]
    values = pd.DataFrame(
        {str((rename or {}).get(c, c)): pd.to_numeric(frame[c], errors="coerce") for c in keep}
    )
    values.insert(0, "t_ns", t)
    long = values.melt(id_vars="t_ns", var_name="metric", value_name="value").dropna(subset=["value"])
    long.insert(0, "node", node)
    return long


def monitors_table(run_dir: Path, nodes: Iterable[str], start: int) -> pd.DataFrame:
    parts: list[pd.DataFrame] = []
    for node in nodes:
        for trace, required, rename in (
            ("monitor", ("t_mono_ns",), None),
            ("power", ("t_mono_ns", "power_w"), None),
            ("load", ("t_mono_ns", "event", *LOAD_METRICS), LOAD_METRICS),
        ):
            frame = _csv(raw_file(run_dir, node, f"{trace}.csv"), required)
            if frame is None or frame.empty:
                continue
            if trace == "load":
                frame = frame[frame["event"] != "stop"]
            offset = _offset(run_dir, node, _json(raw_file(run_dir, node, f"{trace}.json")), start)
            if offset is None:
                raise AggregateError(f"{node}: no origin pair for {trace}.csv (origin.json or {trace}.json)")
            parts.append(_tidy(node, frame, offset, rename))
    if not parts:
        return pd.DataFrame(columns=list(MONITOR_COLUMNS))
    table = pd.concat(parts, ignore_index=True)
    table["t_ns"] = table["t_ns"].astype("int64")
    return table.sort_values(["node", "t_ns", "metric"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- throttling


def throttle_row(node: str, monitor: pd.DataFrame, header: Mapping[str, Any] | None) -> dict[str, Any]:
    sources = (header or {}).get("sources") or {}
    source = str(sources.get("throttle_source", "unknown"))
    temps = [c for c in monitor.columns if c.endswith("_temp_c")]
    freqs = [c for c in monitor.columns if c.endswith("_freq_khz")]
    max_temp = monitor[temps].max().max() if temps and not monitor.empty else math.nan
    min_freq = monitor[freqs].min().min() if freqs and not monitor.empty else math.nan
    row: dict[str, Any] = {
        "node": node,
        "samples": len(monitor),
        "source": source,
        "max_temp_c": max_temp,
        "min_freq_khz": min_freq,
    }
    flags = (
        pd.to_numeric(monitor["throttled"], errors="coerce").dropna().astype("int64").tolist()
        if "throttled" in monitor.columns
        else []
    )
    if not flags:
        row.update({name: None for name, _, _ in FLAGS})
        row.update({"throttled_during_run": None, "flags_seen": "", "flags_at_start": ""})
        return row
    first, seen = flags[0], 0
    for value in flags:
        seen |= value
    any_flag = False
    for name, now_bit, occurred_bit in FLAGS:
        now = bool(seen & (1 << now_bit))
        rose = bool(seen & (1 << occurred_bit)) and not first & (1 << occurred_bit)
        row[name] = now or rose
        any_flag = any_flag or row[name]
    row.update({"throttled_during_run": any_flag, "flags_seen": hex(seen), "flags_at_start": hex(first)})
    return row


# --------------------------------------------------------------------------- energy


def cumulative_energy(
    t_ns: npt.NDArray[np.int64], power_w: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Trapezoid energy (J) from the first sample to every sample."""
    dt_s = np.diff(t_ns).astype(np.float64) / 1e9
    steps = dt_s * (power_w[1:] + power_w[:-1]) / 2.0
    return np.concatenate([[0.0], np.cumsum(steps)])


def energy_at(
    t_ns: npt.NDArray[np.int64],
    power_w: npt.NDArray[np.float64],
    cum: npt.NDArray[np.float64],
    x_ns: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """Energy (J) from the first sample to each ``x`` (linear power between samples); NaN outside."""
    x = np.asarray(x_ns, dtype=np.int64)
    k = np.clip(np.searchsorted(t_ns, x, side="right") - 1, 0, len(t_ns) - 2)
    t0, t1 = t_ns[k], t_ns[k + 1]
    span = (t1 - t0).astype(np.float64)
    frac = np.where(span > 0, (x - t0).astype(np.float64) / np.where(span > 0, span, 1.0), 0.0)
    p_x = power_w[k] + frac * (power_w[k + 1] - power_w[k])
    out = cum[k] + (x - t0).astype(np.float64) / 1e9 * (power_w[k] + p_x) / 2.0
    return np.where((x >= t_ns[0]) & (x <= t_ns[-1]), out, np.nan)


def energy_between(
    t_ns: npt.NDArray[np.int64], power_w: npt.NDArray[np.float64], a_ns: Any, b_ns: Any
) -> npt.NDArray[np.float64]:
    """Energy (J) over each interval ``[a, b]`` of the trace; NaN where an interval leaves the trace."""
    if len(t_ns) < 2:
        return np.full(np.shape(a_ns), np.nan)
    cum = cumulative_energy(t_ns, power_w)
    a = np.asarray(a_ns, dtype=np.int64)
    b = np.asarray(b_ns, dtype=np.int64)
    return energy_at(t_ns, power_w, cum, b) - energy_at(t_ns, power_w, cum, a)


def _power_trace(frame: pd.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    frame = frame.dropna(subset=["t_mono_ns", "power_w"]).sort_values("t_mono_ns", kind="stable")
    frame = frame.drop_duplicates(subset="t_mono_ns", keep="last")
    return (
        frame["t_mono_ns"].to_numpy(dtype=np.int64),
        frame["power_w"].to_numpy(dtype=np.float64),
    )


def energy_rows(run_dir: Path, device: str) -> pd.DataFrame | None:
    power = _csv(raw_file(run_dir, device, "power.csv"), ("t_mono_ns", "power_w"))
    inference = _csv(raw_file(run_dir, device, "inference.csv"), ("start_ns", "total_ns"))
    origin = _pair(_json(raw_file(run_dir, device, "origin.json")))
    if power is None or inference is None or origin is None or inference.empty:
        return None
    t_mono, watts = _power_trace(power)
    t_rel = t_mono - np.int64(origin[1])  # device-origin time, as inference.csv
    start = inference["start_ns"].to_numpy(dtype=np.int64)
    total = inference["total_ns"].to_numpy(dtype=np.int64)
    energy = energy_between(t_rel, watts, start, start + total)
    seconds = total.astype(np.float64) / 1e9
    inside = np.array([int(((t_rel > s) & (t_rel < s + d)).sum()) for s, d in zip(start, total, strict=True)])
    out = pd.DataFrame(
        {
            "device": device,
            "round": inference.get("round", pd.Series([None] * len(inference))),
            "repetition": inference.get("repetition", pd.Series([None] * len(inference))),
            "partition_point": inference.get("partition_point", pd.Series([None] * len(inference))),
            "start_ns": start,
            "total_ns": total,
            "energy_j": energy,
            "mean_power_w": np.where(seconds > 0, energy / np.where(seconds > 0, seconds, 1.0), np.nan),
            "samples": inside,
        }
    )
    tokens = pd.to_numeric(inference["tokens"], errors="coerce") if "tokens" in inference.columns else None
    out["tokens"] = tokens.to_numpy() if tokens is not None else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        per_token = np.where(out["tokens"] > 0, out["energy_j"] / out["tokens"], np.nan)
    out["energy_per_token_j"] = per_token
    out["edp_js"] = energy * seconds
    return out[list(ENERGY_COLUMNS)]


def generation_energy_rows(run_dir: Path, device: str) -> pd.DataFrame | None:
    """Energy of every token-generation repetition of ``device`` (raw ``tokens.csv``), as energy.csv rows."""
    power = _csv(raw_file(run_dir, device, "power.csv"), ("t_mono_ns", "power_w"))
    tokens = _csv(raw_file(run_dir, device, "tokens.csv"), ("rep", "token", "start_ns", "latency_ns"))
    origin = _pair(_json(raw_file(run_dir, device, "origin.json")))
    if power is None or tokens is None or origin is None or tokens.empty:
        return None
    t_mono, watts = _power_trace(power)
    t_rel = t_mono - np.int64(origin[1])
    ends = tokens["start_ns"] + tokens["latency_ns"]
    reps = (
        tokens.assign(end_ns=ends)
        .groupby("rep", sort=True)
        .agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), tokens=("token", "nunique"))
    )
    start = reps["start_ns"].to_numpy(dtype=np.int64)
    total = (reps["end_ns"] - reps["start_ns"]).to_numpy(dtype=np.int64)
    energy = energy_between(t_rel, watts, start, start + total)
    seconds = total.astype(np.float64) / 1e9
    count = reps["tokens"].to_numpy(dtype=np.float64)
    inside = np.array([int(((t_rel > s) & (t_rel < s + d)).sum()) for s, d in zip(start, total, strict=True)])
    out = pd.DataFrame(
        {
            "device": device,
            "round": None,
            "repetition": reps.index.to_numpy(),
            "partition_point": None,
            "start_ns": start,
            "total_ns": total,
            "energy_j": energy,
            "mean_power_w": np.where(seconds > 0, energy / np.where(seconds > 0, seconds, 1.0), np.nan),
            "samples": inside,
            "tokens": reps["tokens"].to_numpy(),
            "energy_per_token_j": np.where(count > 0, energy / np.where(count > 0, count, 1.0), np.nan),
            "edp_js": energy * seconds,
        }
    )
    return out[list(ENERGY_COLUMNS)]


def energy_between_wall(run_dir: Path, node: str, a_wall_ns: int, b_wall_ns: int) -> float | None:
    """Energy (J) of ``node``'s power trace over the wall-clock interval ``[a, b]`` (``time.time_ns()``).

    For a runtime that records its own wall-clock span (e.g. a generation) rather than ``inference.csv``.
    The trace's monotonic times are mapped with the trace's own origin pair (``power.json``), else the
    node's ``origin.json``. None without a trace or an origin pair; NaN when the interval leaves the trace.
    """
    power = _csv(raw_file(run_dir, node, "power.csv"), ("t_mono_ns", "power_w"))
    pair = _pair(_json(raw_file(run_dir, node, "power.json"))) or _pair(
        _json(raw_file(run_dir, node, "origin.json"))
    )
    if power is None or pair is None:
        return None
    t_mono, watts = _power_trace(power)
    wall, mono = pair
    a = np.array([a_wall_ns - wall + mono], dtype=np.int64)
    b = np.array([b_wall_ns - wall + mono], dtype=np.int64)
    return float(energy_between(t_mono, watts, a, b)[0])


def power_summary_row(run_dir: Path, node: str) -> dict[str, Any] | None:
    power = _csv(raw_file(run_dir, node, "power.csv"), ("t_mono_ns", "power_w"))
    if power is None:
        return None
    header = _json(raw_file(run_dir, node, "power.json")) or {}
    t, watts = _power_trace(power)
    energy = float(cumulative_energy(t, watts)[-1]) if len(t) >= 2 else math.nan
    duration = int(t[-1] - t[0]) if len(t) >= 2 else 0
    return {
        "node": node,
        "sensor": header.get("sensor", ""),
        "samples": len(t),
        "duration_ns": duration,
        "energy_j": energy,
        "mean_power_w": energy / (duration / 1e9) if duration > 0 else math.nan,
    }


# --------------------------------------------------------------------------- entry point


def aggregate_monitors(run: LoadedRun | Path) -> None:
    """Write ``aggregate/monitors.csv``, ``throttling.csv``, ``energy.csv`` and ``power_summary.csv``."""
    run_dir = LoadedRun.of(run).path  # the traces of every node under raw/; the scenario is not needed
    nodes = nodes_of(run_dir)
    out_dir = run_dir / "aggregate"
    out_dir.mkdir(parents=True, exist_ok=True)
    start = common_start_ns(run_dir, nodes)
    empty = pd.DataFrame(columns=list(MONITOR_COLUMNS))
    table = empty if start is None else monitors_table(run_dir, nodes, start)
    table.to_csv(out_dir / "monitors.csv", index=False, columns=list(MONITOR_COLUMNS))

    throttle: list[dict[str, Any]] = []
    energy: list[pd.DataFrame] = []
    summary: list[dict[str, Any]] = []
    for node in nodes:
        monitor = _csv(raw_file(run_dir, node, "monitor.csv"), ("t_mono_ns",))
        if monitor is not None:
            throttle.append(throttle_row(node, monitor, _json(raw_file(run_dir, node, "monitor.json"))))
        rows = energy_rows(run_dir, node)
        if rows is not None:
            energy.append(rows)
        generation = generation_energy_rows(run_dir, node)
        if generation is not None:
            energy.append(generation)
        power = power_summary_row(run_dir, node)
        if power is not None:
            summary.append(power)
    pd.DataFrame(throttle, columns=list(THROTTLE_COLUMNS)).to_csv(out_dir / "throttling.csv", index=False)
    energy_table = (
        pd.concat(energy, ignore_index=True) if energy else pd.DataFrame(columns=list(ENERGY_COLUMNS))
    )
    energy_table.to_csv(out_dir / "energy.csv", index=False)
    pd.DataFrame(summary, columns=list(POWER_SUMMARY_COLUMNS)).to_csv(
        out_dir / "power_summary.csv", index=False
    )
