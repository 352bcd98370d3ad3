"""Runs side by side (``dit report RUN RUN …``, NNPM's *Compare*): one column per run.

What a researcher compares between two runs — their state, model and policy, the phase means, each
optimum, the energy (a fake sensor's said so), the model's error, the runtime's summary values — and
what differs between their scenarios, path by path; their distributions (every request's end-to-end
delay, every token's latency) overlaid in one plot with each one's spread. Everything is read from the
run directories, as the single-run report does; a figure a run does not have is a dash, never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure

from dit import units
from dit.analysis.run import AggregateError
from dit.report import labels
from dit.report.build import is_run_dir, read_frame, render
from dit.report.section import Section
from dit.results import Spread, decode_tokens, flatten_scenario, read_phases, spread
from dit.run.rundir import RunDir, read_json_object
from dit.units import MISSING

PHASE_ROWS: Final = (
    ("local_ns", "local (L)"),
    ("transmission_ns", "transmission (T)"),
    ("queue_ns", "queue at the edge"),
    ("remote_ns", "remote (R)"),
    ("return_ns", "return"),
    ("total_ns", "end to end (D)"),
)
"""Columns of ``aggregate/phases_summary.csv`` compared, with their row names."""
DELAY_AXIS: Final = "end-to-end delay per request (ms)"
LATENCY_AXIS: Final = "latency per decode token, prefill left out (ms)"


class CompareError(ValueError):
    """Fewer than two runs, or a path that is not a run directory."""


def _text(value: Any) -> str:
    if value is None:
        return MISSING
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class ComparedRun:
    """What the comparison reads of one run directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.status = read_json_object(path / "status.json")
        self.meta = read_json_object(path / "metadata.json")
        scenario = self.meta.get("scenario") or {}
        self.document: Mapping[str, Any] = scenario.get("document") or {}
        self.label = str(scenario.get("label") or self.status.get("label") or path.name)
        self.agg = path / "aggregate"

    @property
    def column(self) -> str:
        return f"{self.label} ({self.path.name})"

    def model(self) -> str:
        spec = (self.meta.get("model") or {}).get("spec") or {}
        if not spec:
            return MISSING
        params = spec.get("params") or {}
        shown = str(spec.get("name", "?")) + "".join(f" · {k}={v}" for k, v in sorted(params.items()))
        stand_in = (self.meta.get("model") or {}).get("stand_in_for")
        return shown + (f" (standing in for {stand_in})" if stand_in else "")

    def phase_means(self) -> dict[str, float]:
        frame = read_frame(self.agg / "phases_summary.csv")
        if frame is None or frame.empty:
            return {}
        return {c: float(frame[c].mean()) for c, _ in PHASE_ROWS if c in frame and frame[c].notna().any()}

    def optima(self) -> dict[str, str]:
        """``algorithm-objective-policy`` -> "vector … · objective value" of each optimise result."""
        out: dict[str, str] = {}
        for result in sorted((self.path / "optimise").glob("*.json")):
            data = read_json_object(result)
            value = data.get("objective_value")
            unit = str(data.get("objective_unit", ""))
            shown = units.with_unit(value, unit) if isinstance(value, (int, float)) else MISSING
            out[result.stem] = f"{data.get('vector')} · {shown}"
        return out

    def energy(self) -> str:
        """The energy over the whole run (every node's sensor), with its sensor when it is fake."""
        frame = read_frame(self.agg / "power_summary.csv")
        if frame is None or frame.empty or "energy_j" not in frame:
            return MISSING
        fake = labels.fake_power_nodes(self.agg)
        shown = units.with_unit(float(frame["energy_j"].sum()), "J")
        return shown + (" (fake sensor: modelled, not measured)" if fake else "")

    def mape(self) -> str:
        frame = read_frame(self.agg / "validation.csv")
        if frame is None or frame.empty or "ape_pct" not in frame:
            return MISSING
        return units.percent(float(frame["ape_pct"].dropna().mean()))

    def summary(self) -> dict[str, str]:
        doc = read_json_object(self.agg / "summary.json")
        fake = labels.fake_power_nodes(self.agg)  # a fake sensor's energy says so in its own cell
        return {
            str(v["name"]): units.with_unit(v.get("value"), str(v.get("unit", "")))
            + labels.modelled_tag(str(v.get("unit", "")), fake)
            for v in doc.get("values") or []
            if isinstance(v, dict) and "name" in v
        }


def load(paths: Sequence[Path]) -> list[ComparedRun]:
    """The runs to compare; :class:`CompareError` for fewer than two or a path that is not a run."""
    if len(paths) < 2:
        raise CompareError("a comparison needs two or more run directories")
    seen: dict[Path, Path] = {}
    for path in paths:
        if not is_run_dir(path):
            raise CompareError(f"{path} is not a run directory (no status.json and scenario.yaml)")
        if path.resolve() in seen:
            raise CompareError(f"{path} is given twice (as {seen[path.resolve()]})")
        seen[path.resolve()] = path
    return [ComparedRun(path) for path in paths]


