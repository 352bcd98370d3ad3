"""Run a chapter's variants into ``<out>/runs``, skipping each one already finished there.

A variant is finished when a run directory under ``<out>/runs`` holds the same scenario hash (the
sha256 of the resolved scenario, ``metadata.json``) and ended ``completed`` or ``degraded``: its results
are all there. A failed or stopped run is run again, and so is one in a directory another user owns or
could write (its files could be theirs, reported as measured). A progress bar shows the variants done and
an ETA.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dit.run.rundir import RunDir, find_runs, read_json_object
from dit.scenario import Scenario
from dit.trusted import UntrustedPath

DONE_STATES: Final = frozenset({"completed", "degraded"})


@dataclass(frozen=True)
class VariantOutcome:
    """One variant: its label, its run directory (None if it could not start) and how it ended."""

    label: str
    scenario_hash: str
    run_dir: Path | None
    state: str
    reused: bool
    error: str | None = None
    load: tuple[float, float] | None = None  # the 1-minute load average as the run started and ended


def finished_runs(runs_root: Path) -> dict[str, tuple[RunDir, str]]:
    """``{scenario hash: (run, state)}`` of the runs under ``runs_root`` whose results are all there
    (the newest run of a hash kept); a run directory that is not root's alone is not one of them."""
    found: dict[str, tuple[RunDir, str]] = {}
    for run in find_runs(runs_root):
        try:
            run.check_trusted()
        except (UntrustedPath, OSError):
            continue
        try:
            status = read_json_object(run.path / "status.json")
            meta = read_json_object(run.path / "metadata.json")
        except (OSError, ValueError):
            continue
        scenario = meta.get("scenario")
        digest = scenario.get("hash") if isinstance(scenario, dict) else None
        state = status.get("state")
        if state in DONE_STATES and isinstance(digest, str):
            found[digest] = (run, str(state))  # find_runs is in name order: the newest run of a hash wins
    return found


Runner = Callable[[Scenario, Path, str | None, Console], tuple[Path | None, str, str | None]]


def drive(
    scenario: Scenario, runs_root: Path, inventory: str | None, console: Console
) -> tuple[Path | None, str, str | None]:
    """Run one variant with the driver `dit run` uses: (run directory, state, error)."""
    from dit.run.driver import Driver, RunOptions
    from dit.run.rundir import RunDirError

    options = RunOptions(runs_root=runs_root, inventory=inventory, console=console)
    try:
        result = Driver(scenario, options).execute()
    except (RunDirError, UntrustedPath) as exc:
        return None, "failed", str(exc)
    return result.run_dir, result.state, result.error


def run_variants(
    variants: Sequence[Scenario],
    runs_root: Path,
    inventory: str | None,
    console: Console,
    runner: Runner = drive,
) -> list[VariantOutcome]:
    """Run every variant not finished under ``runs_root`` yet; stop after a run that was stopped."""
    done = finished_runs(runs_root)
    outcomes: list[VariantOutcome] = []
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("variants", total=len(variants))
        for variant in variants:
            if variant.hash in done:
                previous, state = done[variant.hash]
                outcomes.append(VariantOutcome(variant.label, variant.hash, previous.path, state, True))
                progress.console.print(
                    f"reproduce: {variant.label} already finished in {previous.path}", highlight=False
                )
                progress.advance(task)
                continue
            progress.update(task, description=variant.label)
            load_start = os.getloadavg()[0]
            run_dir, state, error = runner(variant, runs_root, inventory, progress.console)
            load = (load_start, os.getloadavg()[0])
            outcomes.append(VariantOutcome(variant.label, variant.hash, run_dir, state, False, error, load))
            progress.advance(task)
            if state == "stopped":
                break
    for variant in variants[len(outcomes) :]:  # after a stopped run: listed as not run, never dropped
        reason = "not run: the variant before it was stopped"
        outcomes.append(VariantOutcome(variant.label, variant.hash, None, "not run", False, reason))
    return outcomes
