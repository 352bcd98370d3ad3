"""Runs side by side (``dit report RUN RUN …``, NNPM's *Compare*): one column per run.

What a researcher compares between two runs — their state, model and policy, the phase means, each
optimum, the energy (a fake sensor's said so), the model's error, the runtime's summary values — and
what differs between their scenarios, path by path. Everything is read from the run directories, as the
single-run report does; a figure a run does not have is a dash, never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dit import units
from dit.report import labels
from dit.report.build import is_run_dir, read_frame, render
from dit.report.section import Section
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


class CompareError(ValueError):
    """Fewer than two runs, or a path that is not a run directory."""


def _leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a scenario document by its dotted path (lists are leaves, compared whole)."""
    if isinstance(doc, Mapping) and doc:
        out: dict[str, Any] = {}
        for key in sorted(doc, key=str):
            out.update(_leaves(doc[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: doc} if prefix else {}


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
    leaves = [_leaves(r.document) for r in runs]
    paths = sorted(set().union(*leaves))
    return [
        (path, *(_text(leaf.get(path)) for leaf in leaves))
        for path in paths
        if len({json.dumps(leaf.get(path), sort_keys=True) for leaf in leaves}) > 1
    ]


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
    return title, [both, differ]


def build_comparison(paths: Sequence[Path]) -> str:
    """The HTML of the comparison of ``paths`` (two or more run directories)."""
    title, sections = comparison_sections(load([Path(p) for p in paths]))
    return render(title, sections, Path(paths[0]).parent)
