"""Runs: launch (the CLI's own driver in its own session), list, detail, stop, plots, optimise, terminal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.background import BackgroundTask

from dit.device.tags import RUN_ENV
from dit.report import labels
from dit.run.procs import pid_alive
from dit.run.rundir import RunDir, RunDirError, write_json
from dit.scenario import expand, validate
from dit.trusted import UntrustedPath
from dit.web.routes.common import (
    Context,
    Ctx,
    close_websocket,
    context,
    field_errors,
    json_body,
    unprocessable,
)
from dit.web.security import REPORT_CSP
from dit.web.services import queue as run_queue
from dit.web.services import runpage
from dit.web.services import runs as runs_mod
from dit.web.services.aio import run_reaped
from dit.web.services.benchmark import PROFILING_FIELDS, benchmark_document, profiling_schema
from dit.web.services.runtimes import Action
from dit.web.services.store import Version
from dit.web.services.terminal import tail

router = APIRouter(prefix="/api")
DRY_RUN_TIMEOUT_S = 600.0
MAX_QUEUED = 50  # runs one request may queue


@router.get("/runs")
def get_runs(ctx: Ctx) -> dict[str, Any]:
    return {"runs": runs_mod.list_runs(ctx.runs_root, ctx.store)}


def launch_errors(ctx: Context, body: dict[str, Any], kinds: tuple[str, ...]) -> list[dict[str, str]]:
    """What is wrong with a request to run (or dry-run) a saved version: ``kind``, ``mode``, ``version``."""
    errors = []
    if body.get("kind", "run") not in kinds:
        errors.append({"path": "kind", "message": " or ".join(kinds)})
    mode = body.get("mode", "local")
    if mode not in ("local", "inventory"):
        errors.append({"path": "mode", "message": "local or inventory"})
    if mode == "inventory" and not ctx.config.inventory.exists():
        errors.append({"path": "mode", "message": f"no inventory at {ctx.config.inventory}"})
    if ctx.store.find(str(body.get("version", ""))) is None:
        errors.append({"path": "version", "message": "no such saved version"})
    return errors


@router.post("/runs", status_code=202, response_model=None)
async def start_run(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    body = await json_body(request)
    kind = body.get("kind", "run")
    mode = body.get("mode", "local")
    errors = launch_errors(ctx, body, ("run", "benchmark"))
    # absent: queued when it must wait (something going or waiting); true: always; false: refused then
    queued = body.get("queue")
    count = body.get("count", 1)
    if queued is not None and not isinstance(queued, bool):
        errors.append({"path": "queue", "message": "true or false"})
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_QUEUED:
        errors.append({"path": "count", "message": f"a whole number from 1 to {MAX_QUEUED}"})
    elif count > 1 and queued is False:
        errors.append({"path": "count", "message": "several runs wait their turn: set queue to true"})
    version = ctx.store.find(str(body.get("version", "")))
    if errors or version is None:
        return unprocessable(errors)
    chosen = version
    if kind == "benchmark":
        # the profiling-only pipeline: the same scenario without inference and optimisation, with the
        # dialog's profiling options (dit.web.services.benchmark.PROFILING_FIELDS)
        document, wrong = benchmark_document(version.document, body.get("profiling"))
        if wrong:
            return unprocessable(wrong)
        problems = validate(document)
        if problems:
            return unprocessable(field_errors(problems))
        chosen, _ = await asyncio.to_thread(
            ctx.store.save, document, expand(document), "benchmark", version.hash
        )

    def start(version: Version, kind: str, mode: str) -> runs_mod.Launch:
        return runs_mod.launch(version, kind, mode, ctx.runs_root, ctx.config.inventory.resolve(), ctx.store)

    # a run going holds the nodes' lease: this one waits its turn (the housekeeping starts each in turn,
    # dit.web.services.queue) rather than a second driver the lease refuses
    try:
        done = await asyncio.to_thread(
            run_queue.start_or_enqueue, ctx.runs_root, ctx.store, chosen, kind, mode, start, count, queued
        )
    except run_queue.Busy as exc:
        return JSONResponse(
            {"detail": str(exc), "holder": exc.going, "waiting": exc.waiting,
             "errors": [{"path": "queue", "message": str(exc)}]},
            status_code=409,
        )  # fmt: skip
    if done.launch is None:
        line = await asyncio.to_thread(run_queue.entries, ctx.runs_root, ctx.store)
        mine = [e for e in line["entries"] if e["id"] in done.queued]
        return {
            "queued": mine,
            "holder": line["holder"],
            "version": chosen.summary(),
            "kind": kind,
            "mode": mode,
        }
    record = done.launch
    return {"launch": record.id, "pid": record.pid, "version": chosen.summary(), "kind": kind, "mode": mode}


@router.get("/queue")
def get_queue(ctx: Ctx) -> dict[str, Any]:
    """The runs waiting their turn, with their position, and what is going (the holder)."""
    return run_queue.entries(ctx.runs_root, ctx.store)


@router.delete("/queue/{qid}")
def cancel_queued(ctx: Ctx, qid: str) -> dict[str, Any]:
    """Take a waiting run out of the queue."""
    if not ctx.store.settle_queued(qid, "cancelled"):
        raise HTTPException(404, f"no waiting run {qid} in the queue")
    return run_queue.entries(ctx.runs_root, ctx.store)


def dry_run_file(ctx: Context, digest: str, mode: str) -> Path:
    """Where the last dry run of a version in a mode is kept (a closed tab loses nothing)."""
    return ctx.actions.base / "dry-runs" / f"{digest}.{mode}.json"


async def _dry_run(ctx: Context, version: Version, mode: str, action: Action) -> dict[str, Any]:
    """``dit run --check --json`` of ``version``, its progress into ``action``'s log line by line (the
    terminal shows it live), its report kept as the version's last dry run in ``mode``.

    Raises :class:`DryRunError` when it times out or prints no report."""
    path = await asyncio.to_thread(runs_mod.version_file, version, ctx.runs_root)
    argv = [sys.executable, "-m", "dit", "run", "--check", "--json", str(path)]
    argv += ["--runs-dir", str(ctx.runs_root)]
    if mode == "inventory":
        argv += ["-i", str(ctx.config.inventory.resolve())]
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}

    def progress(line: str) -> None:  # the driver's "<node> <stream> <text>" lines, as the run's terminal
        node, stream, text = [*line.split(" ", 2), "", ""][:3]
        if node and stream.isalpha() and text:
            action.line(node, stream, text)
        else:
            action.line("nnpm", "stderr", line)

    try:
        done = await run_reaped(argv, DRY_RUN_TIMEOUT_S, progress, stdin=asyncio.subprocess.DEVNULL, env=env)
    except TimeoutError:
        raise DryRunError(f"the dry run took longer than {DRY_RUN_TIMEOUT_S:g} s") from None
    log = done.stderr.decode("utf-8", "replace")[-4000:]
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise DryRunError(f"the dry run failed: {log.strip()[-1000:]}") from None
    result = {
        "version": version.summary(),
        "mode": mode,
        "ok": done.returncode == 0,
        **report,
        "log_tail": log,
        "finished_ns": time.time_ns(),
    }
    keep = dry_run_file(ctx, version.hash, mode)
    try:
        keep.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(write_json, keep, result, what="NNPM's directory")
    except (OSError, UntrustedPath) as exc:  # the report is still the answer; the page says it was not kept
        result["not_kept"] = str(exc)
        action.line("nnpm", "error", f"the dry run's report was not kept: {exc}")
    return result


class DryRunError(Exception):
    """A dry run that gave no report (timed out, or the driver failed before it could write one)."""


_BACKGROUND: set[asyncio.Task[Any]] = set()  # held, so a running dry run is not garbage-collected


@router.post("/dry-runs", response_model=None)
async def dry_run(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    """``dit run --check`` on a saved version: what preflight and apply would change on every node.

    Runs as a child process (the driver needs the main thread for its signal handlers); its progress
    streams to the terminal of an action (``/api/actions/{id}/terminal``) and its report is kept as the
    version's last dry run (``GET /api/versions/{hash}/dry-run``). With ``"background": true`` the
    answer is that action, at once (``202``); otherwise the report, when it is done (tens of seconds).
    No run directory is made and nothing is changed on any node.
    """
    body = await json_body(request)
    errors = launch_errors(ctx, body, ("run",))
    if not isinstance(body.get("background", False), bool):
        errors.append({"path": "background", "message": "true or false"})
    version = ctx.store.find(str(body.get("version", "")))
    if errors or version is None:
        return unprocessable(errors)
    mode = str(body.get("mode", "local"))
    action = ctx.actions.new("dry-run", "", f"dry run of {version.name} ({mode} mode)", [])
    action.line("nnpm", "info", f"{action.title}: dit run --check")

    async def job() -> dict[str, Any] | None:
        try:
            result = await _dry_run(ctx, version, mode, action)
        except DryRunError as exc:
            action.state, action.error = "failed", str(exc)
            return None
        else:
            if not result["ok"]:  # it ran, and says what failed where (the report's errors)
                action.state, action.error = "failed", "the dry run failed: see its report"
            return result
        finally:
            action.finish()

    if body.get("background"):
        task = asyncio.ensure_future(job())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)
        return JSONResponse({"action": action.to_json(), "version": version.summary(), "mode": mode}, 202)
    result = await job()
    if result is None:
        return unprocessable([{"path": "", "message": str(action.error)}])
    return {**result, "action": action.id}


@router.get("/versions/{digest}/dry-runs")
def kept_dry_runs(ctx: Ctx, digest: str) -> dict[str, Any]:
    """Which modes a saved version has a kept dry run in: ``{local, inventory}``, each ``{finished_ns,
    ok}`` or null. The page asks this on every version it opens, never a 404 it would log as an error."""
    version = ctx.store.find(digest)
    if version is None:
        raise HTTPException(404, f"no saved version {digest}")
    out: dict[str, Any] = {}
    for mode in ("local", "inventory"):
        path = dry_run_file(ctx, version.hash, mode)
        try:
            kept = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            kept = None
        out[mode] = (
            {"finished_ns": kept.get("finished_ns"), "ok": kept.get("ok")} if isinstance(kept, dict) else None
        )
    return out


@router.get("/versions/{digest}/dry-run")
def last_dry_run(ctx: Ctx, digest: str, mode: str = "local") -> Any:
    """The last dry run of a saved version in ``mode`` (``local`` or ``inventory``), kept on disk."""
    if mode not in ("local", "inventory"):
        raise HTTPException(422, "mode: local or inventory")
    version = ctx.store.find(digest)
    if version is None:
        raise HTTPException(404, f"no saved version {digest}")
    path = dry_run_file(ctx, version.hash, mode)
    if not path.is_file():
        raise HTTPException(404, f"no dry run of {digest[:12]} in {mode} mode yet")
    return FileResponse(path, media_type="application/json")


@router.get("/launches/{launch_id}")
def get_launch(ctx: Ctx, launch_id: str) -> dict[str, Any]:
    row = next((r for r in ctx.store.launches() if r["id"] == launch_id), None)
    if row is None:
        raise HTTPException(404, f"no launch {launch_id}")
    runs_mod.tag_runs(ctx.runs_root, ctx.store)
    mine = [r for r in runs_mod.list_runs(ctx.runs_root, ctx.store) if r.get("launch") == launch_id]
    log = Path(row["log"])
    tail_text = log.read_text(encoding="utf-8", errors="replace")[-4000:] if log.exists() else ""
    return {**row, "alive": pid_alive(int(row["pid"])), "runs": mine, "log_tail": tail_text}


def run_or_404(ctx: Context, scenario: str, run: str) -> RunDir:
    try:
        return runs_mod.run_dir_of(ctx.runs_root, scenario, run)
    except runs_mod.RunNotFound:
        raise HTTPException(404, f"no run {scenario}/{run}") from None


@router.get("/runs/{scenario}/{run}")
def get_run(ctx: Ctx, scenario: str, run: str) -> dict[str, Any]:
    return runs_mod.run_detail(run_or_404(ctx, scenario, run), ctx.runs_root, ctx.store)


@router.put("/runs/{scenario}/{run}/note", response_model=None)
async def put_note(ctx: Ctx, scenario: str, run: str, request: Request) -> dict[str, Any] | JSONResponse:
    """Set the run's note (``{"text": …}``; an empty text removes it), as ``dit note RUN TEXT`` does."""
    rundir = run_or_404(ctx, scenario, run)
    body = await json_body(request)
    text = body.get("text")
    if not isinstance(text, str):
        return unprocessable([{"path": "text", "message": "a string (an empty one removes the note)"}])
    try:
        await asyncio.to_thread(rundir.set_note, text)
    except ValueError as exc:
        return unprocessable([{"path": "text", "message": str(exc).removeprefix("note: ")}])
    except RunDirError as exc:
        raise HTTPException(500, str(exc)) from None
    except UntrustedPath as exc:
        raise HTTPException(409, str(exc)) from None
    return {"note": rundir.note()}


