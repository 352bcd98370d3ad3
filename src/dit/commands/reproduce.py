"""``dit reproduce CHAPTER``: where the chapter runs (local mode, the emulated rack, an inventory)
checked before anything runs, then :func:`dit.reproduce.report.reproduce`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dit.commands.common import err, fail, out, usable_runs_dir
from dit.trusted import UntrustedPath

if TYPE_CHECKING:
    pass


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
        raise fail(f"CHAPTER: {chapter!r} is not one of {', '.join(CHAPTERS)}", 2)
    if size not in SIZES:
        raise fail(f"--size: {size!r} is not one of {', '.join(SIZES)}", 2)
    inventory, where_label, shared = _reproduce_where(where, chapter)
    target = out_dir if out_dir is not None else default_out(chapter)
    usable_runs_dir(target / "runs", "--out")  # its finished runs are reused, its report written
    try:
        report_path = run_chapter(chapter, size, target, inventory, where_label, err, shared_machine=shared)
    except (ChapterError, UntrustedPath) as exc:
        raise fail(str(exc), 2) from None
    out.print(f"report: {report_path}", highlight=False)


def _reproduce_where(where: str, chapter: str) -> tuple[str | None, str, bool]:
    """(inventory or None for local mode, the words the report uses, whether every node shares this
    machine's cores). The emulated rack is the one in ``DIT_RACK_DIR`` (as for ``dit rack``), else the
    default state dir; a chapter with ``fitting_quotas`` (Chapter 6's strategies side by side) refuses a
    rack whose devices' quotas exceed the CPUs they share, before anything runs."""
    if where == "local":
        if (message := _local_settings_error()) is not None:
            raise fail(message, 2)
        return None, "local mode", True
    if where == "rack":
        from dit.rack import DEFAULT_STATE_DIR
        from dit.rack.executor import status as rack_status
        from dit.rack.plan import RackError, RackSpec
        from dit.reproduce.chapters import chapter as reproduce_chapter

        state_dir = Path(os.environ.get("DIT_RACK_DIR") or DEFAULT_STATE_DIR)
        try:
            state, _ = rack_status(state_dir.resolve())
        except RackError as exc:
            raise fail(
                f"--where rack: no emulated rack is up ({exc}); start one with `dit rack up`", 2
            ) from None
        try:
            spec = RackSpec.recorded(state.get("spec", {}))
        except RackError as exc:
            raise fail(f"--where rack: {state_dir}/{exc}", 2) from None
        fitting = reproduce_chapter(chapter).fitting_quotas
        if fitting and (refusal := spec.quota_refusal()) is not None:
            raise fail(f"--where rack: {refusal}", 2)
        label = (
            f"the emulated rack ({state['inventory']}: {spec.devices} devices x {spec.cpu_share_pct} % of "
            f"CPU {spec.cpus}, {spec.memory_mb} MiB each)"
        )
        # a chapter that runs only on a rack whose quotas fit: each device's capacity is its own there
        return str(state["inventory"]), label, not fitting
    if not Path(where).exists():
        raise fail(f"--where: {where!r} is not local, rack or an existing inventory path", 2)
    return where, f"the hosts of {where}", False


def _local_settings_error() -> str | None:
    from dit.run.localmode import check_local_settings

    try:
        check_local_settings()
    except ValueError as exc:
        return str(exc)
    return None
