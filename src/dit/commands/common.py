"""What every command group of ``dit`` shares: the consoles, the one-line failure, the scenario
loader and the checks of a runs directory and of a run directory before root acts on it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from dit.run.rundir import (
    DRIVER,
    RunDir,
    RunDirError,
    check_writable,
    read_json,
)
from dit.trusted import UntrustedPath

if TYPE_CHECKING:
    from dit.scenario import Scenario


# Piped output (CI logs, files) gets wide tables instead of labels folded over several lines.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

RunsRoot = Annotated[
    Path, typer.Option("--runs-dir", envvar="DIT_RUNS_DIR", help="Where run directories are created.")
]


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def load_scenarios(path: Path) -> list[Scenario]:
    from dit.scenario import ScenarioError, load

    try:
        return list(load(path))
    except ScenarioError as exc:
        for error in exc.errors:
            err.print(f"[red]{escape(str(path))}:[/] {escape(str(error))}", highlight=False)
        raise typer.Exit(2) from None
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}", 2) from None


def usable_runs_dir(path: Path, option: str) -> None:
    """Refuse, before anything starts, a runs directory this process cannot write (read-only, full) or
    one another user owns or could write, itself or a directory above it: they could swap a run
    directory, its inventory included, for theirs while root runs it (issue 46)."""
    try:
        check_writable(path, what=option)
    except RunDirError as exc:
        raise fail(f"{option}: {exc}", 2) from None
    except UntrustedPath as exc:
        raise fail(str(exc), 2) from None


def read_run_json(path: Path) -> dict[str, Any]:
    """A run's JSON file (status.json, driver.json, ...) as a mapping; one-line error if it is not."""
    try:
        data = read_json(path)
    except OSError as exc:
        raise fail(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise fail(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise fail(f"{path}: not a JSON object")
    return data


def trusted_run(run_dir: Path) -> RunDir:
    """``run_dir`` as a run whose files dit may act on as root (its identity, inventory, journal), or
    a one-line refusal naming it: the directory and every one above it must be root's alone, or
    another user could have written them (issue 46)."""
    run = RunDir(run_dir)
    try:
        run.check_trusted()
    except UntrustedPath as exc:
        raise fail(str(exc), 2) from None
    except (FileNotFoundError, NotADirectoryError):
        raise fail(f"{run_dir} is not a dit run directory") from None
    if not (run.path / DRIVER).exists():
        raise fail(f"{run_dir} is not a dit run directory")
    return run
