"""What the run page shows, in the units the CLI and ``dit report`` use (:mod:`dit.units`).

The browser only lays the values out: every duration, size and objective arrives here already written
with its unit (``14.0 ms``, never ``14000000``), the raw number beside it for a tooltip. Stages come in
run order (:data:`dit.run.console.STAGES`), phases with a label and what each one measures, optimiser
results with the meaning of L, T, R and D and whether they are a prediction (a policy the run did not
measure, or a run without inference), and the settings the run itself optimised with.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from dit import units
from dit.report import labels
from dit.run.console import STAGES as STAGE_ORDER

PHASE_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "host": ("device", "the device that sent the requests"),
    "round": ("round", "index of the partition vector, from 0"),
    "partition_point": ("p", "partition point: stages 1..p ran on the device, the rest on the edge server"),
    "n": ("n", "requests averaged"),
    "request_bytes": ("request", "size of the request: the output of stage p sent to the edge server"),
    "local_ns": ("local", "the device ran stages 1..p"),
    "transmission_ns": ("transmission", "the request travelled to the edge server (until its ACK)"),
    "barrier_ns": (
        "barrier",
        "the edge server waited for every device's request of the round (batch admission)",
    ),
    "queue_ns": ("queue", "the request waited in the edge server's queue under its scheduling policy"),
    "remote_ns": ("remote", "the edge server ran stages p+1..N"),
    "return_ns": ("return", "the result travelled back to the device"),
    "total_ns": ("total", "the device's delay: the sum of the six phases"),
    "ack_overlap_ns": (
        "ACK overlap",
        "taken off the raw transmission: the ACK's trip the server already counted",
    ),
    "max_abs_diff": ("max |diff|", "largest difference between the partitioned and the whole model's output"),
}
"""(label, meaning) of every column of ``aggregate/phases_summary.csv``."""

TERMS: Final[dict[str, tuple[str, str]]] = {
    "L": ("local", "the device computes stages 1..p (its profiled cumulative latency at p)"),
    "T": (
        "transmission",
        "stage p's output reaches the edge server: bytes * 8 / rate + RTT / 2 (0 when p = N)",
    ),
    "R": (
        "remote",
        "the edge server computes stages p+1..N, waiting for the other requests under the policy",
    ),
    "D": ("delay", "the device's delay under the model: D = L + T + R"),
    "E": ("energy", "the device's energy per inference from its fitted power model"),
}
"""The delay model's per-device terms (:mod:`dit.analysis.delay`), as the optimiser table names them."""


def stamp(*paths: Path) -> str:
    """A version of the files a plot is drawn from (their mtimes and sizes): it changes when they do."""
    parts = []
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            parts.append("-")
            continue
        parts.append(f"{info.st_mtime_ns:x}.{info.st_size:x}")
    return "-".join(parts)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def cell(column: str, raw: str) -> dict[str, Any]:
    """One phases cell: the text to show (with its unit) and the raw number, if it is one."""
    value = _number(raw)
    if value is None:
        return {"text": raw or units.MISSING, "value": None}
    if column.endswith("_ns"):
        return {"text": units.duration(value), "value": value}
    if column.endswith("_bytes"):
        return {"text": units.size(value), "value": value}
    if column == "max_abs_diff":
        return {"text": f"{value:.3g}", "value": value}
    return {"text": raw, "value": value}


def phase_table(path: Path, limit: int = 500) -> dict[str, Any] | None:
    """``phases_summary.csv`` as columns (key, label, meaning) and rows of cells; None without the file."""
    if not path.is_file():
        return None
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, [])
        rows = [row for _, row in zip(range(limit), reader, strict=False)]
    columns = [
        {"key": c, "label": PHASE_COLUMNS.get(c, (c.removesuffix("_ns"), ""))[0],
         "description": PHASE_COLUMNS.get(c, ("", ""))[1],
         "unit": "ns" if c.endswith("_ns") else "B" if c.endswith("_bytes") else ""}
        for c in header
    ]  # fmt: skip
    cells = [[cell(c, v) for c, v in zip(header, row, strict=False)] for row in rows]
    _total_spread(path.parent.parent, header, columns, cells)
    return {"columns": columns, "rows": cells}


def _total_spread(
    run_dir: Path, header: list[str], columns: list[dict[str, Any]], rows: list[list[dict[str, Any]]]
) -> None:
    """The total's spread (:func:`dit.results.phase_total_spreads`) beside its mean: the total cell
    becomes ``mean ± 95 % CI``, a column after it holds ``p50 / p95 / p99``. Nothing changes when the
    run's phases.csv is missing or cannot be read."""
    from dit.analysis.run import AggregateError
    from dit.results import phase_total_spreads

    try:
        spreads = phase_total_spreads(run_dir)
    except AggregateError:
        return
    keys = ("host", "round", "partition_point", "total_ns")
    if not spreads or not all(k in header for k in keys):
        return
    host, round_, point, total = (header.index(k) for k in keys)
    columns[total]["stat"] = "mean ± 95 % CI"
    percentiles = "nearest-rank percentiles of the total over the requests"
    columns.insert(total + 1, {"key": "total_percentiles", "label": "p50 / p95 / p99", "unit": "ns",
                               "stat": "of total", "description": percentiles})  # fmt: skip
    for row in rows:
        found = None
        if len(row) > max(host, round_, point, total):
            r, p = row[round_]["value"], row[point]["value"]
            if r is not None and p is not None:
                found = spreads.get((str(row[host]["text"]), int(r), int(p)))
        if found is not None:
            row[total] = {"text": found.mean_text(), "value": found.mean}
        row.insert(total + 1, {"text": found.percentiles_text() if found else units.MISSING, "value": None})


