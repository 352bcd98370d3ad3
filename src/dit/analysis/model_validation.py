"""Model validation: the delay model's predicted per-device delay vs the measured one, per measured vector.

For every inference round of a run (one partition vector, ``inference.partition_points``) and every
device, the measured delay is the mean over repetitions of ``local_ns + transmission_ns + queue_ns +
remote_ns``; the prediction is :func:`dit.analysis.delay.evaluate` of that vector under the run's policy on the
run's aggregate (:func:`dit.analysis.aggregate.read_model_inputs`). ``barrier_ns`` (the edge holding a request until
the round's other requests arrive, which realises the model's "all requests present at time 0") and
``return_ns`` (the result's trip back, which the model has no term for) are excluded, so both sides cover
the same interval: first local stage to the completion of the last remote stage, with the barrier wait
cut out. docs/optimisers.md discusses the boundaries.

Writes ``validation.csv`` and ``validation.png`` (predicted vs measured per device and policy) and returns
the mean absolute percentage error (MAPE, relative to the measured delay).

Diagnostic: when the edge logged its executed stages (``raw/edge/edge_edge_stages.csv``), the remote term
is also predicted with the stage times the edge actually had during the run instead of its capacity
profile (``predicted_remote_inrun_ns``, ``remote_mape_inrun_pct``). A small in-run error next to a large
profile-based one says the queueing model is right and its inputs drifted (contention, frequency) between
profiling and inference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, cast

import pandas as pd
from matplotlib.figure import Figure
from rich.table import Table

from dit.analysis.aggregate import aggregate_run, read_model_inputs
from dit.analysis.delay import J_PER_W_NS, DelayModel, check_policy, energy_j, evaluate
from dit.analysis.inputs import EDGE_HOST
from dit.analysis.run import AggregateError, LoadedRun, raw_file
from dit.report import labels

VALIDATION_COLUMNS: Final = (
    "run",
    "policy",
    "round",
    "vector",
    "device",
    "partition_point",
    "n",
    "measured_local_ns",
    "measured_transmission_ns",
    "measured_remote_ns",
    "measured_delay_ns",
    "predicted_local_ns",
    "predicted_transmission_ns",
    "predicted_remote_ns",
    "predicted_delay_ns",
    "ape_pct",
    "predicted_remote_inrun_ns",
    "measured_energy_j",
    "predicted_energy_j",
    "energy_ape_pct",
)
COMPONENTS: Final = ("local", "transmission", "remote")
MARKERS: Final = {"RR": "o", "SJF": "s"}
SIZES: Final = {"RR": 70, "SJF": 28}


@dataclass(frozen=True)
class ValidationSummary:
    """The outcome of one validation; MAPEs are percentages relative to the measured delay."""

    run_dirs: tuple[Path, ...]
    csv_path: Path
    png_path: Path
    points: int
    mape_pct: float
    mape_by_device: Mapping[str, float]
    mape_by_policy: Mapping[str, float]
    component_mape_pct: Mapping[str, float]
    remote_mape_inrun_pct: float | None
    notes: tuple[str, ...]
    energy_mape_pct: float | None = (
        None  # predicted vs measured energy per inference, when a power model exists
    )
    energy_modelled: tuple[str, ...] = ()  # nodes whose "measured" energy came from a fake sensor

    def render_table(self) -> Table:
        table = Table(title=f"Model validation — MAPE {self.mape_pct:.2f} % over {self.points} points")
        table.add_column("group")
        table.add_column("MAPE (%)", justify="right")
        for policy, value in self.mape_by_policy.items():
            table.add_row(f"policy {policy}", f"{value:.2f}")
        for device, value in self.mape_by_device.items():
            table.add_row(device, f"{value:.2f}")
        for component, value in self.component_mape_pct.items():
            table.add_row(f"term {component}", f"{value:.2f}")
        if self.remote_mape_inrun_pct is not None:
            table.add_row("term remote, in-run edge stage times", f"{self.remote_mape_inrun_pct:.2f}")
        if self.energy_mape_pct is not None:
            against = f" (against {labels.MODELLED} energy)" if self.energy_modelled else ""
            table.add_row(f"energy per inference{against}", f"{self.energy_mape_pct:.2f}")
        return table


def _vector_text(vector: Sequence[int]) -> str:
    return ",".join(str(p) for p in vector)


def _measured_rounds(phases: pd.DataFrame) -> dict[int, dict[str, dict[str, float]]]:
    """``{round: {device: {partition_point, n, local, transmission, remote}}}`` (means over repetitions)."""
    out: dict[int, dict[str, dict[str, float]]] = defaultdict(dict)
    if phases.empty:
        return out
    frame = phases.assign(
        remote_total=phases["queue_ns"] + phases["remote_ns"],
        outside=phases["barrier_ns"] + phases["return_ns"],
    )
    for key, rows in frame.groupby(["round", "host"], sort=True):
        rnd, host = int(cast(int, key[0])), str(key[1])
        points = {int(p) for p in rows["partition_point"]}
        if len(points) != 1:
            raise AggregateError(f"round {rnd} of {host} mixes partition points {sorted(points)}")
        out[rnd][host] = {
            "partition_point": float(points.pop()),
            "n": float(len(rows)),
            "local": float(rows["local_ns"].mean()),
            "transmission": float(rows["transmission_ns"].mean()),
            "remote": float(rows["remote_total"].mean()),
            "outside": float(rows["outside"].mean()),
        }
    return out


def in_run_stage_ns(run_dir: Path, num_stages: int) -> tuple[float, ...] | None:
    """Mean duration of every edge stage as executed during the run's inference (``edge_stages.csv``).

    None when the file is missing or does not cover stages 1..N.
    """
    path = raw_file(run_dir, EDGE_HOST, "edge_stages.csv")
    if not path.is_file():
        return None
    frame = pd.read_csv(path)
    if not {"stage", "start_ns", "end_ns"} <= set(frame.columns) or frame.empty:
        return None
    means = (frame["end_ns"] - frame["start_ns"]).groupby(frame["stage"]).mean().to_dict()
    if sorted(int(cast(int, k)) for k in means) != list(range(1, num_stages + 1)):
        return None
    return tuple(float(means[k]) for k in range(1, num_stages + 1))


def measured_energy(agg: Path) -> dict[tuple[int, str], float]:
    """Mean ``energy_j`` per (round, device) from ``energy.csv`` (empty without one)."""
    path = agg / "energy.csv"
    if not path.is_file():
        return {}
    frame = pd.read_csv(path)
    if frame.empty or not {"round", "device", "energy_j"} <= set(frame.columns):
        return {}
    frame = frame.dropna(subset=["round", "energy_j"])
    out: dict[tuple[int, str], float] = {}
    for key, rows in frame.groupby(["round", "device"], sort=True):
        out[int(cast(int, key[0])), str(key[1])] = float(rows["energy_j"].mean())
    return out


def compare_run(run: LoadedRun | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Validation rows of one run (aggregating first when needed) and notes on what was skipped."""
    loaded = LoadedRun.of(run)
    run_dir = loaded.path
    scenario = loaded.scenario
    agg = loaded.aggregate_dir
    if not all((agg / name).is_file() for name in ("layers.csv", "links.csv", "phases.csv")):
        aggregate_run(loaded)
    model: DelayModel = read_model_inputs(loaded)
    edge = scenario.get("edge_server")
    policy = check_policy(str((edge if isinstance(edge, Mapping) else {}).get("policy", "RR")).upper())
    phases = pd.read_csv(agg / "phases.csv")
    planned = loaded.round_vectors()
    in_run = in_run_stage_ns(run_dir, model.num_stages)
    in_run_model = None if in_run is None else replace(model, edge_stage_ns=in_run)
    energy_measured = measured_energy(agg) if model.power is not None else {}
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for rnd, measured in sorted(_measured_rounds(phases).items()):
        vector: list[int | None] = list(planned[rnd]) if rnd < len(planned) else [None] * model.num_devices
        for i, device in enumerate(model.devices):
            if device in measured:
                vector[i] = int(measured[device]["partition_point"])
        if any(p is None for p in vector):
            notes.append(f"{run_dir.name} round {rnd}: vector unknown (not in the scenario, devices missing)")
            continue
        full = [int(p) for p in vector if p is not None]
        predicted = evaluate(model, full, policy)
        diagnostic = None if in_run_model is None else evaluate(in_run_model, full, policy)
        energies = energy_j(model, predicted) if model.power is not None else None
        for i, device in enumerate(model.devices):
            if device not in measured:
                continue
            m = measured[device]
            measured_delay = m["local"] + m["transmission"] + m["remote"]
            error = abs(predicted.delay_ns[i] - measured_delay)
            ape = error / measured_delay * 100 if measured_delay else None
            e_measured = energy_measured.get((rnd, device))
            e_predicted: float | None = None
            e_ape: float | None = None
            if energies is not None and e_measured is not None and model.power is not None:
                # the request's barrier wait and return trip, outside the delay model, at idle power
                e_predicted = energies[i] + model.power[i].idle_w * m["outside"] * J_PER_W_NS
                e_ape = abs(e_predicted - e_measured) / e_measured * 100 if e_measured else None
            rows.append(
                {
                    "run": run_dir.name,
                    "policy": policy,
                    "round": rnd,
                    "vector": _vector_text(full),
                    "device": device,
                    "partition_point": full[i],
                    "n": int(m["n"]),
                    "measured_local_ns": round(m["local"]),
                    "measured_transmission_ns": round(m["transmission"]),
                    "measured_remote_ns": round(m["remote"]),
                    "measured_delay_ns": round(measured_delay),
                    "predicted_local_ns": round(predicted.local_ns[i]),
                    "predicted_transmission_ns": round(predicted.transmission_ns[i]),
                    "predicted_remote_ns": round(predicted.remote_ns[i]),
                    "predicted_delay_ns": round(predicted.delay_ns[i]),
                    "ape_pct": ape,
                    "predicted_remote_inrun_ns": None
                    if diagnostic is None
                    else round(diagnostic.remote_ns[i]),
                    "measured_energy_j": e_measured if e_predicted is not None else None,
                    "predicted_energy_j": e_predicted,
                    "energy_ape_pct": e_ape,
                }
            )
    return rows, notes


