"""``layers.csv``: per-stage rows of every device and of the edge server."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from dit.analysis.inputs import EDGE_HOST
from dit.analysis.run import AggregateError

LAYERS_COLUMNS: Final = (
    "host",
    "stage",
    "latency_ns",
    "cum_latency_ns",
    "output_bytes",
    "peak_cpu_pct",
    "peak_mem_bytes",
    "ops",
    "mean_cpu_pct",
)
#: What a hand-assembled ``aggregate/layers.csv`` must have (``mean_cpu_pct`` is informative only).
REQUIRED_LAYERS_COLUMNS: Final = LAYERS_COLUMNS[:-1]


def aggregate_layers(raw: pd.DataFrame, host: str, source: Path | str = "") -> pd.DataFrame:
    """Per-stage rows of one host: means over repetitions (peaks: maxima), cumulative latency.

    ``latency_ns``, ``output_bytes`` and ``ops`` are means rounded to integers; ``peak_cpu_pct`` and
    ``peak_mem_bytes`` are the maxima over repetitions (an averaged peak would no longer bound anything)
    of the sampled per-stage peak ``cpu_peak_pct`` (``cpu_pct``, the stage mean, in raw files of agents
    that did not sample) and of the peak RSS; ``mean_cpu_pct`` is the mean of ``cpu_pct``;
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
    means = grouped[["latency_ns", "output_bytes", "ops", "cpu_pct"]].mean().to_dict()
    peak_cpu = "cpu_peak_pct" if "cpu_peak_pct" in raw.columns else "cpu_pct"
    peaks = grouped[[peak_cpu, "peak_mem_bytes"]].max().to_dict()
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
                "peak_cpu_pct": round(float(peaks[peak_cpu][stage]), 3),
                "peak_mem_bytes": round(float(peaks["peak_mem_bytes"][stage])),
                "ops": round(float(means["ops"][stage])),
                "mean_cpu_pct": round(float(means["cpu_pct"][stage]), 3),
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
                "mean_cpu_pct": pd.NA,
            }
        )
    return pd.DataFrame(rows, columns=list(LAYERS_COLUMNS)), source
