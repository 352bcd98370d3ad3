"""``dit simulate``: a simulation file, a replayed run or the article's rack fitted (the ``sim`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dit.commands.common import fail, out

if TYPE_CHECKING:
    pass


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
            raise fail("--fit-article fits the article's own rack: leave out the file, --replay, "
                        "--placement and --out", 2)  # fmt: skip
        _fit_article(one_rate, write)
        return
    if one_rate or write is not None:
        raise fail("--one-rate and --write go with --fit-article", 2)
    if (spec is None) == (replay is None):
        raise fail("give either a simulation file or --replay RUN_DIR", 2)
    if replay is not None and placement is not None:
        raise fail("--placement: a replay simulates the run's own placement; leave it out", 2)
    if replay is None and (calibration is not None or profile is not None):
        raise fail("--calibration and --profile go with --replay RUN_DIR", 2)
    try:
        from dit.sim import output as sim_output
        from dit.sim.cli import format_result, run_placements
        from dit.sim.engine import SimError
        from dit.sim.replay import format_replay
        from dit.sim.replay import replay as replay_run
    except ImportError as exc:
        raise fail(f"dit simulate needs the sim extra (pip install 'dit[sim]'): {exc}", 2) from None
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
        raise fail(str(exc), 2) from None
    if out_dir is None:
        return
    try:
        if replay is not None:
            sim_output.write_replay(out_dir, replayed, replay, calibration)
        else:
            assert spec is not None
            sim_output.write(out_dir, runs, source=spec)
    except OSError as exc:
        raise fail(f"--out: cannot write {out_dir}: {exc.strerror or exc}", 2) from None
    out.print(f"result: {out_dir} (dit report {out_dir})", highlight=False)


def _fit_article(one_rate: bool, write: Path | None) -> None:
    try:
        from dit.sim.fit import Rack, fit, fitted_yaml, format_fit, format_sweep, sweep
    except ImportError as exc:
        raise fail(f"dit simulate needs the sim extra (pip install 'dit[sim]'): {exc}", 2) from None
    fitted = fit(Rack(), attention_rate=not one_rate)
    out.print(format_fit(fitted), highlight=False)
    out.print("", highlight=False)
    out.print(format_sweep(sweep(fitted.board, fitted.rack)), highlight=False)
    if write is not None:
        try:
            write.write_text(fitted_yaml(fitted), encoding="utf-8")
        except OSError as exc:
            raise fail(f"--write: cannot write {write}: {exc.strerror or exc}", 2) from None
        out.print(f"written: {write}", highlight=False)
