"""Run a chapter's variants into ``<out>/runs``, skipping each one already finished there.

A variant is finished when a run directory under ``<out>/runs`` holds the same scenario hash (the
sha256 of the resolved scenario, ``metadata.json``) and ended ``completed`` or ``degraded``: its results
are all there. A failed or stopped run is run again, and so is one in a directory another user owns or
could write (its files could be theirs, reported as measured). The variants run as `dit run` runs a
sweep (:mod:`dit.run.sweep`): consecutive variants on the same devices as one unit on their nodes, with
a progress bar that shows the variant running and an ETA.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from dit.run.sweep import SweepUnit, VariantOutcome, driver_runner, finished_runs, run_sweep
from dit.scenario import Scenario

__all__ = ["Runner", "VariantOutcome", "drive", "finished_runs", "run_variants"]

Runner = Callable[[Scenario, Path, str | None, Console], tuple[Path | None, str, str | None]]


def drive(
    scenario: Scenario, runs_root: Path, inventory: str | None, console: Console
) -> tuple[Path | None, str, str | None]:
    """Run one variant with the driver `dit run` uses, on its own: (run directory, state, error)."""
    from dit.run.driver import RunOptions

    run_dir, state, error, _result = driver_runner(
        RunOptions(runs_root=runs_root, inventory=inventory, console=console)
    )(scenario, None)
    return run_dir, state, error


def run_variants(
    variants: Sequence[Scenario],
    runs_root: Path,
    inventory: str | None,
    console: Console,
    runner: Runner = drive,
) -> list[VariantOutcome]:
    """Run every variant not finished under ``runs_root`` yet; stop after a run that was stopped."""
    if runner is drive:  # the real driver: the variants as one unit on their nodes
        from dit.run.driver import RunOptions

        options = RunOptions(runs_root=runs_root, inventory=inventory, console=console)
        return run_sweep(variants, runs_root, console, driver_runner(options), what="reproduce")

    def each(scenario: Scenario, _unit: SweepUnit | None) -> tuple[Path | None, str, str | None, None]:
        return (*runner(scenario, runs_root, inventory, console), None)

    return run_sweep(variants, runs_root, console, each, what="reproduce")
