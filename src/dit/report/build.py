"""``dit report``: one self-contained HTML file for a run or a sweep, readable offline and printable.

Everything is read from the run directory (docs/interchange.md, docs/raw-results.md): no network, no
CDN, images inlined as PNG data URIs, styles in the page. Every number carries a unit at a readable
scale (:mod:`dit.units`). A section whose inputs the run does not have says so instead of
disappearing, so two reports read alike. docs/report.md lists the sections and their sources.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape
from matplotlib.figure import Figure

from dit import results, units
from dit.analysis.run import AggregateError
from dit.report import labels, rtt
from dit.report.section import Section
from dit.run.console import STAGES as STAGE_ORDER
from dit.run.rundir import RunDir, read_json_object, write_text
from dit.units import MISSING

PHASES: Final = ("local_ns", "transmission_ns", "barrier_ns", "queue_ns", "remote_ns", "return_ns")
PHASE_COLOURS: Final = ("#4878d0", "#ee854a", "#bbbbbb", "#d65f5f", "#6acc64", "#956cb4")
MONITOR_METRICS: Final = (
    (r"cpu_pct", "CPU (%)"),
    (r"mem_used_pct", "memory used (%)"),
    (r"thermal_zone\d+_temp_c", "temperature (°C)"),
    (r"cpu\d+_freq_khz", "frequency (MHz)"),
    (r"throttled", "throttled (0/1)"),
)
"""(metric pattern, axis label) of the monitor panels, each metric matched whole."""


PLOT_SCALES: Final = {"ns": (1e6, "ms"), "B": (1e6, "MB"), "J": (1e-3, "mJ")}
"""Summary values plotted along a sweep: (divisor, unit shown) for the units read better rescaled."""


class ReportError(Exception):
    """The path is not a run directory, nor a directory of runs."""


def read_frame(path: Path) -> pd.DataFrame | None:
    """A CSV file of the run as a frame; None when it is missing or unreadable (a section says so)."""
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError):
        return None
    return frame


def _scenario(run_dir: Path) -> dict[str, Any]:
    """The run's resolved ``scenario.yaml``; empty when missing or unreadable (the report still renders)."""
    from dit.scenario import ScenarioError, load_yaml

    try:
        return load_yaml(run_dir / "scenario.yaml")
    except (ScenarioError, OSError):
        return {}


def is_run_dir(path: Path) -> bool:
    return (path / "status.json").is_file() and (path / "scenario.yaml").is_file()


# --------------------------------------------------------------------------- one run


def _facts(run_dir: Path, status: Mapping[str, Any], meta: Mapping[str, Any]) -> Section:
    section = Section("Facts", "facts")
    scenario = meta.get("scenario") or {}
    dit_meta = meta.get("dit") or {}
    git = dit_meta.get("git") or {}
    rows = [
        ("run", run_dir.name),
        ("scenario", str(scenario.get("label") or status.get("label") or "")),
        ("scenario version (sha256)", str(scenario.get("hash") or MISSING)),
        ("state", str(status.get("state", MISSING))),
        ("mode", str(meta.get("mode", MISSING))),
        ("dit", f"{dit_meta.get('version', MISSING)} ({str(git.get('commit', ''))[:12] or 'no git'}"
                + (", modified)" if git.get("dirty") else ")")),
        ("runtime", str((meta.get("runtime") or {}).get("name", "layers"))),
    ]  # fmt: skip
    if status.get("state") == "stopped":  # the user's choice, not an error, and what the run kept
        rows.append(("stopped", labels.run_outcome(status) or str(status.get("error") or "")))
        rows.append(("kept", labels.kept_text(run_dir, status) or ""))
    elif status.get("error"):
        rows.append(("error", str(status["error"])))
    written = RunDir(run_dir).note().strip()
    if written:  # the researcher's note (dit note, NNPM's run page), as written
        rows.append(("note", written))
    section.table("", ("", ""), rows)
    nodes = meta.get("nodes") or {}
    if isinstance(nodes, Mapping) and nodes:
        node_rows = []
        for name, node_facts in nodes.items():
            facts = node_facts if isinstance(node_facts, Mapping) else {}
            ntp = facts.get("ntp") if isinstance(facts.get("ntp"), Mapping) else {}
            node_rows.append(
                (
                    name,
                    str(facts.get("board_model") or facts.get("cpu_model") or MISSING),
                    str(facts.get("cpu_count", MISSING)),
                    units.size(facts.get("mem_total_bytes")),
                    str(facts.get("kernel", MISSING)),
                    str(facts.get("python", MISSING)),
                    f"{ntp.get('source', MISSING)}, offset {ntp.get('offset_ms', MISSING)} ms"
                    if ntp
                    else MISSING,
                )
            )
        section.table(
            "nodes", ("node", "board / CPU", "cores", "memory", "kernel", "python", "clock"), node_rows
        )
    versions = meta.get("versions") or {}
    if isinstance(versions, Mapping) and versions:
        section.table(
            "versions", ("package", "version"), [(k, str(v or "not installed")) for k, v in versions.items()]
        )
    return section


