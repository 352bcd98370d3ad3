"""Runtimes: readiness checks and maintenance actions on the nodes, each with its live terminal."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, WebSocket
from fastapi.responses import JSONResponse

from dit.runtime_api import registry
from dit.runtime_api.interface import Runtime
from dit.runtime_ops import plays as ops
from dit.scenario.spec import DEFAULT_RUNTIME
from dit.web.routes.common import Context, Ctx, close_websocket, context, json_body, unprocessable
from dit.web.services.terminal import tail

router = APIRouter(prefix="/api")


def installable(runtime: Runtime) -> bool:
    """Whether ``runtime`` is an external runtime that the sources file declares (``dit runtimes install``
    installs only those, into their own venv)."""
    from dit.mirror.runtimes import RuntimeSourceError, declared

    try:  # the declaration only: its pin (a directory's hash) is computed by the install
        return declared(runtime.name) is not None
    except RuntimeSourceError:
        return False


def mirror_dir() -> Path:
    """The mirror the installs read, as ``dit runtimes install`` finds it: $DIT_MIRROR_DIR, else
    /srv/dit-mirror (a server setting, never a request's)."""
    return Path(os.environ.get("DIT_MIRROR_DIR", "/srv/dit-mirror")).resolve()


def _runtime_json(runtime: Runtime) -> dict[str, Any]:
    plan_checks: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="nnpm-runtime-") as tmp:
            plan_checks = list(runtime.readiness(None, Path(tmp)).checks)
    except Exception:  # a plug-in whose readiness cannot be described without a scenario
        plan_checks = []
    return {
        "name": runtime.name,
        "version": runtime.version,
        "title": runtime.title,
        "checks": plan_checks,
        "installable": installable(runtime),
        "block": dict(runtime.block_schema()),
        "actions": [
            {"name": a.name, "title": a.title, "description": a.description, "inputs": dict(a.inputs)}
            for a in runtime.actions()
        ],
    }


@router.get("/runtimes")
def get_runtimes(ctx: Ctx) -> dict[str, Any]:
    """Every installed runtime (the registry: built-ins and entry-point plug-ins), the latest verdict
    per runtime and node, the plug-ins that did not load and the history of actions."""
    return {
        "runtimes": [_runtime_json(r) for r in registry.installed().values()],
        "problems": registry.problems(),
        "readiness": ctx.actions.readiness(),
        "history": [a.to_json() for a in sorted(ctx.actions.items.values(), key=lambda a: -a.started_ns)],
    }


def chosen_hosts(ctx: Context, body: dict[str, Any]) -> list[str] | JSONResponse:
    """The request's ``hosts`` (default: every device of the inventory), or the 422 answer."""
    config = ctx.config
    if not config.inventory.exists():
        return unprocessable([{"path": "hosts", "message": f"no inventory at {config.inventory}"}])
    nodes = ctx.inventory.nodes()
    names = [n.name for n in nodes]
    hosts = body.get("hosts") or [n.name for n in nodes if n.role == "device"]
    if not isinstance(hosts, list) or not hosts or any(h not in names for h in hosts):
        return unprocessable([{"path": "hosts", "message": f"nodes of the inventory ({', '.join(names)})"}])
    return [str(h) for h in hosts]


def chosen_runtime(body: dict[str, Any]) -> Runtime | JSONResponse:
    name = body.get("runtime") or DEFAULT_RUNTIME
    try:
        return registry.get(str(name))
    except registry.UnknownRuntime as exc:
        return unprocessable([{"path": "runtime", "message": str(exc)}])


@router.post("/runtimes/check", status_code=202, response_model=None)
async def runtime_check(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    """Body: ``runtime`` (default layers), ``hosts`` (default: the devices), ``model`` (for layers)."""
    body = await json_body(request)
    runtime = chosen_runtime(body)
    if isinstance(runtime, JSONResponse):
        return runtime
    hosts = chosen_hosts(ctx, body)
    if isinstance(hosts, JSONResponse):
        return hosts
    model = body.get("model") or "fake"
    if not isinstance(model, str):
        return unprocessable([{"path": "model", "message": "a model name"}])
    return ctx.actions.check(runtime, hosts, {"model": {"name": model}}).to_json()


@router.post("/runtimes/actions", status_code=202, response_model=None)
async def runtime_action(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    """Body: ``runtime`` (default layers), ``action``, ``inputs`` (validated by its schema), ``hosts``."""
    body = await json_body(request)
    runtime = chosen_runtime(body)
    if isinstance(runtime, JSONResponse):
        return runtime
    try:
        spec = ops.action_of(runtime, str(body.get("action")))
    except ops.UnknownAction as exc:
        return unprocessable([{"path": "action", "message": str(exc)}])
    raw = body.get("inputs") or {}
    if not isinstance(raw, dict):
        return unprocessable([{"path": "inputs", "message": "an object of the action's inputs"}])
    try:
        inputs = ops.validate_inputs(spec, raw)
    except ops.InputError as exc:
        return unprocessable([{"path": f"inputs.{e.path}" if e.path else "inputs", "message": e.message}
                              for e in exc.errors])  # fmt: skip
    hosts = chosen_hosts(ctx, body)
    if isinstance(hosts, JSONResponse):
        return hosts
    return ctx.actions.maintenance(runtime, spec, inputs, hosts).to_json()


@router.post("/runtimes/install", status_code=202, response_model=None)
async def runtime_install(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    """Body: ``runtime`` (an external runtime the sources file declares), ``hosts`` (default: the
    devices). Installs or updates it at its pin from the server's mirror, then checks readiness."""
    body = await json_body(request)
    if not body.get("runtime"):
        return unprocessable([{"path": "runtime", "message": "the external runtime to install"}])
    runtime = chosen_runtime(body)
    if isinstance(runtime, JSONResponse):
        return runtime
    hosts = chosen_hosts(ctx, body)
    if isinstance(hosts, JSONResponse):
        return hosts
    mirror = mirror_dir()
    try:  # refused before anything runs: not declared, or not in the mirror at its pin
        ops.install_plays(runtime.name, mirror, None, True)
    except ops.InstallError as exc:
        return unprocessable([{"path": "runtime", "message": str(exc)}])
    return ctx.actions.install(runtime, hosts, mirror).to_json()


@router.get("/actions/{action_id}")
def get_action(ctx: Ctx, action_id: str) -> dict[str, Any]:
    action = ctx.actions.items.get(action_id)
    if action is None:
        raise HTTPException(404, f"no action {action_id}")
    return action.to_json()


@router.websocket("/actions/{action_id}/terminal")
async def action_terminal(ws: WebSocket, action_id: str, offset: int | None = Query(None)) -> None:
    action = context(ws).actions.items.get(action_id)
    if action is None:
        await close_websocket(ws, 4404)
        return
    await tail(ws, action.log, offset, lambda: action.finished)
