"""Run a chapter and write its report: ``<out>/report.html`` (self-contained) and ``<out>/reproduce.json``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from dit.report.build import render
from dit.report.section import Section
from dit.reproduce.chapter import Finished, Plan, RuntimeSections, runtimes_sections
from dit.reproduce.chapters import chapter as chapter_of
from dit.reproduce.chapters import plan
from dit.reproduce.context import Context, where_text
from dit.reproduce.execute import Runner, VariantOutcome, drive, run_variants
from dit.run.rundir import write_text
from dit.runtime_api.chapters import ChapterRuns
from dit.trusted import check_trusted_dir
from dit.units import MISSING


def overview(ctx: Context, chosen: Plan, outcomes: Sequence[VariantOutcome]) -> Section:
    section = Section("What was run, and where", "overview")
    section.note = f"Size {ctx.size}: {where_text(ctx)}."
    facts = [
        ["where", ctx.where],
        ["cores", str(ctx.cores)],
        ["load average (1 min)", ctx.load_text()],
        ["model", ctx.model or MISSING],
        ["network", ctx.network or MISSING],
    ]
    facts += [["reduced for this size", text] for text in chosen.reductions]
    facts += [["not measured here", text] for text in chosen.not_run]
    facts += [["note", text] for text in ctx.notes]
    section.table("", ("", ""), facts)
    if outcomes:
        section.table(
            "Variants (a variant already finished in this directory is not run again)",
            ("variant", "state", "run directory", ""),
            [
                [o.label, o.state, str(o.run_dir or MISSING), "reused" if o.reused else (o.error or "")]
                for o in outcomes
            ],
        )
    return section


def _model_text(outcomes: Sequence[VariantOutcome]) -> str:
    for outcome in outcomes:
        if outcome.run_dir is None:
            continue
        try:
            meta = json.loads((outcome.run_dir / "metadata.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        runtime = meta.get("runtime") or {}
        block = runtime.get("block") if isinstance(runtime, dict) else None
        if isinstance(block, dict) and block.get("model"):  # a runtime with its own model (HeadSplit)
            return f"{block['model']} ({runtime.get('name')}'s own model)"
        model = meta.get("model") or {}
        spec = model.get("spec") or {}
        name = spec.get("name", "?")
        params = spec.get("params") or {}
        return f"{name} {json.dumps(params, sort_keys=True)}" if params else str(name)
    return ""


def reproduce(
    chapter: str,
    size: str,
    out: Path,
    inventory: str | None,
    where: str,
    console: Console,
    runner: Runner = drive,
    shared_machine: bool | None = None,
) -> Path:
    """Run ``chapter`` at ``size`` into ``out`` (resuming) and write its report; the report's path.
    ``shared_machine``: every node runs on this machine's cores (default: in local mode only; the emulated
    rack too)."""
    chosen = plan(chapter, size, local=inventory is None)  # type: ignore[arg-type]  # plan checks SIZES
    ctx = Context(chapter, size, where, reductions=chosen.reductions)
    ctx.shared_machine = inventory is None if shared_machine is None else shared_machine
    # Its finished runs are reused as measured and its report written as root: root's alone, or
    # UntrustedPath before anything runs (issue 46).
    check_trusted_dir(out, what="--out", create=True)
    recorded = _recorded_loads(out / "reproduce.json")
    outcomes = [
        replace(o, load=recorded.get(str(o.run_dir))) if o.reused else o
        for o in run_variants(chosen.variants, out / "runs", inventory, console, runner)
    ]
    ctx.finish()
    ctx.run_loads = [o.load for o in outcomes if o.load is not None]
    if any(o.load is None and o.run_dir is not None for o in outcomes):
        ctx.notes.append(
            "a reused run's load average is unknown: it was made before reproduce.json recorded it"
        )
    ctx.model = _model_text(outcomes)
    found = chapter_of(chapter)
    sections = found.sections(Finished(ctx, chosen, outcomes, out))
    sections.insert(0, overview(ctx, chosen, outcomes))
    html = render(found.title, sections, out)
    target = out / "report.html"
    write_text(target, html, what="--out")
    record: dict[str, Any] = {
        "chapter": chapter,
        "size": size,
        "where": where,
        "cores": ctx.cores,
        "load_before": ctx.load_before,
        "load_after": ctx.load_after,
        # the outcome's own fields, not the driver's RunResult a sweep hands back with it (paths, stage
        # times: the variant's run directory holds them)
        "variants": [
            {
                **{k: v for k, v in asdict(o).items() if k != "result"},
                "run_dir": None if o.run_dir is None else str(o.run_dir),
            }
            for o in outcomes
        ],
        "not_run": list(chosen.not_run),
    }
    write_text(out / "reproduce.json", json.dumps(record, indent=2) + "\n", what="--out")
    return target


def runtime_sections(runs: ChapterRuns) -> RuntimeSections:
    """Every installed runtime's sections of the chapter, and a row saying so for each runtime the chapter
    sets beside the others that is not installed (its :attr:`~dit.reproduce.chapter.Chapter.absent`)."""
    return runtimes_sections(runs, chapter_of(runs.chapter).absent)


def _recorded_loads(path: Path) -> dict[str, tuple[float, float]]:
    """``{run directory: (load at start, at end)}`` from a previous invocation's ``reproduce.json``."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    loads: dict[str, tuple[float, float]] = {}
    for variant in record.get("variants", []) if isinstance(record, dict) else []:
        load = variant.get("load") if isinstance(variant, dict) else None
        if isinstance(load, list) and len(load) == 2 and variant.get("run_dir"):
            loads[str(variant["run_dir"])] = (float(load[0]), float(load[1]))
    return loads
