"""The ``dit`` command: validate, run, stop, cleanup, ls, show, note, report, export, optimise, simulate,
reproduce, web, and the groups rack and runtimes.

Only the assembly: each command group is its own module of :mod:`dit.commands` (a new command goes
there, and one line here names it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import typer

from dit.commands import reports, reproduce, runs, show, simulate, web
from dit.rack.cli import rack_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="dit - the Distributed Inference Testbed. One YAML scenario, seven stages, repeatable measurements.",
)
app.add_typer(rack_app, name="rack")

#: Every command by its name, in the order ``dit --help`` lists them.
COMMANDS: Final[dict[str, Callable[..., Any]]] = {
    "validate": runs.validate,
    "run": runs.run,
    "stop": runs.stop,
    "cleanup": runs.cleanup,
    "ls": show.list_runs,
    "note": runs.note,
    "show": show.show,
    "report": reports.report,
    "export": reports.export_runs,
    "optimise": reports.optimise,
    "simulate": simulate.simulate,
    "reproduce": reproduce.reproduce,
    "web": web.web,
}
for _name, _command in COMMANDS.items():
    app.command(_name)(_command)


def _add_runtimes() -> None:
    from dit.runtime_ops.cli import app as runtimes_app

    app.add_typer(runtimes_app, name="runtimes")


_add_runtimes()

if __name__ == "__main__":
    app()
