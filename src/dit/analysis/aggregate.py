"""The aggregate stage: raw per-host results -> the interchange files the delay model consumes.

Reads ``scenario.yaml`` and ``raw/<host>/<host>_*`` of a run directory and writes under ``aggregate/``,
one module per file and concern:

- ``layers.csv``       one row per (host, stage) for every device and the edge server (:mod:`.layers`);
- ``points.csv``       one row per (device, partition point): cumulative latency, ops and peaks of the
  device part 1..p and the edge part p+1..N, and the bytes the cut sends (:mod:`.points`);
- ``feasibility.csv``  one row per device: the largest feasible partition point and what binds
  (:mod:`.feasibility`);
- ``links.csv``        one row per (device, target): RTT statistics and the link rate, with its source
  (:mod:`.links`);
- ``phases.csv``       every device's inference rows with a ``host`` column (:mod:`.phases`);
- ``phases_summary.csv`` means per (host, round, partition point).

What they read is in :mod:`.inputs`. docs/interchange.md describes every column, its unit and the
fallbacks. :func:`read_model_inputs` reads the first three back (plus ``scenario.yaml``) into a
:class:`dit.analysis.delay.DelayModel`; that is all ``dit optimise`` needs, so it works on any finished
run or on a directory assembled by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dit.analysis.delay import DelayModel, DelayModelError
from dit.analysis.feasibility import FEASIBILITY_COLUMNS, Feasibility, feasibility
from dit.analysis.inputs import (
    EDGE_HOST,
    INFERENCE_COLUMNS,
    optional_number,
    read_csv,
    read_edge_requests,
    read_raw_inference,
    read_raw_layers,
)
from dit.analysis.layers import REQUIRED_LAYERS_COLUMNS, aggregate_layers, edge_rows_from_requests
from dit.analysis.links import LINKS_COLUMNS, device_link_rows
from dit.analysis.phases import phases_summary
from dit.analysis.points import POINTS_COLUMNS, points_rows
from dit.analysis.power_model import read_power_models
from dit.analysis.run import AggregateError, LoadedRun, raw_file
from dit.run.rundir import write_text


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


# --------------------------------------------------------------------------- the stage


def aggregate_run(run: LoadedRun | Path) -> AggregateSummary:
    """Write the aggregate files of a run directory (see the module docstring) and summarise."""
    loaded = LoadedRun.of(run)
    run_dir = loaded.path
    scenario = loaded.scenario
    devices = loaded.devices
    out = loaded.aggregate_dir
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
            optional_number(scenario, "hardware", device, "memory_limit_mb"),
            optional_number(scenario, "hardware", device, "cpu_budget_pct"),
        )

    inference: dict[str, pd.DataFrame] = {}
    for device in devices:
        frame = read_raw_inference(run_dir, device)
        if frame is not None:
            inference[device] = frame
    link_rows: list[dict[str, Any]] = []
    rate_sources: dict[str, str] = {}
    for device in devices:
        rows, rate_sources[device] = device_link_rows(run_dir, scenario, device, inference.get(device))
        for row in rows:
            link_rows.append(row)
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
        "points.csv": pd.concat(
            [points_rows(d, device_layers[d], edge_layers) for d in devices], ignore_index=True
        ).reindex(columns=list(POINTS_COLUMNS)),
        "feasibility.csv": pd.DataFrame([vars(feas[d]) for d in devices], columns=list(FEASIBILITY_COLUMNS)),
        "links.csv": pd.DataFrame(link_rows, columns=list(LINKS_COLUMNS)),
        "phases.csv": phases,
        "phases_summary.csv": phases_summary(phases),
    }
    written: list[Path] = []
    for name, frame in files.items():
        path = out / name
        write_text(path, frame.to_csv(index=False))
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


def read_model_inputs(run: LoadedRun | Path) -> DelayModel:
    """The delay model of a run from ``aggregate/{layers,links,feasibility}.csv`` and ``scenario.yaml``.

    Device order is the scenario's ``devices`` order. A device absent from feasibility.csv gets the full
    range 0..N. A device with several link rows uses the one whose target is ``edge``.
    """
    loaded = LoadedRun.of(run)
    devices = loaded.devices
    agg = loaded.aggregate_dir
    layers = read_csv(agg / "layers.csv", REQUIRED_LAYERS_COLUMNS) if (agg / "layers.csv").is_file() else None
    links = read_csv(agg / "links.csv", LINKS_COLUMNS[:7]) if (agg / "links.csv").is_file() else None
    if layers is None or links is None:
        raise AggregateError(f"{agg} lacks layers.csv or links.csv; run the aggregate stage first")
    feas_path = agg / "feasibility.csv"
    feas = read_csv(feas_path, FEASIBILITY_COLUMNS[:2]) if feas_path.is_file() else None

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
            power=read_power_models(agg, devices),
        )
    except DelayModelError as exc:
        raise AggregateError(f"{agg}: {exc}") from exc