def side_by_side(runs: Sequence[ComparedRun]) -> list[tuple[str, ...]]:
    """One row per measure, one cell per run (a dash where a run has no such figure)."""
    rows: list[tuple[str, ...]] = []

    def row(name: str, cells: Sequence[str]) -> None:
        rows.append((name, *cells))

    row("state", [str(r.status.get("state", MISSING)) for r in runs])
    row("note", [RunDir(r.path).note().strip() or MISSING for r in runs])
    row("outcome", [labels.run_outcome(r.status) or MISSING for r in runs])
    row("model", [r.model() for r in runs])
    row("devices", [", ".join(map(str, r.document.get("devices") or [])) or MISSING for r in runs])
    row("runtime", [str((r.document.get("runtime") or {}).get("name") or "layers") for r in runs])
    row("policy", [str((r.document.get("edge_server") or {}).get("policy") or MISSING) for r in runs])
    means = [r.phase_means() for r in runs]
    for column, name in PHASE_ROWS:
        if any(column in m for m in means):
            row(f"mean {name}", [units.duration(m[column]) if column in m else MISSING for m in means])
    optima = [r.optima() for r in runs]
    for key in dict.fromkeys(k for o in optima for k in o):
        row(f"optimum {key}", [o.get(key, MISSING) for o in optima])
    row("energy (all nodes)", [r.energy() for r in runs])
    row("delay model MAPE", [r.mape() for r in runs])
    summaries = [r.summary() for r in runs]
    for name in dict.fromkeys(n for s in summaries for n in s):
        row(f"runtime: {name}", [s.get(name, MISSING) for s in summaries])
    return rows


def scenario_differences(runs: Sequence[ComparedRun]) -> list[tuple[str, ...]]:
    """The scenario paths whose values are not the same in every run: ``(path, value per run…)``."""
    leaves = [flatten_scenario(r.document) for r in runs]
    paths = sorted(set().union(*leaves))
    return [
        (path, *(_text(leaf.get(path)) for leaf in leaves))
        for path in paths
        if len({json.dumps(leaf.get(path), sort_keys=True) for leaf in leaves}) > 1
    ]


def _samples(runs: Sequence[ComparedRun]) -> dict[str, dict[str, list[float]]]:
    """Per measure (end-to-end delay, token latency), each run's values in ns: every request's
    ``total_ns`` of every device and round, every decode token of every repetition (a run without any, or
    whose file cannot be read, is left out)."""
    out: dict[str, dict[str, list[float]]] = {DELAY_AXIS: {}, LATENCY_AXIS: {}}
    for run in runs:
        for axis, read, column in (
            (DELAY_AXIS, read_phases, "total_ns"),
            (LATENCY_AXIS, decode_tokens, "latency_ns"),
        ):
            try:
                frame = read(run.path)
            except AggregateError:
                continue
            if frame is not None and not frame.empty:
                out[axis][run.column] = [float(v) for v in frame[column].dropna()]
    return {axis: per_run for axis, per_run in out.items() if per_run}


def distribution_figure(samples: Mapping[str, Mapping[str, Sequence[float]]]) -> Figure:
    """One panel per measure: each run's empirical CDF (fraction of values at or below x, in ms), overlaid."""
    runs = max(len(per_run) for per_run in samples.values())
    figure = Figure(figsize=(8.0, 0.6 + (3.2 + 0.22 * runs) * len(samples)))
    axes = figure.subplots(len(samples), 1, squeeze=False)[:, 0]
    for ax, (axis, per_run) in zip(axes, samples.items(), strict=True):
        for column, values in per_run.items():
            ordered = sorted(v / 1e6 for v in values)
            fractions = [0.0, *((k + 1) / len(ordered) for k in range(len(ordered)))]
            ax.step([ordered[0], *ordered], fractions, where="post",
                    label=f"{column}, n = {len(ordered)}")  # fmt: skip
        ax.set_xlabel(axis)
        ax.set_ylabel("fraction at or below")
        ax.set_ylim(0, 1.02)
        ax.grid(True, linewidth=0.4, alpha=0.5)
        # below the axes: run names are long, and inside they would hide the curves' tails
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.18))
    return figure


def distributions(runs: Sequence[ComparedRun]) -> Section:
    """The runs' distributions overlaid (end-to-end delay per request, latency per token), and each
    one's spread (:func:`dit.results.spread`)."""
    section = Section("Distributions", "distributions")
    samples = _samples(runs)
    if not samples:
        section.note = "No run measured inference requests or generated tokens."
        return section
    section.note = (
        "Empirical CDFs: each run's requests (every device and round) and decode tokens (every repetition, "
        "the prompt's prefill left out), "
        "one line per run; mean ± 95 % CI of the mean (t-interval), nearest-rank p50 / p95 / p99."
    )
    section.figure("distributions of the runs, overlaid", distribution_figure(samples))
    for axis, per_run in samples.items():
        spreads: dict[str, Spread] = {c: spread(v) for c, v in per_run.items()}
        section.table(
            axis,
            ("run", "n", "mean", "p50 / p95 / p99"),
            [(c, s.n, s.mean_text(), s.percentiles_text()) for c, s in spreads.items()],
        )
    return section


def comparison_sections(runs: Sequence[ComparedRun]) -> tuple[str, list[Section]]:
    """The comparison's title and sections: the runs side by side, then their scenarios' differences."""
    columns = ("", *(r.column for r in runs))
    both = Section("Side by side", "side-by-side", note=f"{len(runs)} runs, one column each.")
    both.table("every figure of each run (a dash: the run has none)", columns, side_by_side(runs))
    fake = sorted({n for r in runs for n in labels.fake_power_nodes(r.agg)})
    if fake:
        both.note += " " + labels.fake_sensor_note(fake)
    differ = Section("Scenario differences", "scenario-differences")
    rows = scenario_differences(runs)
    if rows:
        differ.note = "Each scenario path whose value is not the same in every run (the resolved scenarios)."
        differ.table("path by path", ("path", *(r.column for r in runs)), rows)
    else:
        differ.note = "The runs have the same scenario: they differ only in what was measured."
    title = " vs ".join(dict.fromkeys(r.label for r in runs)) + " — compared"
    return title, [both, distributions(runs), differ]


def build_comparison(paths: Sequence[Path]) -> str:
    """The HTML of the comparison of ``paths`` (two or more run directories)."""
    title, sections = comparison_sections(load([Path(p) for p in paths]))
    return render(title, sections, Path(paths[0]).parent, wide=True)
