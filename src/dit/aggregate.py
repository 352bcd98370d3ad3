"""The aggregate stage: raw per-host results -> the interchange files the delay model consumes.

Reads ``scenario.yaml`` and ``raw/<host>/<host>_*`` of a run directory and writes under ``aggregate/``:

- ``layers.csv``       one row per (host, stage) for every device and the edge server;
- ``feasibility.csv``  one row per device: the largest feasible partition point and what binds;
- ``links.csv``        one row per (device, target): RTT statistics and the link rate, with its source;
- ``phases.csv``       every device's inference rows with a ``host`` column;
- ``phases_summary.csv`` means per (host, round, partition point).

docs/interchange.md describes every column, its unit and the fallbacks. :func:`read_model_inputs` reads the
first three back (plus ``scenario.yaml``) into a :class:`dit.delay.DelayModel`; that is all ``dit optimise``
needs, so it works on any finished run or on a directory assembled by hand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import yaml

from dit.delay import DelayModel, DelayModelError
from dit.device.client import INFERENCE_COLUMNS as RAW_INFERENCE_COLUMNS
from dit.device.edge import EDGE_REQUEST_COLUMNS as RAW_EDGE_REQUEST_COLUMNS
from dit.device.profiler import LAYERS_COLUMNS as RAW_LAYERS_COLUMNS

EDGE_HOST: Final = "edge"
MIB: Final = 1024 * 1024
DEFAULT_RATE_BPS: Final = 100_000_000.0
"""Link rate used when there is no iperf3 measurement, no scenario cap and no usable fit (100 Mbit/s)."""

# The raw files' columns are the device writers' own (one definition each). The aggregate
# requires all of them except those added after the first raw files were written, so a run
# directory assembled by hand, or kept from an older version, still aggregates.
OPTIONAL_INFERENCE_COLUMNS: Final = ("ack_overlap_ns",)
LAYERS_RAW_COLUMNS: Final = RAW_LAYERS_COLUMNS
INFERENCE_COLUMNS: Final = tuple(c for c in RAW_INFERENCE_COLUMNS if c not in OPTIONAL_INFERENCE_COLUMNS)
EDGE_REQUEST_COLUMNS: Final = RAW_EDGE_REQUEST_COLUMNS
LAYERS_COLUMNS: Final = (
    "host",
    "stage",
    "latency_ns",
    "cum_latency_ns",
    "output_bytes",
    "peak_cpu_pct",
    "peak_mem_bytes",
    "ops",
)
FEASIBILITY_COLUMNS: Final = (
    "device",
    "max_partition_point",
    "binding_constraint",
    "memory_limit_bytes",
    "peak_mem_bytes_at_max",
    "cpu_budget_pct",
    "peak_cpu_pct_at_max",
)
LINKS_COLUMNS: Final = (
    "device",
    "target",
    "rtt_ns_mean",
    "rtt_ns_min",
    "rtt_ns_max",
    "rtt_ns_std",
    "rate_bps",
    "rate_source",
)
PHASE_COLUMNS: Final = (
    "local_ns",
    "transmission_ns",
    "barrier_ns",
    "queue_ns",
    "remote_ns",
    "return_ns",
    "total_ns",
)
OPTIONAL_SUMMARY_COLUMN: Final = "ack_overlap_ns"
SUMMARY_COLUMNS: Final = (
    "host",
    "round",
    "partition_point",
    "n",
    "request_bytes",
    *PHASE_COLUMNS,
    "max_abs_diff",
)


class AggregateError(Exception):
    """The run directory lacks what aggregation (or reading the aggregate back) needs."""


@dataclass(frozen=True)
class Feasibility:
    """One device's row of feasibility.csv."""

    device: str
    max_partition_point: int
    binding_constraint: str  # memory | cpu | none
    memory_limit_bytes: int | None
    peak_mem_bytes_at_max: int
    cpu_budget_pct: float | None
    peak_cpu_pct_at_max: float


@dataclass(frozen=True)
class AggregateSummary:
    """What :func:`aggregate_run` wrote and the decisions it took."""

    run_dir: Path
    files: tuple[Path, ...]
    devices: tuple[str, ...]
    num_stages: int
    edge_source: str  # profile | requests_scaled | requests_uniform
    rate_sources: Mapping[str, str]
    feasibility: Mapping[str, Feasibility]
    notes: tuple[str, ...]


# --------------------------------------------------------------------------- scenario