def _mape(pairs: Iterable[tuple[float, float]]) -> float:
    """Mean of |predicted - measured| / measured in %, over pairs with a non-zero measurement."""
    errors = [abs(p - m) / m * 100 for p, m in pairs if m]
    return sum(errors) / len(errors) if errors else float("nan")


def plot(
    frame: pd.DataFrame, path: Path, title: str, energy_title: str | None = None, fake: Sequence[str] = ()
) -> None:
    """:func:`validation_figure` written to ``path`` (PNG)."""
    validation_figure(frame, title, energy_title, fake).savefig(path, dpi=120)


def validation_figure(
    frame: pd.DataFrame, title: str, energy_title: str | None = None, fake: Sequence[str] = ()
) -> Figure:
    """Predicted vs measured delay (ms), a colour per device and a marker per policy, with y = x.

    With ``energy_title``, a second panel: predicted vs measured energy per inference (mJ); ``fake``:
    the nodes whose "measured" energy came from a fake sensor, which the axis and the legend say.
    """
    if energy_title is None:
        figure = Figure(figsize=(6.4, 5.6))
        ax = figure.subplots()
    else:
        figure = Figure(figsize=(12.4, 5.6))
        ax, energy_ax = figure.subplots(1, 2)
        _energy_panel(
            energy_ax,
            frame.dropna(subset=["predicted_energy_j", "measured_energy_j"]),
            energy_title,
            fake,
        )
    colours = {d: f"C{k % 10}" for k, d in enumerate(dict.fromkeys(frame["device"]))}
    for (device, policy), rows in frame.groupby(["device", "policy"], sort=False):
        ax.scatter(
            rows["measured_delay_ns"] / 1e6,
            rows["predicted_delay_ns"] / 1e6,
            c=colours[str(device)],
            marker=MARKERS.get(str(policy), "^"),
            s=SIZES.get(str(policy), 40),
            label=f"{device} · {policy}",
            alpha=0.85,
        )
    top = float(max(frame["measured_delay_ns"].max(), frame["predicted_delay_ns"].max())) / 1e6 * 1.05
    ax.plot([0, top], [0, top], color="0.5", linestyle="--", linewidth=1, label="predicted = measured")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured delay L+T+queue+remote (ms)")
    ax.set_ylabel("predicted delay D = L+T+R (ms)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    figure.tight_layout()
    return figure


def _energy_panel(ax: Any, frame: pd.DataFrame, title: str, fake: Sequence[str]) -> None:
    colours = {d: f"C{k % 10}" for k, d in enumerate(dict.fromkeys(frame["device"]))}
    for (device, policy), rows in frame.groupby(["device", "policy"], sort=False):
        ax.scatter(
            rows["measured_energy_j"] * 1e3,
            rows["predicted_energy_j"] * 1e3,
            c=colours[str(device)],
            marker=MARKERS.get(str(policy), "^"),
            s=SIZES.get(str(policy), 40),
            label=f"{labels.node_label(device, fake)} · {policy}",
            alpha=0.85,
        )
    top = float(max(frame["measured_energy_j"].max(), frame["predicted_energy_j"].max())) * 1e3 * 1.05
    diagonal = "predicted = sensor" if fake else "predicted = measured"
    ax.plot([0, top], [0, top], color="0.5", linestyle="--", linewidth=1, label=diagonal)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    # a fake sensor's energy is itself a model of the node's activity: never called measured
    nodes = ", ".join(fake) if len(fake) <= 3 else f"{len(fake)} nodes"  # the legend names each
    ax.set_xlabel(
        f"energy per inference, {labels.MODELLED} on {nodes} (mJ)"
        if fake
        else "measured energy per inference (mJ)"
    )
    ax.set_ylabel("predicted energy P_comp L + P_tx T + P_idle (R + wait) (mJ)")
    ax.set_title(title)
    ax.legend(fontsize="small")


def validate_runs(runs: Sequence[LoadedRun | Path], out_dir: Path) -> ValidationSummary:
    """Validate several runs together (e.g. the RR and SJF runs of a sweep) into ``out_dir``."""
    if not runs:
        raise AggregateError("no run directories to validate")
    loaded = [LoadedRun.of(run) for run in runs]
    run_dirs = [run.path for run in loaded]
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for run in loaded:
        run_rows, run_notes = compare_run(run)
        rows += run_rows
        notes += run_notes
    if not rows:
        raise AggregateError(
            f"no measured inference rounds to validate in {', '.join(str(d) for d in run_dirs)}"
        )
    frame = pd.DataFrame(rows, columns=list(VALIDATION_COLUMNS))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out_dir / "validation.csv", out_dir / "validation.png"
    frame.to_csv(csv_path, index=False)

    def pairs(sub: pd.DataFrame, what: str = "delay") -> list[tuple[float, float]]:
        return list(
            zip(
                sub[f"predicted_{what}_ns"].astype(float),
                sub[f"measured_{what}_ns"].astype(float),
                strict=True,
            )
        )

    mape = _mape(pairs(frame))
    by_device = {str(d): _mape(pairs(sub)) for d, sub in frame.groupby("device", sort=False)}
    by_policy = {str(p): _mape(pairs(sub)) for p, sub in frame.groupby("policy", sort=False)}
    components = {c: _mape(pairs(frame, c)) for c in COMPONENTS}
    diagnostic = frame.dropna(subset=["predicted_remote_inrun_ns"])
    inrun = (
        _mape(zip(diagnostic["predicted_remote_inrun_ns"], diagnostic["measured_remote_ns"], strict=True))
        if len(diagnostic) == len(frame)
        else None
    )
    energy_rows = frame.dropna(subset=["predicted_energy_j", "measured_energy_j"])
    energy_mape = (
        _mape(zip(energy_rows["predicted_energy_j"], energy_rows["measured_energy_j"], strict=True))
        if not energy_rows.empty
        else None
    )
    fake = tuple(sorted({n for run in loaded for n in labels.fake_power_nodes(run.aggregate_dir)}))
    against = labels.MODELLED if fake else "measurement"  # the axis and the legend name the nodes
    plot(
        frame,
        png_path,
        f"Delay model vs measurement — MAPE {mape:.1f} %",
        None if energy_mape is None else f"Energy model vs {against} — MAPE {energy_mape:.1f} %",
        fake,
    )
    return ValidationSummary(
        run_dirs=tuple(Path(d) for d in run_dirs),
        csv_path=csv_path,
        png_path=png_path,
        points=len(frame),
        mape_pct=mape,
        mape_by_device=by_device,
        mape_by_policy=by_policy,
        component_mape_pct=components,
        remote_mape_inrun_pct=inrun,
        notes=tuple(notes),
        energy_mape_pct=energy_mape,
        energy_modelled=fake if energy_mape is not None else (),
    )


def validate_run(run: LoadedRun | Path) -> ValidationSummary:
    """Validate one run: writes ``aggregate/validation.csv`` and ``aggregate/validation.png``."""
    loaded = LoadedRun.of(run)
    return validate_runs([loaded], loaded.aggregate_dir)