def _stages(status: Mapping[str, Any]) -> Section:
    section = Section("Stages", "stages")
    stage_ns = status.get("stage_ns") or {}
    # a stage the driver skipped keeps its row, saying why, so no stage silently goes missing
    skipped = {s: why for s, why in labels.skipped_stages(status).items() if s not in stage_ns}
    known = [*stage_ns, *skipped]
    order = [s for s in STAGE_ORDER if s in known] + [s for s in known if s not in STAGE_ORDER]
    section.table("wall time per stage, in run order", ("stage", "wall time"),
                  [(s, f"skipped ({skipped[s]})" if s in skipped else units.duration(stage_ns[s]))
                   for s in order])  # fmt: skip
    lateness = status.get("lateness_ns") or {}
    if lateness:
        section.table("start lateness (after the common instant)", ("device", "lateness"),
                      [(d, units.duration(v)) for d, v in lateness.items()])  # fmt: skip
    return section


def _table_section(
    title: str,
    anchor: str,
    frame: pd.DataFrame | None,
    missing: str,
    fill: Callable[[Section, pd.DataFrame], None],
) -> Section:
    """A section drawn from one aggregate table by ``fill``; ``missing`` is its note when there is none."""
    section = Section(title, anchor)
    if frame is None or frame.empty:
        section.note = missing
    else:
        fill(section, frame)
    return section


def _phases_frame(agg: Path) -> pd.DataFrame | None:
    phases = read_frame(agg / "phases.csv")
    return phases if phases is not None and set(PHASES) <= set(phases.columns) else None


def _phases(agg: Path, round_: int | None, section: Section, phases: pd.DataFrame) -> None:
    rounds = sorted(int(r) for r in phases["round"].unique())
    chosen = round_ if round_ is not None and round_ in rounds else rounds[0]
    rows = phases[phases["round"] == chosen]
    means = rows.groupby("host", sort=True)[list(PHASES)].mean()
    points = {str(h): int(p) for h, p in rows.groupby("host", sort=True)["partition_point"].first().items()}
    section.note = (
        f"Round {chosen} of {len(rounds)} (mean over its repetitions); times from the device's clock."
    )
    figure = Figure(figsize=(8.0, 0.6 + 0.55 * len(means)))
    ax = figure.subplots()
    for y, (_host, row) in enumerate(means.iterrows()):
        left = 0.0
        for phase, colour in zip(PHASES, PHASE_COLOURS, strict=True):
            width = float(row[phase]) / 1e6
            ax.barh(y, width, left=left, color=colour, label=phase[:-3] if y == 0 else None)
            left += width
    ax.set_yticks(range(len(means)), [f"{h} (p={points[str(h)]})" for h in means.index])
    ax.invert_yaxis()
    ax.set_xlabel("time since the request started (ms)")
    ax.legend(
        ncol=6, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(means) < 3 else -0.18)
    )
    section.figure(f"phase timeline, round {chosen}", figure)
    spreads = _total_spreads(agg.parent)
    spread_of = {(host, rnd): s for (host, rnd, _p), s in spreads.items()}
    section.table(
        f"phases, round {chosen}" + (" (total: mean ± 95 % CI, then p50 / p95 / p99)" if spreads else ""),
        ("device", "p", *(p[:-3] for p in PHASES), "total", *(("total p50 / p95 / p99",) if spreads else ())),
        [
            (host, points[str(host)], *(units.duration(row[p]) for p in PHASES),
             *_total_cells(spread_of.get((str(host), chosen)), sum(float(row[p]) for p in PHASES), bool(spreads)))
            for host, row in means.iterrows()
        ],
    )  # fmt: skip


