"""Chapter 4 read from its runs: the delay model's validation under RR and SJF, the optimisers and their
gaps, and the energy and EDP objectives, each row beside the article's figure where it gives one.

The simulator (:mod:`dit.sim`) models decoder generation (Chapter 6), not the DNN partitioning of this
chapter, so the simulated column says so rather than staying empty.
"""

from __future__ import annotations

import base64
import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dit import units
from dit.report import labels
from dit.report.section import Section
from dit.reproduce.article import FIGURES
from dit.reproduce.chapter import Chapter, Finished, Plan, Size, shipped_document
from dit.reproduce.context import Context, verdict_table, where_text
from dit.reproduce.execute import VariantOutcome
from dit.scenario import expand
from dit.trusted import check_trusted_dir
from dit.units import MISSING

ALGORITHMS: Final = ("greedy", "trend", "exhaustive", "exact")
OBJECTIVES: Final = ("energy", "edp")
NOT_SIMULATED: Final = "n/a (Chapter 6 only)"
NO_FIGURE: Final = "no figure in the article"


@dataclass(frozen=True)
class PolicyRun:
    """The run of one scheduling policy (None: the variant did not finish, with why)."""

    policy: str
    run_dir: Path | None
    missing: str | None = None


def _pct(value: float | None) -> str:
    return MISSING if value is None or math.isnan(value) else f"{value:.1f} %"


def validation_section(runs: Sequence[PolicyRun], ctx: Context, out_dir: Path) -> Section:
    """The delay model against the measurement, per policy and over both."""
    from dit.analysis.model_validation import validate_runs
    from dit.analysis.run import AggregateError

    section = Section("Delay model validation (RR and SJF)", "validation")
    figure = FIGURES["ch4.mape"]
    present = [r for r in runs if r.run_dir is not None]
    rows: list[list[str]] = []
    for run in runs:
        if run.run_dir is None:
            rows.append(
                [
                    f"MAPE, {run.policy}",
                    f"not measured: {run.missing}",
                    NOT_SIMULATED,
                    figure.text,
                    "cannot say: the run is missing",
                ]
            )
    summary = None
    if present:
        try:
            summary = validate_runs([r.run_dir for r in present if r.run_dir is not None], out_dir)
        except AggregateError as exc:
            rows.append(["MAPE", f"not measured: {exc}", NOT_SIMULATED, figure.text, "cannot say"])
    if summary is not None:
        for policy, mape in summary.mape_by_policy.items():
            rows.append([f"MAPE, {policy}", _pct(mape), NOT_SIMULATED, figure.text, verdict(mape, ctx)])
        rows.append(
            [
                f"MAPE, both policies ({summary.points} points)",
                _pct(summary.mape_pct),
                NOT_SIMULATED,
                figure.text,
                verdict(summary.mape_pct, ctx),
            ]
        )
        for component, mape in summary.component_mape_pct.items():
            rows.append([f"MAPE of the {component} term", _pct(mape), NOT_SIMULATED, NO_FIGURE, MISSING])
        section.note = (
            f"Predicted (the delay model on the run's own profile) against measured delay per device and "
            f"partition vector, {where_text(ctx)}. The per-point table follows; validation.csv and .png are in "
            f"{out_dir}."
        )
        verdict_table(section, rows)
        _points_table(section, summary.csv_path)
        if summary.png_path.is_file():  # inlined: the report stays one self-contained file
            encoded = base64.b64encode(summary.png_path.read_bytes()).decode("ascii")
            section.figures.append(
                {"caption": "Predicted against measured delay", "src": f"data:image/png;base64,{encoded}"}
            )
        for note in summary.notes:
            section.note += f" {note}."
    else:
        section.note = "No run of this chapter finished: nothing to validate."
        verdict_table(section, rows)
    return section