def read_scenario(run_dir: Path) -> dict[str, Any]:
    """``scenario.yaml`` of a run, loaded safely; must be a mapping with a ``devices`` list."""
    path = run_dir / "scenario.yaml"
    if not path.is_file():
        raise AggregateError(f"{path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise AggregateError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except (OSError, yaml.YAMLError) as exc:
        raise AggregateError(f"{path}: cannot be read as YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise AggregateError(f"{path}: the scenario is not a mapping")
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
        raise AggregateError(f"{path}: devices must be a non-empty list of device names")
    if len(set(devices)) != len(devices):
        raise AggregateError(f"{path}: devices has duplicates: {devices}")
    return data


def scenario_devices(scenario: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(d) for d in scenario["devices"])


def _block(scenario: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = scenario
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _optional_number(scenario: Mapping[str, Any], section: str, device: str, key: str) -> float | None:
    value = _block(scenario, section, device).get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise AggregateError(f"{section}.{device}.{key}: {value!r} is not a non-negative number")
    return float(value)


def round_vectors(scenario: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """The partition vector of every inference round: ``inference.partition_points`` expanded.

    A list of ints p means vectors (p, ..., p); a list of lists is explicit vectors in devices order.
    """
    devices = scenario_devices(scenario)
    points = _block(scenario, "inference").get("partition_points") or []
    vectors: list[tuple[int, ...]] = []
    for k, entry in enumerate(points):
        if isinstance(entry, int) and not isinstance(entry, bool):
            vectors.append((entry,) * len(devices))
        elif isinstance(entry, list) and len(entry) == len(devices):
            vectors.append(tuple(int(p) for p in entry))
        else:
            raise AggregateError(
                f"inference.partition_points[{k}]: {entry!r} is neither a partition point nor a vector "
                f"of {len(devices)} points"
            )
    return vectors


# --------------------------------------------------------------------------- raw files


def raw_file(run_dir: Path, host: str, name: str) -> Path:
    """``raw/<host>/<host>_<name>``."""
    return run_dir / "raw" / host / f"{host}_{name}"


def _read_csv(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError as exc:
        raise AggregateError(f"{path} is empty (no header)") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise AggregateError(f"{path} lacks the columns {missing}")
    return frame


def read_raw_layers(run_dir: Path, host: str) -> pd.DataFrame | None:
    path = raw_file(run_dir, host, "layers.csv")
    return _read_csv(path, LAYERS_RAW_COLUMNS) if path.is_file() else None


def read_raw_inference(run_dir: Path, host: str) -> pd.DataFrame | None:
    path = raw_file(run_dir, host, "inference.csv")
    return _read_csv(path, INFERENCE_COLUMNS) if path.is_file() else None


def read_edge_requests(run_dir: Path) -> pd.DataFrame | None:
    path = raw_file(run_dir, EDGE_HOST, "edge_requests.csv")
    return _read_csv(path, EDGE_REQUEST_COLUMNS) if path.is_file() else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AggregateError(f"{path} is not valid JSON: {exc}") from exc


# --------------------------------------------------------------------------- layers


def aggregate_layers(raw: pd.DataFrame, host: str, source: Path | str = "") -> pd.DataFrame:
    """Per-stage rows of one host: means over repetitions (peaks: maxima), cumulative latency.

    ``latency_ns``, ``output_bytes`` and ``ops`` are means rounded to integers; ``peak_cpu_pct`` and
    ``peak_mem_bytes`` are the maxima over repetitions (an averaged peak would no longer bound anything);
    ``cum_latency_ns`` is the running sum of ``latency_ns`` over stages 1..stage (0 at stage 0).
    """
    if raw.empty:
        raise AggregateError(f"{source or host}: no layer rows")
    grouped = raw.groupby("stage", sort=True)
    stages = sorted(int(s) for s in raw["stage"].unique())
    big_n = max(stages)
    expected = list(range(0 if 0 in stages else 1, big_n + 1))
    if stages != expected:
        raise AggregateError(f"{source or host}: stages {stages} are not contiguous up to {big_n}")
    means = grouped[["latency_ns", "output_bytes", "ops"]].mean().to_dict()
    peaks = grouped[["cpu_pct", "peak_mem_bytes"]].max().to_dict()
    rows: list[dict[str, Any]] = []
    cumulative = 0
    for stage in stages:
        latency = 0 if stage == 0 else round(float(means["latency_ns"][stage]))
        cumulative += latency
        rows.append(
            {
                "host": host,
                "stage": stage,
                "latency_ns": latency,
                "cum_latency_ns": cumulative,
                "output_bytes": round(float(means["output_bytes"][stage])),
                "peak_cpu_pct": round(float(peaks["cpu_pct"][stage]), 3),
                "peak_mem_bytes": round(float(peaks["peak_mem_bytes"][stage])),
                "ops": round(float(means["ops"][stage])),
            }
        )
    return pd.DataFrame(rows, columns=list(LAYERS_COLUMNS))


def edge_rows_from_requests(
    requests: pd.DataFrame | None, device_layers: Sequence[pd.DataFrame], num_stages: int
) -> tuple[pd.DataFrame, str]:
    """Edge per-stage latencies when the edge did not profile its capacity.

    The requests' ``remote_ns`` (the edge's compute time for the request's own stages p+1..N) are spread
    over stages in the shape of the devices' mean per-stage latencies m_k: ``s_k = c * m_k`` with
    ``c = sum(remote_ns) / sum over requests of sum_{k>p} m_k`` ("requests_scaled"). If the devices' shape
    is all zeros, every stage gets ``sum(remote_ns) / sum(N - p)`` ("requests_uniform").
    Rows other than latencies are copied from the devices' means; peaks are left empty (not measured).
    """
    usable = None if requests is None else requests[requests["partition_point"] < num_stages]
    if usable is None or usable.empty:
        raise AggregateError(
            "the edge server did not profile its capacity (no raw/edge/edge_layers.csv; set "
            "edge_server.profile_capacity: true) and raw/edge/edge_edge_requests.csv has no request with "
            "remote stages to estimate its per-stage latencies from"
        )
    stacked = pd.concat(device_layers, ignore_index=True)
    per_stage = stacked.groupby("stage")[["latency_ns", "output_bytes", "ops"]].mean().to_dict()
    shape = np.array([float(per_stage["latency_ns"].get(k, 0.0)) for k in range(num_stages + 1)])
    shape[0] = 0.0
    suffix = np.concatenate((np.cumsum(shape[::-1])[::-1], [0.0]))  # suffix[p] = sum_{k >= p} m_k
    points = usable["partition_point"].to_numpy(dtype=np.int64)
    total_remote = float(usable["remote_ns"].sum())
    denominator = float(suffix[points + 1].sum())
    if denominator > 0:
        latencies = shape * (total_remote / denominator)
        source = "requests_scaled"
    else:
        per_stage_ns = total_remote / float((num_stages - points).sum())
        latencies = np.full(num_stages + 1, per_stage_ns)
        source = "requests_uniform"
    rows: list[dict[str, Any]] = []
    cumulative = 0
    for stage in range(num_stages + 1):
        latency = 0 if stage == 0 else round(float(latencies[stage]))
        cumulative += latency
        known = stage in per_stage["latency_ns"]
        rows.append(
            {
                "host": EDGE_HOST,
                "stage": stage,
                "latency_ns": latency,
                "cum_latency_ns": cumulative,
                "output_bytes": round(float(per_stage["output_bytes"][stage])) if known else pd.NA,
                "peak_cpu_pct": pd.NA,
                "peak_mem_bytes": pd.NA,
                "ops": round(float(per_stage["ops"][stage])) if known else pd.NA,
            }
        )
    return pd.DataFrame(rows, columns=list(LAYERS_COLUMNS)), source


# --------------------------------------------------------------------------- feasibility


def feasibility(
    device: str, layers: pd.DataFrame, memory_limit_mb: float | None, cpu_budget_pct: float | None
) -> Feasibility:
    """The largest p whose cumulative peaks (max over stages 1..p) fit the device's limits.

    p = 0 (run nothing locally) is always feasible. ``binding_constraint`` is ``none`` when p = N is
    feasible, else the constraint stage max+1 violates (``memory`` when both do).
    """
    body = layers[layers["stage"] >= 1].sort_values("stage")
    mem = np.maximum.accumulate(body["peak_mem_bytes"].to_numpy(dtype=np.float64))
    cpu = np.maximum.accumulate(body["peak_cpu_pct"].to_numpy(dtype=np.float64))
    limit_bytes = None if memory_limit_mb is None else int(memory_limit_mb * MIB)
    mem_ok = np.ones(len(body), dtype=bool) if limit_bytes is None else mem <= limit_bytes
    cpu_ok = np.ones(len(body), dtype=bool) if cpu_budget_pct is None else cpu <= cpu_budget_pct
    fits = mem_ok & cpu_ok
    max_p = int(np.argmin(fits)) if not fits.all() else len(body)
    if max_p == len(body):
        binding = "none"
    elif not mem_ok[max_p]:
        binding = "memory"
    else:
        binding = "cpu"
    return Feasibility(
        device=device,
        max_partition_point=max_p,
        binding_constraint=binding,
        memory_limit_bytes=limit_bytes,
        peak_mem_bytes_at_max=0 if max_p == 0 else int(mem[max_p - 1]),
        cpu_budget_pct=cpu_budget_pct,
        peak_cpu_pct_at_max=0.0 if max_p == 0 else float(cpu[max_p - 1]),
    )


# --------------------------------------------------------------------------- links


def iperf3_rate_bps(doc: Any) -> float | None:
    """Throughput of an ``iperf3 -J`` result: end.sum_received, else end.sum (UDP), else end.sum_sent."""
    if not isinstance(doc, Mapping) or doc.get("error"):
        return None
    end = doc.get("end")
    if not isinstance(end, Mapping):
        return None
    for key in ("sum_received", "sum", "sum_sent"):
        section = end.get(key)
        value = section.get("bits_per_second") if isinstance(section, Mapping) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def fitted_rate_bps(inference: pd.DataFrame | None) -> float | None:
    """Least-squares slope of transmission_ns against request_bytes -> rate in bit/s.

    Uses the device's requests with request_bytes > 0; needs at least two distinct sizes and a positive
    slope (ns per byte); the rate is 8e9 / slope. The intercept (RTT and per-request overhead) is unused:
    the RTT comes from the pings.
    """
    if inference is None:
        return None
    rows = inference[inference["request_bytes"] > 0]
    x = rows["request_bytes"].to_numpy(dtype=np.float64)
    y = rows["transmission_ns"].to_numpy(dtype=np.float64)
    if len(np.unique(x)) < 2:
        return None
    dx = x - x.mean()
    slope = float((dx * (y - y.mean())).sum() / (dx * dx).sum())
    if not slope > 0:
        return None
    return 8 * 1e9 / slope


def link_rate(
    run_dir: Path, scenario: Mapping[str, Any], device: str, inference: pd.DataFrame | None
) -> tuple[float, str]:
    """``(rate_bps, source)``: iperf3, else scenario_cap, else fit, else default."""
    iperf = raw_file(run_dir, device, "iperf3.json")
    if iperf.is_file():
        rate = iperf3_rate_bps(_read_json(iperf))
        if rate is not None:
            return rate, "iperf3"
    cap = _optional_number(scenario, "network", device, "rate_mbit")
    if cap is not None and cap > 0:
        return cap * 1e6, "scenario_cap"
    fitted = fitted_rate_bps(inference)
    if fitted is not None:
        return fitted, "fit"
    return DEFAULT_RATE_BPS, "default"


def ping_rows(run_dir: Path, device: str) -> list[dict[str, Any]]:
    """RTT statistics per target from ``<device>_ping.json`` (one object or a list of them)."""
    path = raw_file(run_dir, device, "ping.json")
    if not path.is_file():
        return [{"device": device, "target": EDGE_HOST}]
    doc = _read_json(path)
    entries = doc if isinstance(doc, list) else [doc]
    rows: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("rtt_ns", []), list):
            raise AggregateError(f"{path}: expected an object with a target and an rtt_ns list")
        rtts = np.asarray(entry.get("rtt_ns", []), dtype=np.float64)
        row: dict[str, Any] = {"device": device, "target": str(entry.get("target", EDGE_HOST))}
        if rtts.size:
            row |= {
                "rtt_ns_mean": round(float(rtts.mean())),
                "rtt_ns_min": round(float(rtts.min())),
                "rtt_ns_max": round(float(rtts.max())),
                "rtt_ns_std": round(float(rtts.std())),
            }
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- phases


def phases_summary(phases: pd.DataFrame) -> pd.DataFrame:
    """Means (rounded to integer ns / bytes) per (host, round, partition_point), in order of appearance.

    ``ack_overlap_ns`` (not a phase: the part of the raw transmission taken off as double-counted) is
    averaged too when the raw files have it; ``max_abs_diff`` is the maximum.
    """
    extra = [OPTIONAL_SUMMARY_COLUMN] if OPTIONAL_SUMMARY_COLUMN in phases.columns else []
    columns = [*SUMMARY_COLUMNS[:-1], *extra, SUMMARY_COLUMNS[-1]]
    if phases.empty:
        return pd.DataFrame(columns=columns)
    grouped = phases.groupby(["host", "round", "partition_point"], sort=False)
    means = grouped[["request_bytes", *PHASE_COLUMNS, *extra]].mean().round().astype("int64")
    out = means.copy()
    out.insert(0, "n", grouped.size())
    out["max_abs_diff"] = grouped["max_abs_diff"].max()
    return out.reset_index()[columns]


# --------------------------------------------------------------------------- the stage


def aggregate_run(run_dir: Path) -> AggregateSummary:
    """Write the aggregate files of a run directory (see the module docstring) and summarise."""
    run_dir = Path(run_dir)
    scenario = read_scenario(run_dir)
    devices = scenario_devices(scenario)
    out = run_dir / "aggregate"
    notes: list[str] = []

    device_layers: dict[str, pd.DataFrame] = {}
    for device in devices:
        raw = read_raw_layers(run_dir, device)
        if raw is None:
            raise AggregateError(f"{raw_file(run_dir, device, 'layers.csv')} is missing")
        device_layers[device] = aggregate_layers(raw, device, raw_file(run_dir, device, "layers.csv"))
    stage_counts = {d: int(frame["stage"].max()) for d, frame in device_layers.items()}
    big_n = max(stage_counts.values())
    if len(set(stage_counts.values())) != 1:
        raise AggregateError(f"devices profiled different stage counts: {stage_counts}")

    edge_raw = read_raw_layers(run_dir, EDGE_HOST)
    if edge_raw is not None:
        edge_layers = aggregate_layers(edge_raw, EDGE_HOST, raw_file(run_dir, EDGE_HOST, "layers.csv"))
        if int(edge_layers["stage"].max()) != big_n:
            edge_n = int(edge_layers["stage"].max())
            raise AggregateError(f"the edge profiled {edge_n} stages, the devices {big_n}")
        edge_source = "profile"
    else:
        edge_layers, edge_source = edge_rows_from_requests(
            read_edge_requests(run_dir), list(device_layers.values()), big_n
        )
        notes.append(
            f"edge per-stage latencies estimated from the edge's request log ({edge_source}): "
            "raw/edge/edge_layers.csv is missing"
        )
    layers = pd.concat([*device_layers.values(), edge_layers], ignore_index=True)

    feas: dict[str, Feasibility] = {}
    for device in devices:
        feas[device] = feasibility(
            device,
            device_layers[device],
            _optional_number(scenario, "hardware", device, "memory_limit_mb"),
            _optional_number(scenario, "hardware", device, "cpu_budget_pct"),
        )

    inference: dict[str, pd.DataFrame] = {}
    for device in devices:
        frame = read_raw_inference(run_dir, device)
        if frame is not None:
            inference[device] = frame
    link_rows: list[dict[str, Any]] = []
    rate_sources: dict[str, str] = {}
    for device in devices:
        rate, source = link_rate(run_dir, scenario, device, inference.get(device))
        rate_sources[device] = source
        for row in ping_rows(run_dir, device):
            link_rows.append(row | {"rate_bps": round(rate, 3), "rate_source": source})
            if "rtt_ns_mean" not in row:
                notes.append(f"{device}: no RTT measured towards {row['target']}")

    phase_frames = [frame.assign(host=device) for device, frame in inference.items()]
    if phase_frames:
        phases = pd.concat(phase_frames, ignore_index=True)
        phases = phases[["host", *(c for c in phases.columns if c != "host")]]
    else:
        phases = pd.DataFrame(columns=["host", *INFERENCE_COLUMNS])
    if not phases.empty:
        parts = phases[["local_ns", "transmission_ns", "barrier_ns", "queue_ns", "remote_ns", "return_ns"]]
        mismatched = int((parts.sum(axis=1) != phases["total_ns"]).sum())
        if mismatched:
            notes.append(f"{mismatched} inference rows whose phases do not add up to total_ns")

    out.mkdir(parents=True, exist_ok=True)
    files = {
        "layers.csv": layers,
        "feasibility.csv": pd.DataFrame([vars(feas[d]) for d in devices], columns=list(FEASIBILITY_COLUMNS)),
        "links.csv": pd.DataFrame(link_rows, columns=list(LINKS_COLUMNS)),
        "phases.csv": phases,
        "phases_summary.csv": phases_summary(phases),
    }
    written: list[Path] = []
    for name, frame in files.items():
        path = out / name
        frame.to_csv(path, index=False)
        written.append(path)
    return AggregateSummary(
        run_dir=run_dir,
        files=tuple(written),
        devices=devices,
        num_stages=big_n,
        edge_source=edge_source,
        rate_sources=rate_sources,
        feasibility=feas,
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------- reading back


def _number(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise AggregateError(f"{what}: {value!r} is not a number") from exc
    if math.isnan(number):  # a NaN in the file or an empty cell: pandas reads both as NaN
        raise AggregateError(f"{what} is NaN (not a number, or an empty cell)")
    return number


def read_model_inputs(run_dir: Path, scenario: Mapping[str, Any] | None = None) -> DelayModel:
    """The delay model of a run from ``aggregate/{layers,links,feasibility}.csv`` and ``scenario.yaml``.

    Device order is the scenario's ``devices`` order. A device absent from feasibility.csv gets the full
    range 0..N. A device with several link rows uses the one whose target is ``edge``.
    """
    run_dir = Path(run_dir)
    scenario = read_scenario(run_dir) if scenario is None else scenario
    devices = scenario_devices(scenario)
    agg = run_dir / "aggregate"
    layers = _read_csv(agg / "layers.csv", LAYERS_COLUMNS) if (agg / "layers.csv").is_file() else None
    links = _read_csv(agg / "links.csv", LINKS_COLUMNS[:7]) if (agg / "links.csv").is_file() else None
    if layers is None or links is None:
        raise AggregateError(f"{agg} lacks layers.csv or links.csv; run the aggregate stage first")
    feas_path = agg / "feasibility.csv"
    feas = _read_csv(feas_path, FEASIBILITY_COLUMNS[:2]) if feas_path.is_file() else None

    def stages_of(host: str) -> pd.DataFrame:
        rows = layers[layers["host"].astype(str) == host].sort_values("stage")
        if rows.empty:
            hint = " (the edge's rows feed the remote term)" if host == EDGE_HOST else ""
            raise AggregateError(f"{agg / 'layers.csv'} has no rows for host {host}{hint}")
        return rows

    edge = stages_of(EDGE_HOST)
    edge_body = edge[edge["stage"] >= 1]
    big_n = int(edge_body["stage"].max())
    if edge_body["stage"].tolist() != list(range(1, big_n + 1)):
        raise AggregateError(f"{agg / 'layers.csv'}: edge stages are not 1..{big_n}")
    edge_stage_ns = tuple(_number(v, "layers.csv edge latency_ns") for v in edge_body["latency_ns"])

    cum: list[tuple[float, ...]] = []
    cut: list[tuple[float, ...]] = []
    for device in devices:
        rows = stages_of(device)
        if rows["stage"].tolist() != list(range(big_n + 1)):
            raise AggregateError(
                f"{agg / 'layers.csv'}: {device} needs stages 0..{big_n} (stage 0 gives the model input size)"
            )
        cum.append(
            (0.0, *(_number(v, f"layers.csv {device} cum_latency_ns") for v in rows["cum_latency_ns"][1:]))
        )
        cut.append(tuple(_number(v, f"layers.csv {device} output_bytes") for v in rows["output_bytes"]))

    rates: list[float] = []
    rtts: list[float] = []
    for device in devices:
        rows = links[links["device"].astype(str) == device]
        if len(rows) > 1:
            rows = rows[rows["target"].astype(str) == EDGE_HOST]
        if rows.empty:
            raise AggregateError(f"{agg / 'links.csv'} has no row for {device} towards {EDGE_HOST}")
        rates.append(_number(rows["rate_bps"].iloc[0], f"links.csv {device} rate_bps"))
        rtts.append(_number(rows["rtt_ns_mean"].iloc[0], f"links.csv {device} rtt_ns_mean (no RTT measured)"))

    bounds: list[int] = []
    for device in devices:
        feas_rows = None if feas is None else feas[feas["device"].astype(str) == device]
        if feas_rows is None or feas_rows.empty:
            bounds.append(big_n)
        else:
            bounds.append(int(_number(feas_rows["max_partition_point"].iloc[0], f"feasibility.csv {device}")))

    try:
        return DelayModel(
            devices=devices,
            edge_stage_ns=edge_stage_ns,
            cum_latency_ns=tuple(cum),
            cut_bytes=tuple(cut),
            rate_bps=tuple(rates),
            rtt_ns=tuple(rtts),
            max_partition_point=tuple(bounds),
        )
    except DelayModelError as exc:
        raise AggregateError(f"{agg}: {exc}") from exc