def _total_spreads(run_dir: Path) -> dict[tuple[str, int, int], results.Spread]:
    """The spread of every (device, round)'s total; none when phases.csv cannot be read."""
    try:
        return results.phase_total_spreads(run_dir)
    except AggregateError:
        return {}


def _total_cells(spread: results.Spread | None, mean_ns: float, shown: bool) -> tuple[str, ...]:
    """The total's cells: ``mean ± CI`` and ``p50 / p95 / p99`` with a spread, else the mean alone."""
    if not shown:
        return (units.duration(mean_ns),)
    if spread is None:
        return units.duration(mean_ns), MISSING
    return spread.mean_text(), spread.percentiles_text()


def _token_spread(section: Section, run_dir: Path) -> Section:
    """The runtime section with each host's token latency spread (dit.results), when tokens were made."""
    try:
        spreads = results.token_spreads(run_dir)
    except AggregateError:
        return section
    if spreads:
        section.table(
            "decode token latency, every repetition, the prefill left out (mean ± 95 % CI of the mean)",
            ("host", "tokens", "mean", "p50 / p95 / p99"),
            [(host, s.n, s.mean_text(), s.percentiles_text()) for host, s in spreads.items()],
        )
    return section


def _layers(section: Section, layers: pd.DataFrame) -> None:
    body = layers[layers["stage"] >= 1]
    figure = Figure(figsize=(8.0, 5.0))
    top, bottom = figure.subplots(2, 1, sharex=True)
    hosts = list(dict.fromkeys(body["host"].astype(str)))
    width = 0.8 / max(1, len(hosts))
    for k, host in enumerate(hosts):
        rows = body[body["host"].astype(str) == host]
        x = rows["stage"].to_numpy(dtype=float) - 0.4 + width * (k + 0.5)
        top.bar(x, rows["latency_ns"] / 1e6, width=width, label=host)
        bottom.bar(x, rows["output_bytes"] / 1e3, width=width, label=host)
    top.set_ylabel("latency (ms)")
    bottom.set_ylabel("output size (kB)")
    bottom.set_xlabel("stage (partition point)")
    top.legend(fontsize="small")
    section.figure("per-stage latency and output size", figure)