@router.post("/runs/{scenario}/{run}/stop", status_code=202)
def stop(ctx: Ctx, scenario: str, run: str) -> dict[str, Any]:
    rundir = run_or_404(ctx, scenario, run)
    summary = runs_mod.run_summary(rundir, ctx.runs_root, ctx.store)
    if summary["state"] in runs_mod.STATES_DONE:
        raise HTTPException(409, f"the run is already {summary['state']}")
    try:
        proc = runs_mod.stop_run(rundir)
    except UntrustedPath as exc:  # its driver.json could name any process: dit stop would refuse it too
        raise HTTPException(409, str(exc)) from None
    return {"stopping": summary["key"], "pid": proc.pid}


@router.get("/runs/{scenario}/{run}/plots/{plot}.png")
async def plot(ctx: Ctx, scenario: str, run: str, plot: str, v: str | None = None) -> Response:
    from dit.web.services.plots import cached_png, layers_png, monitors_png

    agg = run_or_404(ctx, scenario, run).path / "aggregate"
    if plot == "validation":
        if not (agg / "validation.png").is_file():
            raise HTTPException(404, "no validation plot")
        return FileResponse(agg / "validation.png", media_type="image/png")
    makers = {"layers": (layers_png, "layers.csv"), "monitors": (monitors_png, "monitors.csv")}
    if plot not in makers:
        raise HTTPException(404, f"no plot {plot}")
    make, name = makers[plot]
    if not (agg / name).is_file():
        raise HTTPException(404, f"the run has no {name}")
    png = await asyncio.to_thread(cached_png, make, agg / name)
    # the page asks with its inputs' stamp (run detail's plot_stamps): a new stamp is a new address
    cache = "private, max-age=86400" if v else "no-cache"
    return Response(png, media_type="image/png", headers={"Cache-Control": cache})


