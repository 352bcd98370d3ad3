"""``points.csv``: cumulative values per partition point, the device part and the edge part."""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pandas as pd

from dit.analysis.run import AggregateError

POINTS_COLUMNS: Final = (
    "device",
    "point",
    "local_latency_ns",
    "local_ops",
    "local_peak_mem_bytes",
    "local_peak_cpu_pct",
    "cut_bytes",
    "remote_latency_ns",
    "remote_ops",
    "remote_peak_mem_bytes",
    "remote_peak_cpu_pct",
)


def _body(layers: pd.DataFrame, num_stages: int, what: str) -> pd.DataFrame:
    body = layers[layers["stage"] >= 1].sort_values("stage")
    if body["stage"].tolist() != list(range(1, num_stages + 1)):
        raise AggregateError(f"{what}: stages {body['stage'].tolist()} are not 1..{num_stages}")
    return body


def _column(body: pd.DataFrame, name: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    return pd.to_numeric(body[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _running_max(values: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Running maximum that stays NaN from the first unmeasured value on (a peak must bound all)."""
    out = np.maximum.accumulate(np.nan_to_num(values, nan=-np.inf))
    seen_nan = np.logical_or.accumulate(np.isnan(values))
    return np.where(seen_nan, np.nan, out)


def points_rows(device: str, device_layers: pd.DataFrame, edge_layers: pd.DataFrame) -> pd.DataFrame:
    """One row per partition point p = 0..N of ``device`` (its aggregated layers and the edge's).

    Local columns cover stages 1..p on the device: the sum of the mean latencies and of the ops, and the
    maxima of the per-stage peaks (the largest peak the device sees running that part). ``cut_bytes`` is
    the device's ``output_bytes`` of stage p (p = 0: the model input; p = N: 0, nothing is sent). Remote
    columns are the same over stages p+1..N on the edge server. At p = 0 the local part is empty (all 0),
    at p = N the remote part. A peak over a range with an unmeasured stage (edge rows estimated from
    requests) is empty.
    """
    n = int(device_layers["stage"].max())
    local = _body(device_layers, n, device)
    remote = _body(edge_layers, n, "edge")
    zero = np.zeros(1)
    local_lat = np.concatenate((zero, np.cumsum(_column(local, "latency_ns"))))
    local_ops = np.concatenate((zero, np.cumsum(_column(local, "ops"))))
    local_mem = np.concatenate((zero, _running_max(_column(local, "peak_mem_bytes"))))
    local_cpu = np.concatenate((zero, _running_max(_column(local, "peak_cpu_pct"))))
    # suffix over stages p+1..N: reverse, accumulate, reverse, then shift by one (p = N: nothing remote)
    remote_lat = np.concatenate((np.cumsum(_column(remote, "latency_ns")[::-1])[::-1], zero))
    remote_ops = np.concatenate((np.cumsum(_column(remote, "ops")[::-1])[::-1], zero))
    remote_mem = np.concatenate((_running_max(_column(remote, "peak_mem_bytes")[::-1])[::-1], zero))
    remote_cpu = np.concatenate((_running_max(_column(remote, "peak_cpu_pct")[::-1])[::-1], zero))
    out_bytes = device_layers.set_index("stage")["output_bytes"]
    if 0 not in out_bytes.index:
        raise AggregateError(f"{device}: no stage-0 row (the model input size)")

    def whole(value: float) -> Any:
        return pd.NA if np.isnan(value) else round(float(value))

    def pct(value: float) -> Any:
        return pd.NA if np.isnan(value) else round(float(value), 3)

    rows: list[dict[str, Any]] = []
    for p in range(n + 1):
        rows.append(
            {
                "device": device,
                "point": p,
                "local_latency_ns": whole(local_lat[p]),
                "local_ops": whole(local_ops[p]),
                "local_peak_mem_bytes": whole(local_mem[p]),
                "local_peak_cpu_pct": pct(local_cpu[p]),
                "cut_bytes": 0 if p == n else round(float(out_bytes[p])),
                "remote_latency_ns": whole(remote_lat[p]),
                "remote_ops": whole(remote_ops[p]),
                "remote_peak_mem_bytes": whole(remote_mem[p]),
                "remote_peak_cpu_pct": pct(remote_cpu[p]),
            }
        )
    return pd.DataFrame(rows, columns=list(POINTS_COLUMNS))