def _feasibility(section: Section, feas: pd.DataFrame) -> None:
    section.table(
        "the largest partition point each device can run, and what binds it",
        ("device", "max p", "binding", "memory limit", "peak memory at max", "CPU budget", "peak CPU at max"),
        [
            (r["device"], int(r["max_partition_point"]), r["binding_constraint"],
             units.size(_num(r.get("memory_limit_bytes"))), units.size(_num(r.get("peak_mem_bytes_at_max"))),
             units.percent(_num(r.get("cpu_budget_pct"))), units.percent(_num(r.get("peak_cpu_pct_at_max"))))
            for _, r in feas.iterrows()
        ],
    )  # fmt: skip


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _monitors(section: Section, frame: pd.DataFrame) -> None:
    metrics = frame["metric"].astype(str)
    panels = []
    for prefix, label in MONITOR_METRICS:  # prefix: a regular expression
        chosen = frame[metrics.str.fullmatch(prefix)]
        if not chosen.empty:
            panels.append((label, chosen))
    if not panels:
        section.note = "The monitor traces hold no CPU, memory, temperature, frequency or throttling metric."
        return
    figure = Figure(figsize=(8.0, 1.9 * len(panels)))
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (label, chosen) in zip(axes, panels, strict=True):
        for (node, metric), rows in chosen.groupby(["node", "metric"], sort=True):
            value = rows["value"] / 1000.0 if str(metric).endswith("_khz") else rows["value"]
            ax.plot(rows["t_ns"] / 1e9, value, label=f"{node} {metric}", linewidth=1)
        ax.set_ylabel(label)
        ax.legend(fontsize="x-small", ncol=3)
    axes[-1].set_xlabel("time from the run's common origin (s)")
    section.figure("monitor traces on one time axis", figure)


def _power(agg: Path) -> Section:
    section = Section("Power and energy", "power")
    frame = read_frame(agg / "monitors.csv")
    power = None if frame is None else frame[frame["metric"].astype(str) == "power_w"]
    energy = read_frame(agg / "energy.csv")
    model = read_frame(agg / "power_model.csv")
    if (power is None or power.empty) and (energy is None or energy.empty):
        section.note = "No power trace (give a device a `power` monitor)."
        return section
    sensors = labels.power_sensors(agg)
    fake = labels.fake_power_nodes(agg)
    section.note = labels.fake_sensor_note(fake)

    def who(node: Any) -> str:  # a fake sensor's node named so in every table row and legend
        return labels.node_label(node, fake)

    if power is not None and not power.empty:
        figure = Figure(figsize=(8.0, 2.6))
        ax = figure.subplots()
        for node, rows in power.groupby("node", sort=True):
            ax.plot(rows["t_ns"] / 1e9, rows["value"], label=who(node), linewidth=1)
        ax.set_xlabel("time from the run's common origin (s)")
        ax.set_ylabel("power (W)")
        ax.legend(fontsize="small")
        section.figure("power trace" + (" (fake sensor: modelled, not measured)" if fake else ""), figure)
    if energy is not None and not energy.empty:
        grouped = energy.dropna(subset=["energy_j"]).groupby(["device", "round"], sort=True)
        section.table(
            "energy per inference (mean over repetitions)",
            ("device", "sensor", "round", "p", "energy", "mean power", "delay", "EDP"),
            [
                (who(device), sensors.get(str(device)) or MISSING, int(str(rnd)),
                 int(rows["partition_point"].iloc[0]), units.energy(rows["energy_j"].mean()),
                 units.power(rows["mean_power_w"].mean()), units.duration(rows["total_ns"].mean()),
                 f"{rows['edp_js'].mean() * 1e3:.3g} mJ·s")
                for (device, rnd), rows in grouped
            ],
        )  # fmt: skip
    if model is not None and not model.empty:
        section.table(
            "power model (least squares over the requests' phases, docs/optimisers.md)",
            ("device", "idle", "computing", "transmitting", "method", "requests", "residual"),
            [
                (who(r["device"]), units.power(r["idle_w"]), units.power(r["compute_w"]), units.power(r["transmit_w"]),
                 r["method"], int(r["requests"]), units.energy(r["rmse_j"]))
                for _, r in model.iterrows()
            ],
        )  # fmt: skip
    return section