@router.get("/runs/{scenario}/{run}/report")
async def report(ctx: Ctx, scenario: str, run: str) -> Response:
    """The run's report (``dit report``) as a download: a self-contained file to keep or send.

    A download, not a page of NNPM: the report carries its own styles, which NNPM's policy forbids inline.
    """
    from dit.report.build import ReportError, build_report

    rundir = run_or_404(ctx, scenario, run)
    try:
        html = await asyncio.to_thread(build_report, rundir.path)
    except ReportError as exc:
        raise HTTPException(409, str(exc)) from None
    filename = f"{scenario}-{rundir.path.name}-report.html"
    return Response(
        html,
        media_type="text/html; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"', "Cache-Control": "no-store"},
    )


@router.get("/runs/{scenario}/{run}/archive")
async def archive(ctx: Ctx, scenario: str, run: str) -> Response:
    """The whole run directory as one ``.tar.gz`` download (symbolic links kept as links, never
    followed); refused (``409``) while the run is going, whose archive would be partial."""
    rundir = run_or_404(ctx, scenario, run)
    summary = runs_mod.run_summary(rundir, ctx.runs_root, ctx.store)
    if summary["state"] in ("running", "starting") and summary["driver_alive"]:
        raise HTTPException(
            409, f"{scenario}/{run} is still {summary['state']}: its archive would be partial"
        )
    top = f"{scenario}-{rundir.path.name}"
    scratch = runs_mod.nnpm_dir(ctx.runs_root) / "archives"
    try:
        path = await asyncio.to_thread(runs_mod.archive_file, rundir.path, top, scratch)
    except OSError as exc:
        raise HTTPException(500, f"cannot archive {scenario}/{run}: {exc}") from None
    return FileResponse(
        path,
        media_type="application/gzip",
        filename=f"{top}.tar.gz",
        headers={"Cache-Control": "no-store"},
        background=BackgroundTask(path.unlink, missing_ok=True),
    )


