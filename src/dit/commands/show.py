"""``dit ls`` and ``dit show``: the runs listed, and one run (or a sweep) summarised on the console."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from dit import units
from dit.commands.common import RunsRoot, err, fail, out, read_run_json
from dit.device.printable import printable, printable_lines
from dit.run.console import STAGES as STAGE_ORDER
from dit.run.rundir import (
    DRIVER,
    STATUS,
    NoRunsError,
    RunDir,
    expand_runs,
    find_runs,
    read_json,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from dit.results import Spread


def list_runs(runs_dir: RunsRoot = Path("runs")) -> None:
    """List runs."""
    table = Table(title=str(runs_dir))
    for column in ("scenario", "run", "state", "stage", "wall time"):
        table.add_column(column)
    for run in _listed_runs(runs_dir):
        table.add_row(run.path.parent.name, run.path.name, *_ls_cells(run))
    out.print(table)


def _listed_runs(runs_dir: Path) -> list[RunDir]:
    """Every run directory, also one whose status.json is missing (it is listed as unreadable)."""
    runs = {run.path: run for run in find_runs(runs_dir)}
    for driver in runs_dir.glob(f"*/*/{DRIVER}") if runs_dir.is_dir() else []:
        runs.setdefault(driver.parent.resolve(), RunDir(driver.parent))
    return sorted(runs.values(), key=lambda r: r.path.name)


def _ls_cells(run: RunDir) -> tuple[str, str, str]:
    """State, stage and wall time of a run; ``unreadable`` (and why) when its status.json is not."""
    try:
        status = read_json(run.path / STATUS)
    except OSError as exc:
        return "unreadable", f"status.json: {exc.strerror or exc}", ""
    except ValueError:
        return "unreadable", "status.json: not valid JSON", ""
    stage_ns = status.get("stage_ns") if isinstance(status, dict) else None
    if not isinstance(status, dict) or not _all_numbers(stage_ns or {}):
        return "unreadable", "status.json: not a dit status", ""
    wall = f"{sum(stage_ns.values()) / 1e9:.1f} s" if stage_ns else ""
    return str(status.get("state", "?")), str(status.get("stage") or ""), wall


def _all_numbers(values: Any) -> bool:
    """Whether ``values`` maps names to numbers (the ``*_ns`` fields of status.json)."""
    return isinstance(values, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values.values()
    )


def _ns_field(status: dict[str, Any], key: str, path: Path) -> dict[str, float]:
    """``status[key]`` (e.g. stage_ns), or a one-line error naming the file when it is malformed."""
    values = status.get(key) or {}
    if not _all_numbers(values):
        raise fail(f"{path}: {key} is not a mapping of names to numbers")
    return dict(values)


def _show_dirs(paths: list[Path]) -> list[Path]:
    """The run directories of ``dit show``'s arguments (:func:`dit.run.rundir.expand_runs`)."""
    try:
        return expand_runs(paths)
    except NoRunsError as exc:
        raise fail(str(exc)) from None


def _show_sweep(run_dirs: list[Path]) -> None:
    """Several runs: one line each, then the start lateness per device over them (p99, max)."""
    from dit.analysis.lateness import lateness_over_runs

    per_run: list[dict[str, float]] = []
    runs = Table(title=f"{len(run_dirs)} runs")
    for column in ("run", "state", "worst lateness"):
        runs.add_column(column, justify="right" if column == "worst lateness" else "left")
    for run_dir in run_dirs:
        status = read_run_json(run_dir / STATUS)
        lateness = _ns_field(status, "lateness_ns", run_dir / STATUS)
        per_run.append(lateness)
        worst = units.duration(max(lateness.values())) if lateness else "-"
        runs.add_row(escape(str(status.get("label", run_dir.name))), str(status.get("state")), worst)
    out.print(runs)
    stats = lateness_over_runs(per_run)
    if not stats:
        out.print("no start lateness recorded in these runs")
        return
    late = Table(title=f"start lateness over {len(run_dirs)} runs (p99: nearest rank)")
    for column in ("device", "runs", "median", "p99", "max"):
        late.add_column(column, justify="left" if column == "device" else "right")
    for item in stats:
        late.add_row(
            escape(item.device),
            str(item.runs),
            units.duration(item.median_ns),
            units.duration(item.p99_ns),
            units.duration(item.max_ns),
        )
    out.print(late)


def _show_edge_channel(channel: object) -> None:
    """Frames the edge service refused (status.json ``edge_channel``), or that it ran without a key."""
    from dit.run.collect import edge_channel_warning

    warning = edge_channel_warning(channel)
    if warning:
        out.print(f"[yellow]{escape(printable(warning))}[/]")


