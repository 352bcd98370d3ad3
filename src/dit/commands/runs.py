"""``dit validate``, ``run``, ``stop``, ``cleanup`` and ``note``: a scenario checked and run, a running
run stopped, a dead run's journal replayed, a run's note."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from dit import units
from dit.commands.common import (
    RunsRoot,
    err,
    fail,
    load_scenarios,
    out,
    read_run_json,
    trusted_run,
    usable_runs_dir,
)
from dit.run.rundir import (
    DRIVER,
    FINISHED_STATES,
    STATUS,
    RunDir,
    RunDirError,
    read_json,
)
from dit.trusted import UntrustedPath

if TYPE_CHECKING:
    from dit.run.inventory import RunInventory


def validate(scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")]) -> None:
    """Check a scenario against the schema and the semantic rules; print what it expands to."""
    variants = load_scenarios(scenario)
    table = Table(title=f"{scenario}: valid, {len(variants)} run(s)")
    table.add_column("run")
    table.add_column("hash")
    for variant in variants:
        table.add_row(escape(variant.label), variant.hash[:16])
    out.print(table)


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

    variants = load_scenarios(scenario)
    options = RunOptions(
        runs_root=runs_dir,
        inventory=inventory,
        allow_stand_in=stand_in,
        break_stale_lease=break_stale_lease,
        console=err,
    )
    if as_json and not check:
        raise fail("--json: only with --check", 2)
    if inventory is None:  # local mode: a malformed DIT_LOCAL_* fails here, before any run directory
        from dit.run.localmode import check_local_settings

        try:
            check_local_settings()
        except ValueError as exc:
            raise fail(str(exc), 2) from exc
    if check:
        from dit.run.dryrun import print_dry_runs

        raise typer.Exit(print_dry_runs(variants, options, as_json, out))
    usable_runs_dir(runs_dir, "--runs-dir")
    if len(variants) == 1 and not rerun:  # one run: as it always was, no sweep machinery around it
        try:
            results = [Driver(variants[0], options).execute()]
        except (RunDirError, UntrustedPath) as exc:  # its run directory could not be made, no node touched
            raise fail(str(exc)) from None
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


def _driver_to_signal(run: RunDir) -> int | None:
    """The pid of the run's driver if it may be signalled; None: only the STOP file can reach it.

    Refuses a run that is not running, and a driver that is gone: the pid in driver.json may
    name an unrelated process by now (it is compared with the start time and command line the
    driver recorded). A process that matches driver.json but does not hold the run directory open,
    as its driver does, is not signalled: driver.json names it, not the process itself.
    """
    from dit.run.procs import holds_directory, identity_mismatch

    state = read_run_json(run.path / STATUS).get("state") if (run.path / STATUS).exists() else None
    if state != "running":
        raise fail(f"{run.path} is not running (state {state}): nothing to stop")
    info = read_run_json(run.path / DRIVER)
    pid = info.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise fail(f"{run.path / DRIVER}: pid {pid!r} is not a process id")
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
        raise fail(
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


def stop(
    run_dir: Annotated[Path, typer.Argument(help="The run directory of a running run.")],
    wait: Annotated[float, typer.Option(help="Seconds to wait for the teardown to finish.")] = 120.0,
    discard_results: DiscardResults = False,
) -> None:
    """Ask a running driver to stop; it tears down fully before it exits."""
    run = trusted_run(run_dir)
    pid = _driver_to_signal(run)
    try:
        run.request_stop(discard_results)
    except RunDirError as exc:  # a full disk: the signal still reaches a verified driver
        if not pid or discard_results:
            raise fail(str(exc)) from None
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
    raise fail(f"{run_dir}: the driver did not finish within {wait:.0f} s")


def cleanup(
    run_dir: Annotated[Path, typer.Argument(help="A run whose driver died.")],
    discard_results: DiscardResults = False,
) -> None:
    """Undo a run from its journal (e.g. after the driver was killed) and reap its processes.

    Results the nodes still hold are fetched into RUN_DIR/raw/ first; a node's run directory holding
    a file that cannot be fetched is kept, unless --discard-results.
    """
    from dit.run.procs import pid_alive
    from dit.run.teardown import teardown

    run = trusted_run(run_dir)  # its inventory and journal are run as root on the nodes
    from dit.run.sweep import sweep_of

    unit = sweep_of(run.path)
    if unit is not None:  # a variant of a sweep run as one unit: the unit is undone, from its home
        _cleanup_sweep(run, *unit, discard_results=discard_results)
        return
    try:
        info = read_json(run_dir / DRIVER)
        pid = int(info.get("pid", 0))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise fail(f"{run_dir / DRIVER}: unreadable ({exc}); it names the run's driver") from None
    if pid and pid != os.getpid() and pid_alive(pid) and _state_of(run) == "running":
        raise fail(f"the driver of {run_dir} (pid {pid}) is still running: use 'dit stop {run_dir}'")
    error, _ns = teardown(run, _nodes_of(run, "run"), None, discard_results=discard_results)
    if error:
        raise fail(f"cleanup of {run_dir} incomplete: {error}")
    _mark_cleaned_up(run)
    out.print(f"{run_dir}: journal replayed, no process of run {run.run_id} left")


def _cleanup_sweep(run: RunDir, home: RunDir, variants: list[RunDir], *, discard_results: bool) -> None:
    """``dit cleanup`` of any variant of a sweep unit: its home's journal replayed with the newest
    variant's results and conditions (what the nodes hold), every variant left running marked failed."""
    from dit.run.procs import pid_alive
    from dit.run.sweep import sweep_record
    from dit.run.teardown import NodeScope, teardown

    home = trusted_run(home.path)  # its inventory and journal are run as root on the nodes
    record = sweep_record(home)
    pid = record.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and pid_alive(pid) and record.get("state") == "running":
        raise fail(f"the sweep of {run.path} (pid {pid}) is still running: use 'dit stop {home.path}'")
    trusted = [trusted_run(v.path) for v in variants]
    # the newest variant that wrote its metadata.json: its conditions are what the undo may touch, and
    # its raw/ what the nodes' results are compared with and fetched into
    newest = next((v for v in reversed(trusted) if (v.path / "metadata.json").is_file()), home)
    node = NodeScope(home.run_id, home.journal, newest.path / "metadata.json")
    error, _ns = teardown(newest, _nodes_of(home, "sweep"), None, discard_results=discard_results, node=node)
    if error:
        raise fail(f"cleanup of {run.path} (the sweep of {home.path}) incomplete: {error}")
    for variant in trusted:
        _mark_cleaned_up(variant)
    if record.get("state") == "running":
        from dit.run.rundir import write_json

        with contextlib.suppress(OSError):
            write_json(home.path / "sweep.json", {**record, "state": "cleaned up"})
    out.print(
        f"{run.path}: the sweep's journal ({home.journal}) replayed, no process of run {home.run_id} left"
    )