@router.get("/compare/report")
async def compare_report(ctx: Ctx, runs: Annotated[list[str], Query()], view: bool = False) -> Response:
    """Two or more runs side by side (``dit report RUN RUN …``): ``runs`` are run keys (``<scenario>/<run>``,
    as ``GET /api/runs`` lists them), each resolved inside the runs directory. A download, or with
    ``view=true`` a page to read in the browser, under its own sandboxed policy (:data:`REPORT_CSP`)."""
    from dit.report.compare import CompareError, build_comparison

    dirs = []
    for key in runs:
        scenario, _, run = key.partition("/")
        if not scenario or not run or "/" in run:
            raise HTTPException(422, f"runs: {key!r} is not a run key (<scenario>/<run>)")
        dirs.append(run_or_404(ctx, scenario, run).path)
    try:
        html = await asyncio.to_thread(build_comparison, dirs)
    except CompareError as exc:
        raise HTTPException(422, f"runs: {exc}") from None
    if view:
        headers = {"Content-Security-Policy": REPORT_CSP, "Cache-Control": "no-store"}
    else:
        headers = {"Content-Disposition": 'attachment; filename="compare.html"', "Cache-Control": "no-store"}
    return Response(html, media_type="text/html; charset=utf-8", headers=headers)


@router.get("/benchmark")
def get_benchmark() -> dict[str, Any]:
    """The options a benchmark run accepts: their paths and the part of the scenario schema they are."""
    from dit.scenario import load_schema

    return {"fields": list(PROFILING_FIELDS), "schema": profiling_schema(load_schema())}


