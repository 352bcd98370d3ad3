"""Each device's power model, fitted from its power trace and its inference phases.

A device draws ``P_idle`` while it waits, ``P_comp`` while it computes its local stages and ``P_tx``
while it sends the cut (W). Over one inference request of the run (``raw/<dev>/<dev>_inference.csv``)
the device computes for ``local_ns``, transmits for ``transmission_ns`` and waits for the rest of
``total_ns``; the energy the trace gives for the request (the trapezoid integral used by
``energy.csv``, :func:`dit.analysis.monitors.energy_between`) is then

    E_r = P_comp * L_r + P_tx * T_r + P_idle * (total_r - L_r - T_r)          (seconds, J)

and every gap of at least :data:`MIN_IDLE_NS` between two requests is one more equation with only
the idle term. The three powers are the least-squares solution of these equations (``numpy.linalg.lstsq``).
When the equations cannot tell transmitting from waiting (rank below 3, e.g. loopback transmissions of
a few microseconds) or the three-term fit gives a negative power, the model is refitted with
``P_tx = P_idle`` and says so in ``method``.

``power_model.csv`` — one row per device with a power trace and at least two requests:
``device,idle_w,compute_w,transmit_w,method,requests,idle_windows,rmse_j``.
The delay model reads it (:func:`read_power_models`) for the ``energy`` and ``edp`` objectives
(docs/optimisers.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pandas as pd

from dit.analysis.delay import DevicePower
from dit.analysis.run import AggregateError, LoadedRun, raw_file

POWER_MODEL_FILE: Final = "power_model.csv"
POWER_MODEL_COLUMNS: Final = (
    "device",
    "idle_w",
    "compute_w",
    "transmit_w",
    "method",
    "requests",
    "idle_windows",
    "rmse_j",
)
MIN_IDLE_NS: Final = 1_000_000
"""Gaps between requests shorter than this are not used as idle equations."""


@dataclass(frozen=True)
class PowerFit:
    device: str
    power: DevicePower
    method: str  # "3-term" or "transmit=idle"
    requests: int
    idle_windows: int
    rmse_j: float

    def row(self) -> dict[str, object]:
        return {
            "device": self.device,
            "idle_w": self.power.idle_w,
            "compute_w": self.power.compute_w,
            "transmit_w": self.power.transmit_w,
            "method": self.method,
            "requests": self.requests,
            "idle_windows": self.idle_windows,
            "rmse_j": self.rmse_j,
        }


def fit_power(
    seconds: npt.NDArray[np.float64], energy_j: npt.NDArray[np.float64], requests: int, device: str = ""
) -> PowerFit | None:
    """Least squares over rows ``[t_comp, t_tx, t_idle]`` (s) -> energy (J); None without enough rows.

    The first ``requests`` rows are requests, the rest idle windows (counted in the result).
    """
    keep = np.isfinite(energy_j) & np.isfinite(seconds).all(axis=1)
    a, b = seconds[keep], energy_j[keep]
    kept_requests = int(keep[:requests].sum())
    if kept_requests < 2 or len(b) < 3:
        return None
    coef, _res, rank, _sv = np.linalg.lstsq(a, b, rcond=None)
    method = "3-term"
    if rank < 3 or (coef < 0).any():
        merged = np.column_stack([a[:, 0], a[:, 1] + a[:, 2]])  # transmitting costs what waiting costs
        two, _res, _rank, _sv = np.linalg.lstsq(merged, b, rcond=None)
        coef = np.array([two[0], two[1], two[1]])
        method = "transmit=idle"
    coef = np.clip(coef, 0.0, None)
    rmse = float(math.sqrt(float(np.mean((a @ coef - b) ** 2))))
    return PowerFit(
        device=device,
        power=DevicePower(idle_w=float(coef[2]), compute_w=float(coef[0]), transmit_w=float(coef[1])),
        method=method,
        requests=kept_requests,
        idle_windows=len(b) - kept_requests,
        rmse_j=rmse,
    )


def fit_device(run_dir: Path, device: str) -> PowerFit | None:
    """The power model of one device of a run, or None when it has no power trace or too few requests."""
    from dit.analysis.monitors import _csv, _json, _pair, _power_trace, energy_between

    power = _csv(raw_file(run_dir, device, "power.csv"), ("t_mono_ns", "power_w"))
    inference = _csv(
        raw_file(run_dir, device, "inference.csv"), ("start_ns", "total_ns", "local_ns", "transmission_ns")
    )
    origin = _pair(_json(raw_file(run_dir, device, "origin.json")))
    if power is None or inference is None or origin is None or len(inference) < 2:
        return None
    t_mono, watts = _power_trace(power)
    t_rel = t_mono - np.int64(origin[1])
    frame = inference.sort_values("start_ns", kind="stable")
    start = frame["start_ns"].to_numpy(dtype=np.int64)
    total = frame["total_ns"].to_numpy(dtype=np.int64)
    local = frame["local_ns"].to_numpy(dtype=np.int64)
    tx = frame["transmission_ns"].to_numpy(dtype=np.int64)
    ends = start + total
    gap_start, gap_end = ends[:-1], start[1:]
    gaps = (gap_end - gap_start) >= MIN_IDLE_NS
    a_ns = np.concatenate([start, gap_start[gaps]])
    b_ns = np.concatenate([ends, gap_end[gaps]])
    energy = energy_between(t_rel, watts, a_ns, b_ns)
    n_gaps = int(gaps.sum())
    comp = np.concatenate([local, np.zeros(n_gaps, dtype=np.int64)])
    trans = np.concatenate([tx, np.zeros(n_gaps, dtype=np.int64)])
    idle = (b_ns - a_ns) - comp - trans
    seconds = np.column_stack([comp, trans, np.clip(idle, 0, None)]).astype(np.float64) / 1e9
    return fit_power(seconds, np.asarray(energy, dtype=np.float64), len(start), device)


def write_power_models(run: LoadedRun | Path) -> Path:
    """Fit every device of the run and write ``aggregate/power_model.csv`` (header only when none fits)."""
    loaded = LoadedRun.of(run)
    fits = [fit for device in loaded.devices if (fit := fit_device(loaded.path, device)) is not None]
    path = loaded.aggregate_dir / POWER_MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([f.row() for f in fits], columns=list(POWER_MODEL_COLUMNS)).to_csv(path, index=False)
    return path


def read_power_models(aggregate_dir: Path, devices: Sequence[str]) -> tuple[DevicePower, ...] | None:
    """The power models of ``devices`` in that order, or None unless every device has one."""
    path = aggregate_dir / POWER_MODEL_FILE
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise AggregateError(f"{path}: unreadable ({exc})") from exc
    missing = [c for c in ("device", "idle_w", "compute_w", "transmit_w") if c not in frame.columns]
    if missing:
        raise AggregateError(f"{path}: missing column(s) {', '.join(missing)}")
    rows = {str(r["device"]): r for _, r in frame.iterrows()}
    if any(d not in rows for d in devices):
        return None
    try:
        return tuple(
            DevicePower(
                idle_w=float(rows[d]["idle_w"]),
                compute_w=float(rows[d]["compute_w"]),
                transmit_w=float(rows[d]["transmit_w"]),
            )
            for d in devices
        )
    except ValueError as exc:
        raise AggregateError(f"{path}: {exc}") from exc