def verdict(mape: float, ctx: Context) -> str:
    figure = FIGURES["ch4.mape"]
    if math.isnan(mape):
        return "cannot say: no measured point"
    if figure.holds(mape):
        return f"reproduces: {mape:.1f} % is within the article's 10 %"
    if not ctx.shared_machine:  # real boards: the per-device table shows where the model misses
        return f"does not reproduce: {mape:.1f} % exceeds 10 %; the per-device table shows where"
    return (
        f"does not reproduce: {mape:.1f} % exceeds 10 %; measured on {ctx.cores} shared cores "
        f"(load average {ctx.load_text()}), where the devices' processes, the edge service and the load "
        "generators compete for the same cores the profile was taken on"
    )


def _points_table(section: Section, csv_path: Path) -> None:
    import pandas as pd

    frame = pd.read_csv(csv_path)
    rows = []
    for _, r in frame.iterrows():
        rows.append(
            [
                str(r["policy"]),
                str(r["vector"]),
                str(r["device"]),
                units.duration(r["predicted_delay_ns"]),
                units.duration(r["measured_delay_ns"]),
                _pct(None if pd.isna(r["ape_pct"]) else float(r["ape_pct"])),
            ]
        )
    section.table(
        "Per device and partition vector",
        ("policy", "vector", "device", "predicted", "measured", "error"),
        rows,
    )


def optimiser_section(runs: Sequence[PolicyRun]) -> Section:
    """Each algorithm's optimum of total delay per policy and its gap to the best found (exact's, where
    it ran: it is optimal by construction)."""
    from dit.analysis.run import AggregateError
    from dit.optimise import OptimiseError
    from dit.optimise.api import optimise_run

    section = Section("Optimisers and their gaps (total delay)", "optimisers")
    rows: list[list[str]] = []
    for run in runs:
        if run.run_dir is None:
            rows.append([run.policy, "all", f"not measured: {run.missing}", "", "", "", ""])
            continue
        found: dict[str, Any] = {}
        for algorithm in ALGORITHMS:
            try:
                found[algorithm] = optimise_run(run.run_dir, algorithm, "total_delay", run.policy, None)
            except (OptimiseError, AggregateError) as exc:
                found[algorithm] = str(exc)
        values = [r.objective_value for r in found.values() if not isinstance(r, str)]
        best = min(values) if values else None
        for algorithm, result in found.items():
            if isinstance(result, str):
                rows.append([run.policy, algorithm, f"did not run: {result}", "", "", "", ""])
                continue
            gap = (result.objective_value - best) / best * 100 if best else 0.0
            rows.append(
                [
                    run.policy,
                    algorithm,
                    ",".join(str(p) for p in result.vector),
                    units.duration(result.objective_value),
                    _pct(gap),
                    f"{result.vectors_evaluated:,}",
                    units.duration(result.search_wall_ns),
                ]
            )
    section.note = (
        f"Each algorithm searched the delay model fitted to the run. The gap is to the best vector any of "
        f"them found; exact (a MILP solved by HiGHS) is optimal where it ran. The article: "
        f"{FIGURES['ch4.gap'].text}."
    )
    section.table(
        "", ("policy", "algorithm", "vector", "total delay", "gap", "vectors evaluated", "search time"), rows
    )
    return section


def energy_section(runs: Sequence[PolicyRun]) -> Section:
    """The energy and EDP optima per policy, labelled when the power came from a fake sensor."""
    from dit.analysis.run import AggregateError
    from dit.optimise import OptimiseError
    from dit.optimise.api import optimise_run

    section = Section("Energy and EDP objectives", "energy")
    rows: list[list[str]] = []
    fake: set[str] = set()
    for run in runs:
        if run.run_dir is None:
            rows.append([run.policy, "both", f"not measured: {run.missing}", "", ""])
            continue
        fake.update(labels.fake_power_nodes(run.run_dir / "aggregate"))
        for objective in OBJECTIVES:
            try:
                result = optimise_run(run.run_dir, "exhaustive", objective, run.policy, None)
            except (OptimiseError, AggregateError) as exc:
                rows.append([run.policy, objective, f"not computed: {exc}", "", ""])
                continue
            rows.append(
                [
                    run.policy,
                    objective,
                    ",".join(str(p) for p in result.vector),
                    units.with_unit(result.objective_value, result.objective_unit),
                    "exhaustive",
                ]
            )
    section.note = (
        labels.fake_sensor_note(sorted(fake)) + " " if fake else ""
    ) + f"The article gives no figure for these objectives ({NO_FIGURE})."
    section.table("", ("policy", "objective", "vector", "value", "algorithm"), rows)
    return section