def _validation(agg: Path, section: Section, frame: pd.DataFrame) -> None:
    png = agg / "validation.png"
    errors = frame["ape_pct"].dropna()
    note = f"Delay model MAPE {errors.mean():.2f} % over {len(errors)} (round, device) points"
    if "energy_ape_pct" in frame.columns and frame["energy_ape_pct"].notna().any():
        note += f"; energy model MAPE {frame['energy_ape_pct'].dropna().mean():.2f} %"
        fake = labels.fake_power_nodes(agg)
        if fake:  # the "measurement" the energy model is compared with is itself a model there
            note += f" against a fake power sensor on {', '.join(fake)} (modelled, not measured)"
    section.note = note + "."
    if png.is_file():
        src = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
        section.figures.append({"caption": "predicted vs measured", "src": src})
    section.table(
        "per round and device",
        ("round", "vector", "device", "measured delay", "predicted delay", "error"),
        [
            (int(r["round"]), r["vector"], r["device"], units.duration(r["measured_delay_ns"]),
             units.duration(r["predicted_delay_ns"]), units.percent(_num(r["ape_pct"])))
            for _, r in frame.iterrows()
        ],
    )  # fmt: skip


def _optimise(run_dir: Path, status: Mapping[str, Any]) -> Section:
    section = Section("Optimiser results", "optimise")
    results = sorted((run_dir / "optimise").glob("*.json"))
    why = labels.skipped_stages(status).get("optimise")
    skipped = None if why is None else labels.skipped_text("optimise", why)
    if not results:
        section.note = f"{skipped}." if skipped else "The optimiser did not run."
        return section
    if skipped:  # the results below came later, from `dit optimise RUN_DIR`
        section.note = f"{skipped} during the run; the results below were searched afterwards (dit optimise)."
    measured = labels.measured_policy(_scenario(run_dir))
    fake = labels.fake_power_nodes(run_dir / "aggregate")
    for path in results:
        data = read_json_object(path)
        if not data:
            continue
        objective, value = str(data.get("objective")), _num(data.get("objective_value"))
        shown = {
            "total_delay": units.duration(value),
            "variance": MISSING if value is None else f"{value / 1e12:.4g} ms²",
            "energy": units.energy(value),
            "edp": MISSING if value is None else f"{value * 1e3:.4g} mJ·s",
        }.get(objective, str(value))
        rows = [
            (d.get("device"), d.get("partition_point"), d.get("max_partition_point"),
             units.duration(d.get("L_ns")), units.duration(d.get("T_ns")), units.duration(d.get("R_ns")),
             units.duration(d.get("D_ns")))
            for d in data.get("per_device") or []
        ]  # fmt: skip
        section.table(
            f"{data.get('algorithm')} · {objective} · {data.get('policy')}: vector {data.get('vector')}, "
            f"{objective} = {shown}, {data.get('vectors_evaluated')} vectors in "
            f"{units.duration(data.get('search_wall_ns'))}",
            ("device", "p", "max p", "local L", "transmission T", "remote R", "delay D"),
            rows,
        )
        # the same badges as NNPM's run page: what the run did not measure is marked, never left plain
        badges = section.tables[-1]["badges"]
        reason = labels.prediction_reason(str(data.get("policy", "")), measured)
        if reason is not None:
            badges.append({"kind": "prediction", "text": "prediction", "reason": reason})
        if objective in labels.ENERGY_OBJECTIVES and fake:
            badges.append(
                {"kind": "fake-sensor", "text": labels.MODELLED, "reason": labels.fake_sensor_note(fake)}
            )
    return section


def _netem(section: Section, frame: pd.DataFrame) -> None:
    columns = [c for c in frame.columns if c != "address"]
    rows = [[(MISSING if pd.isna(v) else v) for v in row] for row in frame[columns].itertuples(index=False)]
    section.table("intended vs measured per link (ms)", columns, rows)