def show(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="A run directory; several, or a directory of runs (a sweep, runs/<scenario>): "
            "per-device start lateness over them (p99 and max)."
        ),
    ],
) -> None:
    """Summarise one run (status, stage times, start lateness, phase means, optimum), or several:
    the start lateness of every device over them."""
    from dit.report import labels  # numpy, through the delay model: for this command, not every one

    found = _show_dirs(run_dirs)
    if len(found) > 1:
        _show_sweep(found)
        return
    (run_dir,) = found
    run = RunDir(run_dir)
    status = read_run_json(run.path / STATUS) if (run.path / STATUS).is_file() else {}
    if not status:
        raise fail(f"{run_dir} is not a dit run directory")
    label = escape(str(status.get("label", run_dir.name)))
    out.print(f"[bold]{label}[/]  {status.get('state')}  run id {run.run_id}")
    written = run.note()
    if written:
        out.print(f"[bold]note:[/] {escape(written.rstrip())}", highlight=False)
    outcome = labels.run_outcome(status)  # stopped / refused / failed: what happened, with the error
    if outcome or status.get("error"):
        shown = "\n".join(printable_lines(outcome or str(status["error"])))  # may quote a node's output
        # a stop is the user's choice, not an error: said plainly, with what the run kept
        out.print(escape(shown) if status.get("state") == "stopped" else f"[red]{escape(shown)}[/]")
    kept = labels.kept_text(run.path, status)
    if kept:
        out.print(escape(kept), highlight=False)
    for failed in status.get("degraded") or []:  # device processes that failed (the run is degraded)
        if failed.get("stderr_tail"):
            out.print(
                f"[yellow]{escape(str(failed.get('node')))} {escape(str(failed.get('process')))} stderr:[/]"
            )
            tail = "\n".join(f"  {printable(str(line))}" for line in failed["stderr_tail"])
            out.print(escape(tail), highlight=False)
    _show_edge_channel(status.get("edge_channel"))
    stages = Table(title="stages")
    stages.add_column("stage")
    stages.add_column("wall time", justify="right")
    stage_ns = _ns_field(status, "stage_ns", run.path / STATUS)
    for stage in [s for s in STAGE_ORDER if s in stage_ns] + [s for s in stage_ns if s not in STAGE_ORDER]:
        stages.add_row(stage, units.duration(stage_ns[stage]))
    out.print(stages)
    for stage, why in labels.skipped_stages(status).items():
        out.print(escape(labels.skipped_text(stage, why)))
    lateness = _ns_field(status, "lateness_ns", run.path / STATUS)
    if lateness:
        recorded = status.get("start_wait")
        waits: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        late = Table(title="start lateness")
        late.add_column("device")
        late.add_column("lateness", justify="right")
        late.add_column("wait")
        late.add_column("prepared ahead", justify="right")  # how long it waited, prepared, for the instant
        # how long before the instant the start task reached the node (negative: it came too late)
        late.add_column("start task ahead", justify="right")
        for device, ns in lateness.items():
            entry = waits.get(device)
            wait: dict[str, Any] = entry if isinstance(entry, dict) else {}
            how = " ".join(str(wait[k]) for k in ("policy", "wait") if wait.get(k))
            cells = [
                units.duration(v) if isinstance(v, int) and not isinstance(v, bool) else "-"
                for v in (wait.get("prepared_to_start_ns"), wait.get("start_margin_ns"))
            ]
            late.add_row(device, units.duration(ns), escape(how), *cells)
        out.print(late)
    from dit import results

    summary = run_dir / "aggregate" / "phases_summary.csv"
    if summary.exists():
        import pandas as pd

        try:
            frame = pd.read_csv(summary)
        except (OSError, ValueError) as exc:  # pandas' parser errors are ValueErrors
            raise fail(f"{summary}: not a readable CSV ({exc})") from None
        spreads = _spreads(results.phase_total_spreads, run_dir)
        spread_title = "; total: ± 95 % CI of the mean, p50 / p95 / p99" if spreads else ""
        table = Table(title=f"phases (mean over repetitions{spread_title})")
        for column in frame.columns:
            name = str(column)
            table.add_column(name.removesuffix("_ns"), justify="left" if name == "host" else "right")
        if spreads:
            table.add_column("total p50 / p95 / p99", justify="right")
        for row in frame.to_dict("records"):
            cells = [_phase_cell(str(c), v) for c, v in row.items()]
            key = (str(row.get("host")), _int(row.get("round")), _int(row.get("partition_point")))
            if spreads:
                total = spreads.get(key)
                if total is not None and "total_ns" in row:
                    cells[list(row).index("total_ns")] = total.mean_text()
                cells.append(total.percentiles_text() if total is not None else units.MISSING)
            table.add_row(*cells)
        out.print(table)
    noted = _show_runtime_summary(run_dir / "aggregate" / "summary.json")
    _show_token_spreads(_spreads(results.token_spreads, run_dir))
    _show_network(run_dir / "aggregate" / "netem_check.csv")
    fake_power = labels.fake_power_nodes(run_dir / "aggregate")
    energy_shown = False
    for result in sorted((run_dir / "optimise").glob("*.json")):
        data = read_run_json(result)
        value = data.get("objective_value")
        unit = str(data.get("objective_unit", ""))
        shown = units.with_unit(value, unit) if isinstance(value, (int, float)) else str(value)
        # an energy optimum over a fake sensor's power is a model's number: say so on the same line
        fake = ""
        if fake_power and data.get("objective") in labels.ENERGY_OBJECTIVES:
            fake, energy_shown = f" [yellow]({labels.MODELLED})[/]", True
        out.print(f"optimise {escape(result.stem)}: vector {data.get('vector')} objective {shown}{fake}")
    if energy_shown and not noted:  # said once, under the first figure it explains
        out.print(f"[yellow]{escape(labels.fake_sensor_note(fake_power))}[/]")