def _nodes_of(run: RunDir, what: str) -> RunInventory:
    """The inventory the run (or the sweep whose home it is) used, or a one-line failure naming its files."""
    from dit.run.inventory import inventory_of

    try:
        return inventory_of(run)
    except Exception as exc:  # any corrupt file behind it: one line, never a traceback
        raise fail(
            f"{run.path}: cannot tell which nodes the {what} used from driver.json, scenario.yaml and "
            f"inventory.yml: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ) from None


def _mark_cleaned_up(run: RunDir) -> None:
    """A run its driver left running (or whose status is unreadable) is recorded failed, cleaned up."""
    if _state_of(run) in ("running", None):
        unwritten = run.try_set_status(state="failed", error="driver died; cleaned up by dit cleanup")
        if unwritten:
            err.print(f"[yellow]warning:[/] not recorded: {escape(unwritten)}", highlight=False)


def _state_of(run: RunDir) -> str | None:
    """The run's state, or None when its status.json cannot be read (it is rewritten then)."""
    try:
        state = run.status().get("state")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return str(state) if state is not None else None


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
        raise fail(f"{run_dir} is not a dit run directory")
    if text is None:
        shown = run.note()
        if shown:
            out.print(escape(shown.rstrip("\n")), highlight=False)
        return
    try:
        run.set_note(sys.stdin.read() if text == "-" else text)
    except (ValueError, RunDirError, UntrustedPath) as exc:
        raise fail(str(exc)) from None