def _runtime(agg: Path) -> Section:
    section = Section("Runtime summary", "runtime")
    summary = read_json_object(agg / "summary.json")
    values = summary.get("values") or []
    if not values:
        section.note = "The runtime wrote no summary."
        return section
    fake = labels.fake_power_nodes(agg)
    rows = [
        (v.get("name"), units.with_unit(v.get("value"), str(v.get("unit", "")))
         + labels.modelled_tag(str(v.get("unit", "")), fake), v.get("description", ""))
        for v in values
    ]  # fmt: skip
    section.note = f"Runtime {summary.get('runtime', MISSING)}."
    if any(labels.MODELLED in str(row[1]) for row in rows):
        section.note += " " + labels.fake_sensor_note(fake)
    section.table("summary values", ("name", "value", "description"), rows)
    return section


def run_sections(run_dir: Path, round_: int | None = None) -> tuple[str, list[Section]]:
    if not is_run_dir(run_dir):
        raise ReportError(f"{run_dir} is not a dit run directory (no status.json / scenario.yaml)")
    status = read_json_object(run_dir / "status.json")
    meta = read_json_object(run_dir / "metadata.json")
    agg = run_dir / "aggregate"
    title = str((meta.get("scenario") or {}).get("label") or status.get("label") or run_dir.name)
    # a stopped or refused run says what happened, not that it was a run without inference
    no_phases = labels.run_outcome(status) or "No inference ran in this run (no aggregate/phases.csv)."
    sections = [
        _facts(run_dir, status, meta),
        _stages(status),
        _token_spread(_runtime(agg), run_dir),
        _table_section(
            "Phases per device",
            "phases",
            _phases_frame(agg),
            no_phases,
            functools.partial(_phases, agg, round_),
        ),
        _table_section(
            "Per-layer profile",
            "layers",
            read_frame(agg / "layers.csv"),
            "No profile (aggregate/layers.csv).",
            _layers,
        ),
        _table_section(
            "Feasibility",
            "feasibility",
            read_frame(agg / "feasibility.csv"),
            "No feasibility.csv.",
            _feasibility,
        ),
        _table_section(
            "Monitors", "monitors", read_frame(agg / "monitors.csv"), "No monitor traces.", _monitors
        ),
        _power(agg),
        _table_section(
            "Model validation",
            "validation",
            read_frame(agg / "validation.csv"),
            "No model validation (no inference rounds).",
            functools.partial(_validation, agg),
        ),
        _optimise(run_dir, status),
        _table_section(
            "Network self-check",
            "netem",
            read_frame(agg / "netem_check.csv"),
            "No shaped link in this run.",
            _netem,
        ),
    ]
    return title, sections


# --------------------------------------------------------------------------- a sweep