def token_spread(run_dir: Path) -> list[dict[str, Any]]:
    """Each host's decode token latency (:func:`dit.results.token_spreads`): ``mean ± 95 % CI`` and
    ``p50 / p95 / p99``, written with units; empty without tokens or when they cannot be read."""
    from dit.analysis.run import AggregateError
    from dit.results import token_spreads

    try:
        spreads = token_spreads(run_dir)
    except AggregateError:
        return []
    return [
        {"host": host, "n": s.n, "mean_text": s.mean_text(), "percentiles_text": s.percentiles_text()}
        for host, s in spreads.items()
    ]


def stage_rows(stage_ns: Mapping[str, Any], skipped: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The stages in the order the driver runs them (unknown ones after), each with its wall time; a
    stage the driver skipped (``skipped``: stage -> reason, :func:`dit.report.labels.skipped_stages`)
    keeps its row with ``skipped`` set to the reason and the text ``skipped (reason)``."""
    skipped = {s: why for s, why in (skipped or {}).items() if s not in stage_ns}
    known = [*stage_ns, *skipped]
    order = [s for s in STAGE_ORDER if s in known] + [s for s in known if s not in STAGE_ORDER]
    rows: list[dict[str, Any]] = []
    for stage in order:
        if stage in skipped:
            why = skipped[stage]
            rows.append({"stage": stage, "ns": None, "text": f"skipped ({why})", "skipped": why})
            continue
        value = stage_ns[stage]
        ns = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        rows.append({"stage": stage, "ns": ns, "text": units.duration(ns)})
    return rows


def model_view(model: Any) -> dict[str, Any] | None:
    """``metadata.json``'s model as plain text parts: its name, what it stands in for, its parameters."""
    if not isinstance(model, Mapping):
        return None
    spec = model.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    name = spec.get("name") or model.get("name")
    params = spec.get("params")
    return {
        "name": None if name is None else str(name),
        "stand_in_for": model.get("stand_in_for"),
        "params": dict(params) if isinstance(params, Mapping) and params else None,
    }


def run_settings(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """What the run optimised with and what it measured, from its ``scenario.yaml``.

    ``algorithm``, ``objective``, ``policy``: the run's own optimisation settings (the optimise stage's,
    :func:`dit.optimise.api.resolve_settings`), the defaults of the Optimise dialog. ``measured_policy``:
    the edge server's scheduling policy during inference (None when no inference ran), the only policy
    whose predictions the run's measurements can confirm.
    """
    from dit.optimise import OptimiseError
    from dit.optimise.api import resolve_settings

    try:
        algorithm, objective, policy = resolve_settings(scenario, None, None, None)
    except OptimiseError:
        algorithm, objective, policy = "greedy", "total_delay", "RR"
    inference = scenario.get("inference")
    ran = bool(inference.get("enabled", True)) if isinstance(inference, Mapping) else True
    return {
        "algorithm": algorithm,
        "objective": objective,
        "policy": policy,
        "inference": ran,
        "measured_policy": labels.measured_policy(scenario),
    }


def objective_text(objective: str, value: Any, unit: str) -> str:
    """The optimum's objective in a readable unit (``99.7 ms``, ``1.23 ms²``, ``621 mJ``)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return units.MISSING if value is None else str(value)
    return units.with_unit(value, unit)


def optimise_view(
    result: Mapping[str, Any], settings: Mapping[str, Any], fake_power: list[str] | None = None
) -> dict[str, Any]:
    """One ``optimise/*.json`` with its values written out and whether it is a prediction.

    A result is a *prediction* when the run measured no inference or measured it under another
    scheduling policy than the one the search assumed: nothing in the run confirms its delays.
    ``fake_power``: the nodes whose power came from a fake sensor; a result that shows energy (an
    energy objective or an E column) then carries ``energy_note`` saying the energy is modelled.
    """
    out = dict(result)
    unit = str(result.get("objective_unit", ""))
    out["objective_text"] = objective_text(
        str(result.get("objective", "")), result.get("objective_value"), unit
    )
    out["search_text"] = units.duration(result.get("search_wall_ns"))
    rows = []
    for entry in result.get("per_device") or []:
        if not isinstance(entry, Mapping):
            continue
        row = dict(entry)
        for term in ("L", "T", "R", "D"):
            row[f"{term}_text"] = units.duration(entry.get(f"{term}_ns"))
        if "E_j" in entry:
            row["E_text"] = units.energy(entry.get("E_j"))
        rows.append(row)
    out["per_device"] = rows
    measured = settings.get("measured_policy")
    reason = labels.prediction_reason(
        str(result.get("policy", "")), None if measured is None else str(measured)
    )
    out["measured"] = reason is None
    if reason is not None:
        out["prediction_reason"] = reason
    shows_energy = str(result.get("objective")) in labels.ENERGY_OBJECTIVES or any(
        "E_text" in r for r in rows
    )
    if shows_energy and fake_power:
        out["energy_note"] = labels.fake_sensor_note(fake_power)
        out["energy_badge"] = labels.MODELLED
    return out
