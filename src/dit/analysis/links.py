"""``links.csv``: each device's RTT towards its targets and its link rate, with where the rate came from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from dit.analysis.inputs import EDGE_HOST, optional_number, read_json
from dit.analysis.run import AggregateError, raw_file

DEFAULT_RATE_BPS: Final = 100_000_000.0
"""Link rate used when there is no iperf3 measurement, no scenario cap and no usable fit (100 Mbit/s)."""
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
        rate = iperf3_rate_bps(read_json(iperf))
        if rate is not None:
            return rate, "iperf3"
    cap = optional_number(scenario, "network", device, "rate_mbit")
    if cap is not None and cap > 0:
        return cap * 1e6, "scenario_cap"
    fitted = fitted_rate_bps(inference)
    if fitted is not None:
        return fitted, "fit"
    return DEFAULT_RATE_BPS, "default"


def device_link_rate(run_dir: Path, device: str, target: str) -> float | None:
    """The iperf3 throughput of ``device``'s link to another device (``<device>_iperf3_<target>.json``,
    measured in collect when ``network.<device>.measure_throughput`` is set), or None."""
    path = raw_file(run_dir, device, f"iperf3_{target}.json")
    return iperf3_rate_bps(read_json(path)) if path.is_file() else None


def ping_rows(run_dir: Path, device: str) -> list[dict[str, Any]]:
    """RTT statistics per target from ``<device>_ping.json`` (one object or a list of them)."""
    path = raw_file(run_dir, device, "ping.json")
    if not path.is_file():
        return [{"device": device, "target": EDGE_HOST}]
    doc = read_json(path)
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


def device_link_rows(
    run_dir: Path, scenario: Mapping[str, Any], device: str, inference: pd.DataFrame | None
) -> tuple[list[dict[str, Any]], str]:
    """``device``'s rows of ``links.csv`` and the source of its own (edge) link rate.

    Every row has the RTTs of :func:`ping_rows`; the rate is the device's link rate
    (:func:`link_rate`), except on a link to another device that collect measured with iperf3
    (:func:`device_link_rate`), which keeps its own figure.
    """
    rate, source = link_rate(run_dir, scenario, device, inference)
    rows: list[dict[str, Any]] = []
    for row in ping_rows(run_dir, device):
        d2d = device_link_rate(run_dir, device, row["target"]) if row["target"] != EDGE_HOST else None
        if d2d is not None:
            rows.append(row | {"rate_bps": round(d2d, 3), "rate_source": "iperf3"})
        else:
            rows.append(row | {"rate_bps": round(rate, 3), "rate_source": source})
    return rows, source