@router.get("/runs/{scenario}/{run}/optimise")
def get_optimise(ctx: Ctx, scenario: str, run: str) -> dict[str, Any]:
    """The run's optimiser results, values written with units, each marked measured or predicted."""
    rundir = run_or_404(ctx, scenario, run)
    settings = runpage.run_settings(runs_mod.read_scenario(rundir.path))
    fake_power = labels.fake_power_nodes(rundir.path / "aggregate")
    folder = rundir.path / "optimise"
    results = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(ValueError, OSError):
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                results.append({"file": path.name, **runpage.optimise_view(data, settings, fake_power)})
    return {"results": results, "settings": settings, "terms": runpage.TERMS}


@router.post("/runs/{scenario}/{run}/optimise", response_model=None)
async def optimise(ctx: Ctx, scenario: str, run: str, request: Request) -> dict[str, Any] | JSONResponse:
    from dit.analysis.run import AggregateError
    from dit.optimise import OptimiseError
    from dit.optimise.api import optimise_run

    rundir = run_or_404(ctx, scenario, run)
    body = await json_body(request)
    summary = runs_mod.run_summary(rundir, ctx.runs_root, ctx.store)
    if summary["state"] not in runs_mod.STATES_DONE:
        raise HTTPException(409, "the run has not finished")
    settings: dict[str, str | None] = {}
    for key in ("algorithm", "objective", "policy"):
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            return unprocessable([{"path": key, "message": "a name"}])
        settings[key] = value or None
    try:
        result = await asyncio.to_thread(
            optimise_run, rundir.path, settings["algorithm"], settings["objective"], settings["policy"], None
        )
    except (OptimiseError, AggregateError) as exc:
        return unprocessable([{"path": "", "message": str(exc)}])
    except UntrustedPath as exc:  # it writes into the run's optimise/
        raise HTTPException(409, str(exc)) from None
    settings_of_run = runpage.run_settings(runs_mod.read_scenario(rundir.path))
    data: dict[str, Any] = runpage.optimise_view(
        json.loads(result.to_json()), settings_of_run, labels.fake_power_nodes(rundir.path / "aggregate")
    )
    data["file"] = result.output_path.name
    data["validation_png"] = (rundir.path / "aggregate" / "validation.png").is_file()
    return data


@router.websocket("/runs/{scenario}/{run}/terminal")
async def run_terminal(
    ws: WebSocket, scenario: str, run: str, offset: int | None = None, node: str | None = None
) -> None:
    ctx = context(ws)
    try:
        rundir = runs_mod.run_dir_of(ctx.runs_root, scenario, run)
    except runs_mod.RunNotFound:
        await close_websocket(ws, 4404)
        return

    def finished() -> bool:
        state = runs_mod.run_summary(rundir, ctx.runs_root, ctx.store)["state"]
        return state in (*runs_mod.STATES_DONE, "dead")

    await tail(ws, rundir.log, offset, finished, node)
