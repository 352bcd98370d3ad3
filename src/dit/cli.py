"""The ``dit`` command: validate, run, stop, cleanup, ls, show, note, report, export, optimise, simulate,
reproduce, web, and the groups rack and runtimes."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dit import units
from dit.device.printable import printable, printable_lines
from dit.rack.cli import rack_app
from dit.report import labels
from dit.run.console import STAGES as STAGE_ORDER
from dit.run.rundir import (
    DRIVER,
    FINISHED_STATES,
    STATUS,
    NoRunsError,
    RunDir,
    RunDirError,
    check_writable,
    expand_runs,
    find_runs,
    read_json,
)
from dit.trusted import UntrustedPath

if TYPE_CHECKING:
    from collections.abc import Callable

    from dit.results import Spread
    from dit.scenario import Scenario

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="dit - the Distributed Inference Testbed. One YAML scenario, seven stages, repeatable measurements.",
)
app.add_typer(rack_app, name="rack")
# Piped output (CI logs, files) gets wide tables instead of labels folded over several lines.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

RunsRoot = Annotated[
    Path, typer.Option("--runs-dir", envvar="DIT_RUNS_DIR", help="Where run directories are created.")
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _load(path: Path) -> list[Scenario]:
    from dit.scenario import ScenarioError, load

    try:
        return list(load(path))
    except ScenarioError as exc:
        for error in exc.errors:
            err.print(f"[red]{escape(str(path))}:[/] {escape(str(error))}", highlight=False)
        raise typer.Exit(2) from None
    except OSError as exc:
        raise _fail(f"{path}: {exc.strerror or exc}", 2) from None


@app.command()
def validate(scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")]) -> None:
    """Check a scenario against the schema and the semantic rules; print what it expands to."""
    variants = _load(scenario)
    table = Table(title=f"{scenario}: valid, {len(variants)} run(s)")
    table.add_column("run")
    table.add_column("hash")
    for variant in variants:
        table.add_row(escape(variant.label), variant.hash[:16])
    out.print(table)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    inventory: Annotated[
        str | None, typer.Option("-i", "--inventory", help="Run on real hosts (groups 'edge' and 'devices').")
    ] = None,
    runs_dir: RunsRoot = Path("runs"),
    stand_in: Annotated[
        bool,
        typer.Option(help="Local mode: let the fake model stand in for a model whose framework is missing."),
    ] = True,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Dry run: preflight and apply in check mode; print what would change, change nothing.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --check: print the report as JSON.")] = False,
    break_stale_lease: Annotated[
        bool,
        typer.Option(
            "--break-stale-lease",
            help="Take over a node whose lease holder is gone (its driver died on this machine) or ran "
            "on another controller host (cannot be checked from here). A live holder is never broken.",
        ),
    ] = False,
    rerun: Annotated[
        bool,
        typer.Option(
            "--rerun",
            help="Run every sweep variant again, also one already completed under the same scenario hash.",
        ),
    ] = False,
) -> None:
    """Run a scenario (every sweep variant, one run directory each). Local mode without -i.

    A sweep runs as one unit on its nodes (docs/sweeps.md): one preflight, each variant's conditions
    applied as the difference from the previous one, one teardown; a variant already completed under
    the runs directory with the same scenario hash is not run again (--rerun runs it).
    Preflight leases every node to this run; a node another run holds is refused, naming the holder.
    """
    from dit.run.driver import Driver, RunOptions

    variants = _load(scenario)
    options = RunOptions(
        runs_root=runs_dir,
        inventory=inventory,
        allow_stand_in=stand_in,
        break_stale_lease=break_stale_lease,
        console=err,
    )
    if as_json and not check:
        raise _fail("--json: only with --check", 2)
    if inventory is None:  # local mode: a malformed DIT_LOCAL_* fails here, before any run directory
        from dit.run.localmode import check_local_settings

        try:
            check_local_settings()
        except ValueError as exc:
            raise _fail(str(exc), 2) from exc
    if check:
        from dit.run.dryrun import print_dry_runs

        raise typer.Exit(print_dry_runs(variants, options, as_json, out))
    _usable_runs_dir(runs_dir, "--runs-dir")
    if len(variants) == 1 and not rerun:  # one run: as it always was, no sweep machinery around it
        try:
            results = [Driver(variants[0], options).execute()]
        except (RunDirError, UntrustedPath) as exc:  # its run directory could not be made, no node touched
            raise _fail(str(exc)) from None
        outcomes = None
    else:
        from dit.run.sweep import driver_runner, run_sweep

        outcomes = run_sweep(variants, runs_dir, err, driver_runner(options), rerun=rerun, what="run")
        results = [o.result for o in outcomes if o.result is not None]
    table = Table(title="runs")
    for column in ("run", "state", "directory", "wall time", "optimum", "objective"):
        table.add_column(column)
    for result in results:
        optimum = result.optimum or {}
        objective = optimum.get("objective_value")
        table.add_row(
            escape(result.label),
            result.state,
            str(result.run_dir),
            f"{sum(result.stage_ns.values()) / 1e9:.1f} s",
            str(optimum.get("vector", "")),
            units.with_unit(objective, str(optimum.get("objective_unit", "")))
            if isinstance(objective, (int, float))
            else "",
        )
    for outcome in outcomes or []:
        if outcome.result is None:  # resumed (already finished), not run, or no run directory
            state = "completed (earlier run)" if outcome.reused else outcome.state
            table.add_row(
                escape(outcome.label), state, str(outcome.run_dir or escape(outcome.error or "")), "", "", ""
            )
    out.print(table)
    states = [r.state for r in results] + [
        o.state for o in outcomes or [] if o.result is None and not o.reused
    ]
    if any(state != "completed" for state in states):
        raise typer.Exit(1)


def _usable_runs_dir(path: Path, option: str) -> None:
    """Refuse, before anything starts, a runs directory this process cannot write (read-only, full) or
    one another user owns or could write, itself or a directory above it: they could swap a run
    directory, its inventory included, for theirs while root runs it (issue 46)."""
    try:
        check_writable(path, what=option)
    except RunDirError as exc:
        raise _fail(f"{option}: {exc}", 2) from None
    except UntrustedPath as exc:
        raise _fail(str(exc), 2) from None


def _read_run_json(path: Path) -> dict[str, Any]:
    """A run's JSON file (status.json, driver.json, ...) as a mapping; one-line error if it is not."""
    try:
        data = read_json(path)
    except OSError as exc:
        raise _fail(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise _fail(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _fail(f"{path}: not a JSON object")
    return data


def _trusted_run(run_dir: Path) -> RunDir:
    """``run_dir`` as a run whose files dit may act on as root (its identity, inventory, journal), or
    a one-line refusal naming it: the directory and every one above it must be root's alone, or
    another user could have written them (issue 46)."""
    run = RunDir(run_dir)
    try:
        run.check_trusted()
    except UntrustedPath as exc:
        raise _fail(str(exc), 2) from None
    except (FileNotFoundError, NotADirectoryError):
        raise _fail(f"{run_dir} is not a dit run directory") from None
    if not (run.path / DRIVER).exists():
        raise _fail(f"{run_dir} is not a dit run directory")
    return run


def _driver_to_signal(run: RunDir) -> int | None:
    """The pid of the run's driver if it may be signalled; None: only the STOP file can reach it.

    Refuses a run that is not running, and a driver that is gone: the pid in driver.json may
    name an unrelated process by now (it is compared with the start time and command line the
    driver recorded). A process that matches driver.json but does not hold the run directory open,
    as its driver does, is not signalled: driver.json names it, not the process itself.
    """
    from dit.run.procs import holds_directory, identity_mismatch

    state = _read_run_json(run.path / STATUS).get("state") if (run.path / STATUS).exists() else None
    if state != "running":
        raise _fail(f"{run.path} is not running (state {state}): nothing to stop")
    info = _read_run_json(run.path / DRIVER)
    pid = info.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise _fail(f"{run.path / DRIVER}: pid {pid!r} is not a process id")
    if info.get("host") != platform.node():
        err.print(
            f"[yellow]warning:[/] the driver runs on {escape(str(info.get('host')))}, not here: "
            "asking it to stop with the STOP file only",
            highlight=False,
        )
        return None
    if "pid_create_time" not in info:
        err.print(
            "[yellow]warning:[/] driver.json does not record the driver's start time (an older dit): "
            f"pid {pid} cannot be verified, asking it to stop with the STOP file only",
            highlight=False,
        )
        return None
    reason = identity_mismatch(pid, info)
    if reason is not None:
        raise _fail(
            f"the driver of {run.path} is gone ({reason}) although its status says running: "
            f"use 'dit cleanup {run.path}'"
        )
    if not holds_directory(pid, run.path):
        err.print(
            f"[yellow]warning:[/] pid {pid} does not hold {escape(str(run.path))} open as the run's driver "
            "does, so it is not that driver whatever driver.json says: asking the run to stop with the "
            "STOP file only",
            highlight=False,
        )
        return None
    return pid


DiscardResults = Annotated[
    bool,
    typer.Option(
        "--discard-results",
        help="Delete the nodes' results that cannot be fetched into RUN_DIR/raw/ with their run directory "
        "(by default such a directory is kept and named).",
    ),
]


@app.command()
def stop(
    run_dir: Annotated[Path, typer.Argument(help="The run directory of a running run.")],
    wait: Annotated[float, typer.Option(help="Seconds to wait for the teardown to finish.")] = 120.0,
    discard_results: DiscardResults = False,
) -> None:
    """Ask a running driver to stop; it tears down fully before it exits."""
    run = _trusted_run(run_dir)
    pid = _driver_to_signal(run)
    try:
        run.request_stop(discard_results)
    except RunDirError as exc:  # a full disk: the signal still reaches a verified driver
        if not pid or discard_results:
            raise _fail(str(exc)) from None
        err.print(
            f"[yellow]warning:[/] {escape(str(exc))}: stopping the driver by its signal only", highlight=False
        )
    from dit.run.procs import pid_alive

    if pid:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        state = run.status().get("state")
        if state in FINISHED_STATES and not (pid and pid_alive(pid)):
            out.print(f"{run_dir}: {state}")
            return
        time.sleep(0.2)
    raise _fail(f"{run_dir}: the driver did not finish within {wait:.0f} s")


@app.command()
def cleanup(
    run_dir: Annotated[Path, typer.Argument(help="A run whose driver died.")],
    discard_results: DiscardResults = False,
) -> None:
    """Undo a run from its journal (e.g. after the driver was killed) and reap its processes.

    Results the nodes still hold are fetched into RUN_DIR/raw/ first; a node's run directory holding
    a file that cannot be fetched is kept, unless --discard-results.
    """
    from dit.run.inventory import inventory_of
    from dit.run.procs import pid_alive
    from dit.run.teardown import teardown

    run = _trusted_run(run_dir)  # its inventory and journal are run as root on the nodes
    from dit.run.sweep import sweep_of

    unit = sweep_of(run.path)
    if unit is not None:  # a variant of a sweep run as one unit: the unit is undone, from its home
        _cleanup_sweep(run, *unit, discard_results=discard_results)
        return
    try:
        info = read_json(run_dir / DRIVER)
        pid = int(info.get("pid", 0))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise _fail(f"{run_dir / DRIVER}: unreadable ({exc}); it names the run's driver") from None
    if pid and pid != os.getpid() and pid_alive(pid) and _state_of(run) == "running":
        raise _fail(f"the driver of {run_dir} (pid {pid}) is still running: use 'dit stop {run_dir}'")
    try:
        inventory = inventory_of(run)
    except Exception as exc:  # any corrupt file behind it: one line, never a traceback
        raise _fail(
            f"{run_dir}: cannot tell which nodes the run used from driver.json, scenario.yaml and "
            f"inventory.yml: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ) from None
    error, _ns = teardown(run, inventory, None, discard_results=discard_results)
    if error:
        raise _fail(f"cleanup of {run_dir} incomplete: {error}")
    if _state_of(run) in ("running", None):
        unwritten = run.try_set_status(state="failed", error="driver died; cleaned up by dit cleanup")
        if unwritten:
            err.print(f"[yellow]warning:[/] not recorded: {escape(unwritten)}", highlight=False)
    out.print(f"{run_dir}: journal replayed, no process of run {run.run_id} left")


def _cleanup_sweep(run: RunDir, home: RunDir, variants: list[RunDir], *, discard_results: bool) -> None:
    """``dit cleanup`` of any variant of a sweep unit: its home's journal replayed with the newest
    variant's results and conditions (what the nodes hold), every variant left running marked failed."""
    from dit.run.inventory import inventory_of
    from dit.run.procs import pid_alive
    from dit.run.sweep import sweep_record
    from dit.run.teardown import NodeScope, teardown

    home = _trusted_run(home.path)  # its inventory and journal are run as root on the nodes
    record = sweep_record(home)
    pid = record.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and pid_alive(pid) and record.get("state") == "running":
        raise _fail(f"the sweep of {run.path} (pid {pid}) is still running: use 'dit stop {home.path}'")
    trusted = [_trusted_run(v.path) for v in variants]
    # the newest variant that wrote its metadata.json: its conditions are what the undo may touch, and
    # its raw/ what the nodes' results are compared with and fetched into
    newest = next((v for v in reversed(trusted) if (v.path / "metadata.json").is_file()), home)
    try:
        inventory = inventory_of(home)
    except Exception as exc:  # any corrupt file behind it: one line, never a traceback
        raise _fail(
            f"{home.path}: cannot tell which nodes the sweep used from driver.json, scenario.yaml and "
            f"inventory.yml: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ) from None
    node = NodeScope(home.run_id, home.journal, newest.path / "metadata.json")
    error, _ns = teardown(newest, inventory, None, discard_results=discard_results, node=node)
    if error:
        raise _fail(f"cleanup of {run.path} (the sweep of {home.path}) incomplete: {error}")
    for variant in trusted:
        if _state_of(variant) in ("running", None):
            unwritten = variant.try_set_status(state="failed", error="driver died; cleaned up by dit cleanup")
            if unwritten:
                err.print(f"[yellow]warning:[/] not recorded: {escape(unwritten)}", highlight=False)
    if record.get("state") == "running":
        from dit.run.rundir import write_json

        with contextlib.suppress(OSError):
            write_json(home.path / "sweep.json", {**record, "state": "cleaned up"})
    out.print(
        f"{run.path}: the sweep's journal ({home.journal}) replayed, no process of run {home.run_id} left"
    )


def _state_of(run: RunDir) -> str | None:
    """The run's state, or None when its status.json cannot be read (it is rewritten then)."""
    try:
        state = run.status().get("state")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return str(state) if state is not None else None


@app.command("ls")
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
        raise _fail(f"{path}: {key} is not a mapping of names to numbers")
    return dict(values)


def _show_dirs(paths: list[Path]) -> list[Path]:
    """The run directories of ``dit show``'s arguments (:func:`dit.run.rundir.expand_runs`)."""
    try:
        return expand_runs(paths)
    except NoRunsError as exc:
        raise _fail(str(exc)) from None


def _show_sweep(run_dirs: list[Path]) -> None:
    """Several runs: one line each, then the start lateness per device over them (p99, max)."""
    from dit.analysis.lateness import lateness_over_runs

    per_run: list[dict[str, float]] = []
    runs = Table(title=f"{len(run_dirs)} runs")
    for column in ("run", "state", "worst lateness"):
        runs.add_column(column, justify="right" if column == "worst lateness" else "left")
    for run_dir in run_dirs:
        status = _read_run_json(run_dir / STATUS)
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


@app.command()
def note(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    text: Annotated[
        str | None,
        typer.Argument(help="The note (a lab notebook entry); '' removes it; '-' reads it from stdin."),
    ] = None,
) -> None:
    """Print a run's note, or set it: shown by dit show, dit report and NNPM (note.md in the run)."""
    run = RunDir(run_dir)
    if not (run.path / STATUS).is_file():
        raise _fail(f"{run_dir} is not a dit run directory")
    if text is None:
        shown = run.note()
        if shown:
            out.print(escape(shown.rstrip("\n")), highlight=False)
        return
    try:
        run.set_note(sys.stdin.read() if text == "-" else text)
    except (ValueError, RunDirError, UntrustedPath) as exc:
        raise _fail(str(exc)) from None


def _show_edge_channel(channel: object) -> None:
    """Frames the edge service refused (status.json ``edge_channel``), or that it ran without a key."""
    from dit.run.collect import edge_channel_warning

    warning = edge_channel_warning(channel)
    if warning:
        out.print(f"[yellow]{escape(printable(warning))}[/]")


@app.command()
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
    found = _show_dirs(run_dirs)
    if len(found) > 1:
        _show_sweep(found)
        return
    (run_dir,) = found
    run = RunDir(run_dir)
    status = _read_run_json(run.path / STATUS) if (run.path / STATUS).is_file() else {}
    if not status:
        raise _fail(f"{run_dir} is not a dit run directory")
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
            raise _fail(f"{summary}: not a readable CSV ({exc})") from None
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
        data = _read_run_json(result)
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
    doc = _read_run_json(path)
    values = [v for v in doc.get("values") or [] if isinstance(v, dict) and "name" in v]
    if not values:
        return False
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
        raise _fail(f"{path}: not a readable CSV ({exc})") from None
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


@app.command()
def report(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="A run directory, or a directory of runs (a sweep); several run directories: "
            "one comparison, the runs side by side."
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="HTML file (default: PATH/report.html; for a comparison, compare.html here).",
        ),
    ] = None,
    round_: Annotated[
        int | None,
        typer.Option("--round", help="Inference round of the phase timeline (default: the first)."),
    ] = None,
) -> None:
    """One self-contained HTML report of a run, of a sweep's runs, or of several runs side by side
    (docs/report.md)."""
    from dit.report.build import ReportError, write_output, write_report
    from dit.report.compare import CompareError, build_comparison

    try:
        if len(paths) == 1:
            target = write_report(paths[0], output, round_)
        else:
            if round_ is not None:
                raise _fail("--round: a comparison has no phase timeline; leave it out")
            target = output or Path("compare.html")
            write_output(target, build_comparison(paths))
    except (ReportError, CompareError, UntrustedPath) as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot write the report: {exc.strerror or exc}") from None
    out.print(f"report: {target}")


@app.command("export")
def export_runs(
    paths: Annotated[
        list[Path], typer.Argument(help="Run directories, or directories of runs (a sweep, runs/<scenario>).")
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write one file per table into.")],
    fmt: Annotated[str, typer.Option("--format", help="csv, or parquet (needs pyarrow).")] = "csv",
    all_values: Annotated[
        bool,
        typer.Option(
            "--all-scenario-values", help="Every scenario value as a column, not only those that differ."
        ),
    ] = False,
) -> None:
    """Write the runs' tables (phases, layers, tokens, monitors, energy, netem, summary, runs), one file
    each, with every run's identity and scenario values as columns (docs/results.md)."""
    from dit import results
    from dit.analysis.run import AggregateError

    try:
        loaded = results.load(paths, "all" if all_values else "varying")
        written = results.export(loaded, out_dir, fmt)
    except (NoRunsError, AggregateError, ValueError) as exc:
        raise _fail(str(exc), 2) from None
    except OSError as exc:
        raise _fail(f"cannot write {out_dir}: {exc.strerror or exc}") from None
    out.print(
        f"{len(loaded.run_dirs)} run(s) -> {escape(str(out_dir))}: {', '.join(p.name for p in written)}"
    )


@app.command()
def optimise(
    run_dir: Annotated[Path, typer.Argument(help="A finished run (or a directory with the three files).")],
    algorithm: Annotated[str | None, typer.Option(help="Registered optimiser (dit.optimisers).")] = None,
    objective: Annotated[str | None, typer.Option(help="total_delay, variance, energy or edp.")] = None,
    policy: Annotated[str | None, typer.Option(help="RR or SJF.")] = None,
    vector: Annotated[str | None, typer.Option(help="Evaluate this vector, e.g. 2,4,8,11.")] = None,
    max_vectors: Annotated[
        int, typer.Option(help="Exhaustive search refuses more vectors than this.")
    ] = 5_000_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Search (or evaluate) partition vectors on a run's aggregate files under the delay model."""
    from dit.analysis.run import AggregateError
    from dit.optimise import OptimiseError
    from dit.optimise.api import optimise_run

    parsed: list[int] | None = None
    if vector is not None:
        try:
            parsed = [int(v) for v in vector.split(",")]
        except ValueError:
            raise _fail(f"--vector: {vector!r} is not a comma-separated list of integers", 2) from None
    try:
        result = optimise_run(run_dir, algorithm, objective, policy, parsed, max_vectors=max_vectors)
    except (OptimiseError, AggregateError, UntrustedPath) as exc:  # it writes into RUN_DIR/optimise
        raise _fail(str(exc), 2) from None
    if as_json:
        out.print_json(result.to_json())
    else:
        out.print(result.render_table())


@app.command()
def simulate(
    spec: Annotated[Path | None, typer.Argument(help="A simulation file (scenarios/sim/*.yaml).")] = None,
    replay: Annotated[
        Path | None,
        typer.Option("--replay", help="A finished HeadSplit run: simulate it beside its measurements."),
    ] = None,
    placement: Annotated[
        str | None,
        typer.Option(
            help="layerwise, roundrobin, greedy or galaxy, or several comma-separated (each simulated): "
            "overrides the file's placement."
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="With --replay: fit the per-call cost on this other run (a prediction, not a fit)."
        ),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="With --replay: a profile run (layers runtime, aggregate/heads.csv) whose per-kind "
            "rates (head, projection, FFN) cost the units."
        ),
    ] = None,
    rates: Annotated[
        str,
        typer.Option(
            help="With --replay: the compute rates, auto (a profile's when there is one, else the run's "
            "own compute times), profile, compute, benchmark (HeadSplit's start-up flops_per_s) or trace "
            "(each decode token at the speed the replayed run computed it)."
        ),
    ] = "auto",
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Also write the result to this directory (simulation.json, tokens.csv, memory.csv), "
            "for `dit report DIR`.",
        ),
    ] = None,
    fit_article: Annotated[
        bool,
        typer.Option(
            "--fit-article",
            help="Fit the article's rack to its Chapter 6 figures (board rate, heads' rate, one-way "
            "latency, per-call cost; minutes) and print the fit, its residuals and the added-RTT sweep.",
        ),
    ] = False,
    one_rate: Annotated[
        bool,
        typer.Option(
            "--one-rate",
            help="With --fit-article: one rate for every unit, fitted to the three times alone.",
        ),
    ] = False,
    write: Annotated[
        Path | None,
        typer.Option(help="With --fit-article: write the fitted simulation file here."),
    ] = None,
) -> None:
    """Simulate decoder generation over heterogeneous devices (HeadSplit's placements), or replay a run."""
    if fit_article:
        if spec is not None or replay is not None or placement is not None or out_dir is not None:
            raise _fail("--fit-article fits the article's own rack: leave out the file, --replay, "
                        "--placement and --out", 2)  # fmt: skip
        _fit_article(one_rate, write)
        return
    if one_rate or write is not None:
        raise _fail("--one-rate and --write go with --fit-article", 2)
    if (spec is None) == (replay is None):
        raise _fail("give either a simulation file or --replay RUN_DIR", 2)
    if replay is not None and placement is not None:
        raise _fail("--placement: a replay simulates the run's own placement; leave it out", 2)
    if replay is None and (calibration is not None or profile is not None):
        raise _fail("--calibration and --profile go with --replay RUN_DIR", 2)
    try:
        from dit.sim import output as sim_output
        from dit.sim.cli import format_result, run_placements
        from dit.sim.engine import SimError
        from dit.sim.replay import format_replay
        from dit.sim.replay import replay as replay_run
    except ImportError as exc:
        raise _fail(f"dit simulate needs the sim extra (pip install 'dit[sim]'): {exc}", 2) from None
    try:
        if replay is not None:
            replayed = replay_run(replay, calibration, profile, rates)
            out.print(format_replay(replayed), highlight=False)
        else:
            assert spec is not None
            runs = run_placements(spec, placement)
            for run in runs:
                if len(runs) > 1:
                    out.print(f"placement {run.placement}", highlight=False)
                assert run.wall_s is not None
                out.print(format_result(run.result, run.wall_s), highlight=False)
    except SimError as exc:
        raise _fail(str(exc), 2) from None
    if out_dir is None:
        return
    try:
        if replay is not None:
            sim_output.write_replay(out_dir, replayed, replay, calibration)
        else:
            assert spec is not None
            sim_output.write(out_dir, runs, source=spec)
    except OSError as exc:
        raise _fail(f"--out: cannot write {out_dir}: {exc.strerror or exc}", 2) from None
    out.print(f"result: {out_dir} (dit report {out_dir})", highlight=False)


def _fit_article(one_rate: bool, write: Path | None) -> None:
    try:
        from dit.sim.fit import Rack, fit, fitted_yaml, format_fit, format_sweep, sweep
    except ImportError as exc:
        raise _fail(f"dit simulate needs the sim extra (pip install 'dit[sim]'): {exc}", 2) from None
    fitted = fit(Rack(), attention_rate=not one_rate)
    out.print(format_fit(fitted), highlight=False)
    out.print("", highlight=False)
    out.print(format_sweep(sweep(fitted.board, fitted.rack)), highlight=False)
    if write is not None:
        try:
            write.write_text(fitted_yaml(fitted), encoding="utf-8")
        except OSError as exc:
            raise _fail(f"--write: cannot write {write}: {exc.strerror or exc}", 2) from None
        out.print(f"written: {write}", highlight=False)


@app.command()
def reproduce(
    chapter: Annotated[str, typer.Argument(help="ch4, ch5 or ch6.")],
    where: Annotated[
        str,
        typer.Option(
            help="local (local mode), rack (the emulated rack, `dit rack up`) or an inventory path."
        ),
    ] = "local",
    size: Annotated[
        str, typer.Option(help="quick (minutes on a small machine) or full (the article's).")
    ] = "quick",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Where runs and the report go.")] = None,
) -> None:
    """Reproduce a chapter's results: run it (resuming) and write one report beside the article's figures."""
    from dit.reproduce.chapters import CHAPTERS, SIZES, ChapterError, default_out
    from dit.reproduce.report import reproduce as run_chapter

    if chapter not in CHAPTERS:
        raise _fail(f"CHAPTER: {chapter!r} is not one of {', '.join(CHAPTERS)}", 2)
    if size not in SIZES:
        raise _fail(f"--size: {size!r} is not one of {', '.join(SIZES)}", 2)
    inventory, where_label, shared = _reproduce_where(where, chapter)
    target = out_dir if out_dir is not None else default_out(chapter)
    _usable_runs_dir(target / "runs", "--out")  # its finished runs are reused, its report written
    try:
        report_path = run_chapter(chapter, size, target, inventory, where_label, err, shared_machine=shared)
    except (ChapterError, UntrustedPath) as exc:
        raise _fail(str(exc), 2) from None
    out.print(f"report: {report_path}", highlight=False)


def _reproduce_where(where: str, chapter: str) -> tuple[str | None, str, bool]:
    """(inventory or None for local mode, the words the report uses, whether every node shares this
    machine's cores). The emulated rack is the one in ``DIT_RACK_DIR`` (as for ``dit rack``), else the
    default state dir; Chapter 6 (parallel strategies side by side) refuses a rack whose devices'
    quotas exceed the CPUs they share, before anything runs."""
    if where == "local":
        if (message := _local_settings_error()) is not None:
            raise _fail(message, 2)
        return None, "local mode", True
    if where == "rack":
        from dit.rack import DEFAULT_STATE_DIR
        from dit.rack.executor import status as rack_status
        from dit.rack.plan import RackError, RackSpec

        state_dir = Path(os.environ.get("DIT_RACK_DIR") or DEFAULT_STATE_DIR)
        try:
            state, _ = rack_status(state_dir.resolve())
        except RackError as exc:
            raise _fail(
                f"--where rack: no emulated rack is up ({exc}); start one with `dit rack up`", 2
            ) from None
        try:
            spec = RackSpec.recorded(state.get("spec", {}))
        except RackError as exc:
            raise _fail(f"--where rack: {state_dir}/{exc}", 2) from None
        if chapter == "ch6" and (refusal := spec.quota_refusal()) is not None:
            raise _fail(f"--where rack: {refusal}", 2)
        label = (
            f"the emulated rack ({state['inventory']}: {spec.devices} devices x {spec.cpu_share_pct} % of "
            f"CPU {spec.cpus}, {spec.memory_mb} MiB each)"
        )
        # Chapter 6 runs only on a rack whose quotas fit: each device's capacity is its own there
        return str(state["inventory"]), label, chapter != "ch6"
    if not Path(where).exists():
        raise _fail(f"--where: {where!r} is not local, rack or an existing inventory path", 2)
    return where, f"the hosts of {where}", False


def _local_settings_error() -> str | None:
    from dit.run.localmode import check_local_settings

    try:
        check_local_settings()
    except ValueError as exc:
        return str(exc)
    return None


@app.command()
def web(
    host: Annotated[
        str, typer.Option(help="Address to bind; anything but loopback is reachable from the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
    inventory: Annotated[
        Path,
        typer.Option("-i", "--inventory", help="The NNPM-managed YAML inventory (created on first save)."),
    ] = Path("inventories/nnpm.yml"),
    runs_dir: RunsRoot = Path("runs"),
    scenarios_dir: Annotated[Path, typer.Option(help="Scenario YAML files offered in the dialogs.")] = Path(
        "scenarios"
    ),
    tiles: Annotated[
        str | None,
        typer.Option(
            help="A tile layer for a world map: an http(s) URL template ({z}/{x}/{y}), a local tile "
            "directory (z/x/y.png) or an .mbtiles file, served by NNPM. Without it the map is a floor plan."
        ),
    ] = None,
    tiles_attribution: Annotated[
        str, typer.Option(help="The credit shown with the tiles.")
    ] = "© OpenStreetMap contributors",
    probe: Annotated[str, typer.Option(help="Node probe: auto, ping, tcp (SSH port) or off.")] = "auto",
    no_token: Annotated[
        bool,
        typer.Option(
            "--no-token",
            help="Loopback only, for a single-user machine: no token, so every local user can drive NNPM "
            "with its rights (root, when run as root).",
        ),
    ] = False,
) -> None:
    """NNPM, the web manager: nodes on a map, scenario dialogs, runs, live terminal (FastAPI + uvicorn).

    Every request needs a token: a random one per start, printed in the URL to open, or the value of
    DIT_NNPM_TOKEN (an environment variable, not an option: other users can read a command line).
    """
    try:
        from dit.web.app import serve
        from dit.web.config import WebConfig
        from dit.web.security import TOKEN_ENV
    except ImportError as exc:
        raise _fail(f"dit web needs the web extra: pip install 'dit[web]' ({exc})") from None
    if probe not in ("auto", "ping", "tcp", "off"):
        raise _fail(f"--probe: {probe!r} is not one of auto, ping, tcp, off", 2)
    from dit.web.routes.nodes import check_tiles

    problem = check_tiles(tiles)
    if problem:
        raise _fail(f"--tiles: {problem}", 2)
    config = WebConfig(
        host=host,
        port=port,
        inventory=inventory,
        runs_dir=runs_dir,
        scenarios_dir=scenarios_dir,
        tiles=tiles,
        tiles_attribution=tiles_attribution,
        probe=probe,
        token=os.environ.get(TOKEN_ENV),
        no_token=no_token,
    )
    try:
        config.ensure_token()
    except ValueError as exc:
        raise _fail(str(exc), 2) from None
    _usable_runs_dir(runs_dir, "--runs-dir")  # NNPM starts, stops and tags runs there as root
    serve(config)


def _add_runtimes() -> None:
    from dit.runtime_ops.cli import app as runtimes_app

    app.add_typer(runtimes_app, name="runtimes")


_add_runtimes()

if __name__ == "__main__":
    app()