def _show_runtime_summary(path: Path) -> bool:
    """The runtime's summary values (``aggregate/summary.json``), each in its unit at a readable scale;
    True when it said that some of them a fake sensor gave (modelled)."""
    if not path.is_file():
        return False
    doc = read_run_json(path)
    values = [v for v in doc.get("values") or [] if isinstance(v, dict) and "name" in v]
    if not values:
        return False
    from dit.report import labels

    fake = labels.fake_power_nodes(path.parent)
    table = Table(title=f"runtime {escape(str(doc.get('runtime', '?')))}")
    table.add_column("name")
    table.add_column("value", justify="right")
    table.add_column("what")
    modelled = False
    for value in values:
        unit = str(value.get("unit", ""))
        tag = labels.modelled_tag(unit, fake)  # a fake sensor's energy is a model's number: said on its row
        modelled = modelled or bool(tag)
        shown = units.with_unit(value.get("value"), unit) + tag
        table.add_row(escape(str(value["name"])), escape(shown), escape(str(value.get("description", ""))))
    out.print(table)
    if modelled:
        out.print(f"[yellow]{escape(labels.fake_sensor_note(fake))}[/]")
    return modelled


_K = TypeVar("_K")


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else -1


def _spreads(of: Callable[[Path], dict[_K, Spread]], run_dir: Path) -> dict[_K, Spread]:
    """The spreads ``of`` finds in the run; none when its files cannot be read (shown without)."""
    from dit.analysis.run import AggregateError

    try:
        return of(run_dir)
    except AggregateError as exc:
        err.print(f"[yellow]warning:[/] no spread: {escape(str(exc))}", highlight=False)
        return {}


def _show_token_spreads(spreads: dict[str, Spread]) -> None:
    """The decode tokens' latency per host: mean ± 95 % CI, p50 / p95 / p99 (dit.results)."""
    if not spreads:
        return
    table = Table(title="decode token latency (prefill left out; mean ± 95 % CI)")
    for column in ("host", "tokens", "mean", "p50 / p95 / p99"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for host, s in spreads.items():
        table.add_row(escape(host), str(s.n), s.mean_text(), s.percentiles_text())
    out.print(table)


def _show_network(path: Path) -> None:
    """The network self-check per link: which backend applied it, intended vs measured, pass."""
    if not path.is_file():
        return
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise fail(f"{path}: not a readable CSV ({exc})") from None
    if frame.empty:
        return
    table = Table(title="network self-check")
    for column in (
        "device",
        "target",
        "backend",
        "shaping",
        "intended",
        "measured - baseline",
        "pass",
        "emulator",
    ):
        table.add_column(column, justify="right" if column in ("intended", "measured - baseline") else "left")

    def cell(value: Any) -> str:
        return "-" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)

    for row in frame.to_dict("records"):
        measured, baseline = row.get("measured_rtt_ms"), row.get("baseline_rtt_ms")
        added = (
            None
            if measured is None or pd.isna(measured)
            else measured - (0 if pd.isna(baseline) else baseline)
        )
        table.add_row(
            escape(cell(row.get("device"))), escape(cell(row.get("target"))),
            escape(cell(row.get("backend") or "netem")), escape(cell(row.get("shaping"))),
            f"{row.get('intended_delay_ms', 0):.2f} ms", "-" if added is None else f"{added:.2f} ms",
            cell(row.get("pass")), escape(cell(row.get("emulator"))),
        )  # fmt: skip
    out.print(table)


def _phase_cell(column: str, value: Any) -> str:
    if isinstance(value, (int, float)) and column.endswith("_ns"):
        return units.duration(value)
    if isinstance(value, (int, float)) and column.endswith("_bytes"):
        return units.size(value)
    if isinstance(value, float):
        return units.MISSING if math.isnan(value) else f"{value:.3g}"
    return str(value)