def sweep_sections(runs_dir: Path) -> tuple[str, list[Section]]:
    runs = sorted(p for p in runs_dir.iterdir() if p.is_dir() and is_run_dir(p))
    if not runs:
        raise ReportError(f"{runs_dir} holds no run directories")
    rows: list[dict[str, Any]] = []
    for run in runs:
        status, meta = read_json_object(run / "status.json"), read_json_object(run / "metadata.json")
        scenario = meta.get("scenario") or {}
        point = {str(p): v for p, v in scenario.get("sweep_point") or []}
        validation = read_frame(run / "aggregate" / "validation.csv")
        mape = (
            None if validation is None or validation.empty else float(validation["ape_pct"].dropna().mean())
        )
        summary = read_json_object(run / "aggregate" / "summary.json")
        rows.append({
            "run": run.name, "label": scenario.get("label") or status.get("label"), "state": status.get("state"),
            "point": point, "mape": mape,
            "policy": ((scenario.get("document") or {}).get("edge_server") or {}).get("policy"),
            "values": {v.get("name"): v for v in summary.get("values") or []},
        })  # fmt: skip
    axes = list(dict.fromkeys(k for r in rows for k in r["point"]))
    names = list(dict.fromkeys(n for r in rows for n in r["values"]))
    overview = Section("Variants", "variants", note=f"{len(rows)} run(s) in {runs_dir}.")
    overview.table(
        "one row per run",
        ("run", "state", *axes, "policy", "model MAPE", *names),
        [
            (r["run"], r["state"], *(str(r["point"].get(a, MISSING)) for a in axes), r["policy"] or MISSING,
             units.percent(r["mape"]),
             *(units.with_unit(r["values"][n].get("value"), str(r["values"][n].get("unit", "")))
               if n in r["values"] else MISSING for n in names))
            for r in rows
        ],
    )  # fmt: skip
    sections = [overview]
    numeric_axes = [a for a in axes if all(isinstance(r["point"].get(a), (int, float)) for r in rows)]
    plots = Section("Along the sweep", "along")
    x_axis = numeric_axes[0] if numeric_axes else None
    series: list[tuple[str, str, list[tuple[Any, float]]]] = []
    mapes = [(_x(r, x_axis, i), float(r["mape"])) for i, r in enumerate(rows) if r["mape"] is not None]
    if mapes:
        series.append(("model MAPE", "%", mapes))
    for name in names:
        clean: list[tuple[Any, float]] = []
        for i, r in enumerate(rows):
            y = _num(r["values"][name].get("value")) if name in r["values"] else None
            if y is not None:
                clean.append((_x(r, x_axis, i), y))
        unit = next(str(r["values"][name].get("unit", "")) for r in rows if name in r["values"])
        if len(clean) > 1:
            series.append((name, unit, clean))
    for name, raw_unit, curve in series[:8]:
        scale, unit = PLOT_SCALES.get(raw_unit, (1.0, raw_unit))
        figure = Figure(figsize=(6.0, 2.6))
        ax = figure.subplots()
        ax.plot([p[0] for p in curve], [p[1] / scale for p in curve], marker="o")
        ax.set_xlabel(x_axis or "variant")
        ax.set_ylabel(f"{name} ({unit})" if unit else name)
        plots.figure(f"{name} along {x_axis or 'the variants'}", figure)
    if not plots.figures:
        plots.note = "Nothing numeric varies across the variants."
    sections.append(plots)
    sections.append(rtt_section(runs))
    title = str(rows[0]["label"] or runs_dir.name).split("[")[0] + " — sweep"
    return title, sections


RTT_AXIS: Final = "added RTT between workers (ms)"
TOKENS_AXIS: Final = "generation rate (tokens/s)"
LOG_RATIO: Final = 20.0
"""Tokens/s on a log axis when the fastest point is more than this many times the slowest."""


