"""``dit report``, ``export`` and ``optimise``: what is made from finished runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from dit.commands.common import fail, out
from dit.run.rundir import (
    NoRunsError,
)
from dit.trusted import UntrustedPath

if TYPE_CHECKING:
    pass


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
                raise fail("--round: a comparison has no phase timeline; leave it out")
            target = output or Path("compare.html")
            write_output(target, build_comparison(paths))
    except (ReportError, CompareError, UntrustedPath) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot write the report: {exc.strerror or exc}") from None
    out.print(f"report: {target}")


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
        raise fail(str(exc), 2) from None
    except OSError as exc:
        raise fail(f"cannot write {out_dir}: {exc.strerror or exc}") from None
    out.print(
        f"{len(loaded.run_dirs)} run(s) -> {escape(str(out_dir))}: {', '.join(p.name for p in written)}"
    )


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
            raise fail(f"--vector: {vector!r} is not a comma-separated list of integers", 2) from None
    try:
        result = optimise_run(run_dir, algorithm, objective, policy, parsed, max_vectors=max_vectors)
    except (OptimiseError, AggregateError, UntrustedPath) as exc:  # it writes into RUN_DIR/optimise
        raise fail(str(exc), 2) from None
    if as_json:
        out.print_json(result.to_json())
    else:
        out.print(result.render_table())