def policy_runs(outcomes: Sequence[Mapping[str, Any]]) -> list[PolicyRun]:
    """One :class:`PolicyRun` per policy of the sweep, from the outcomes' run directories."""
    runs: list[PolicyRun] = []
    for outcome in outcomes:
        policy = str(outcome.get("policy") or "?")
        run_dir = outcome.get("run_dir")
        if outcome.get("state") in ("completed", "degraded") and run_dir:
            runs.append(PolicyRun(policy, Path(str(run_dir))))
        else:
            runs.append(
                PolicyRun(policy, None, str(outcome.get("error") or f"the run ended {outcome.get('state')}"))
            )
    return runs


def policy_of(run_dir: Path) -> str:
    meta = json.loads((run_dir / "metadata.json").read_text(encoding="utf-8"))
    return str(meta["scenario"]["document"].get("edge_server", {}).get("policy", "RR")).upper()


def sections(runs: Sequence[PolicyRun], ctx: Context, out_dir: Path) -> list[Section]:
    return [validation_section(runs, ctx, out_dir), optimiser_section(runs), energy_section(runs)]


def document(size: Size) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Chapter 4's scenario at ``size`` and the reductions made for it: ``full`` is the shipped
    ``scenarios/ch4_validation.yaml`` (AlexNet itself, five repetitions, 50 inference rounds per point);
    ``quick`` runs AlexNet's fake stand-in (its 11 stages and cut sizes, the model the quickstart runs),
    one profiling pass and one load process per loaded device."""
    doc = shipped_document("ch4_validation")
    if size == "full":
        return doc, ()
    quick = copy.deepcopy(doc)
    quick["model"] = {"name": "fake", "params": {"profile": "alexnet"}}
    quick["repetitions"] = 1
    inference: Mapping[str, Any] = quick.get("inference") or {}
    quick["inference"] = {**inference, "repetitions": 3}
    load: Mapping[str, Mapping[str, Any]] = quick.get("load") or {}
    quick["load"] = {device: {**block, "processes": 1} for device, block in load.items()}
    reductions = (
        "AlexNet's fake stand-in (its 11 stages and cut sizes, timed by a calibrated busy loop) instead of "
        "AlexNet itself",
        "1 profiling repetition instead of 5; 3 inference rounds per partition point instead of 50",
        "1 load process on each loaded device instead of 1, 2 and 3",
    )
    return quick, reductions


def _plan(size: Size, local: bool) -> Plan:
    doc, reductions = document(size)
    return Plan("ch4", size, tuple(expand(doc)), reductions)


def _policy(outcome: VariantOutcome) -> str:
    # the sweep's label names the policy: ch4_validation[edge_server.policy=RR]
    marker = "edge_server.policy="
    if marker in outcome.label:
        return outcome.label.split(marker, 1)[1].split(",", 1)[0].rstrip("]")
    return "RR"


def _report(done: Finished) -> list[Section]:
    done.ctx.network = "no delay asked by ch4_validation: the links are measured (ping), not shaped"
    runs = policy_runs(
        [
            {"policy": _policy(o), "run_dir": o.run_dir, "state": o.state, "error": o.error}
            for o in done.outcomes
        ]
    )
    validation = done.out / "validation"
    check_trusted_dir(validation, what="--out", create=True)  # never a link to another directory
    return sections(runs, done.ctx, validation)


CHAPTER: Final = Chapter(
    "ch4", "Chapter 4 — the delay model under RR and SJF, and the optimisers", _plan, _report
)