def rtt_figure(curves: Mapping[str, Sequence[tuple[float, float]]]) -> Figure:
    """Tokens/s (y) against the added RTT in ms (x), one line per runtime variant."""
    figure = Figure(figsize=(7.0, 3.6 + 0.22 * ((len(curves) + 1) // 2)))
    ax = figure.subplots()
    for variant, curve in curves.items():
        ax.plot([p[0] for p in curve], [p[1] for p in curve], marker="o", label=variant)
    xs = [p[0] for curve in curves.values() for p in curve]
    ys = [p[1] for curve in curves.values() for p in curve if p[1] > 0]
    if xs:  # a sweep at one RTT still gets a readable ms axis
        pad = max(1.0, 0.05 * (max(xs) - min(xs)))
        ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_xlabel(RTT_AXIS)
    if ys and max(ys) / min(ys) > LOG_RATIO:  # llama.cpp and HeadSplit differ by orders of magnitude
        ax.set_yscale("log")
        ax.set_ylabel(TOKENS_AXIS + ", log scale")
    else:
        ax.set_ylim(bottom=0)
        ax.set_ylabel(TOKENS_AXIS)
    ax.grid(True, linewidth=0.4, alpha=0.5)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return figure


def rtt_section(runs: Sequence[Path]) -> Section:
    """The sweep report's "Tokens/s against RTT" of these run directories (docs/report.md)."""
    section = Section("Tokens/s against RTT", "rtt")
    loaded = rtt.load_runs(runs)
    if not any(r.tokens_per_s is not None for r in loaded):
        section.note = "No run of this sweep reports tokens/s (an LLM runtime's tokens_per_s summary value)."
        return section
    points = rtt.points(loaded)
    recorded = [r for r in loaded if r.netem == rtt.RECORDED]
    notes = [
        "Added RTT between the runtime's workers: netem delays egress only, so a round trip between two "
        "workers gains both their network.<device> delays (mean over the pairs of workers; with one worker, "
        "its delay). Tokens/s and the mean token latency are each runtime's summary values "
        "(tokens_per_s, token_latency_mean), the mean over a point's runs."
    ]
    if recorded:
        notes.append(
            f"The added RTT of {len(recorded)} of {len(loaded)} runs was recorded, not applied (local mode, or "
            "a kernel without sch_netem: the run's metadata records the netem tree as a dry run), so those "
            "runs measured without it: their x is the RTT the scenario asked for, not one on the wire."
        )
    if any(not r.rtt_uniform for r in loaded):
        notes.append("Some runs delay their workers unequally: their RTT is the mean over worker pairs.")
    section.note = " ".join(notes)
    caption = "tokens/s against added RTT, per runtime variant"
    if recorded:
        caption += " (RTT recorded, not applied)" if len(recorded) == len(loaded) else " (see the RTT column)"
    section.figure(caption, rtt_figure(rtt.series(points)))
    section.table(
        "the plotted figures",
        ("variant", "added RTT", "tokens/s", "mean token latency", "runs with tokens/s"),
        [
            (p.variant, f"{p.rtt_ms:g} ms" + (f" ({p.netem})" if p.netem else ""),
             units.with_unit(p.tokens_per_s, "tokens/s"), units.duration(p.token_latency_ns),
             f"{p.measured} of {p.runs}")
            for p in points
        ],
    )  # fmt: skip
    return section


def _x(row: Mapping[str, Any], axis: str | None, index: int) -> Any:
    return row["point"].get(axis) if axis else index


# --------------------------------------------------------------------------- rendering


def render(title: str, sections: Sequence[Section], source: Path, wide: bool = False) -> str:
    """The report's HTML; ``wide``: the page takes the window's width (a comparison's side-by-side table
    has a column per run, which a 60 rem page showed one of at 1400 px, the rest scrolled away)."""
    env = Environment(loader=PackageLoader("dit.report", "."), autoescape=select_autoescape(["html", "j2"]))
    template = env.get_template("report.html.j2")
    return template.render(title=title, sections=sections, source=str(source), wide=wide)


def build_report(path: Path, round_: int | None = None) -> str:
    """The HTML of a run's report, or of a sweep's when ``path`` is a directory of runs."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path} is not a directory")
    from dit.report import sim  # imports this module

    if sim.is_sim_dir(path):
        if round_ is not None:
            raise ReportError("--round: a simulation has no phase timeline; leave it out")
        try:
            title, sections = sim.sim_sections(path)
        except sim.SimReportError as exc:
            raise ReportError(str(exc)) from None
    else:
        title, sections = run_sections(path, round_) if is_run_dir(path) else sweep_sections(path)
    return render(title, sections, path)


def write_report(path: Path, out: Path | None = None, round_: int | None = None) -> Path:
    """Write the report; by default ``<run>/report.html`` or ``<runs dir>/report.html``."""
    html = build_report(path, round_)
    target = Path(out) if out is not None else Path(path) / "report.html"
    write_output(target, html)
    return target


def write_output(target: Path, html: str) -> None:
    """Write a report to ``target``: only into a directory root's alone, itself and every directory
    above it (:class:`dit.trusted.UntrustedPath` otherwise), and never through a link planted at its
    name, for dit runs as root and would overwrite whatever such a link names (issue 46)."""
    write_text(Path(target), html, what="the report's directory")
