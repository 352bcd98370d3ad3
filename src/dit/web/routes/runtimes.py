"""Runtimes: readiness checks and maintenance actions on the nodes, each with its live terminal."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, WebSocket
from fastapi.responses import JSONResponse

from dit.web.routes.common import Context, Ctx, close_websocket, context, json_body, unprocessable
from dit.web.runtimes import ACTIONS, CHECKS
from dit.web.terminal import tail

router = APIRouter(prefix="/api")


@router.get("/runtimes")
def get_runtimes(ctx: Ctx) -> dict[str, Any]:
    return {
        "runtimes": [
            {
                "id": "builtin",
                "title": "built-in (layer-by-layer profile + partitioned inference)",
                "checks": list(CHECKS),
            }
        ],
        "actions": [
            {"id": a.id, "title": a.title, "description": a.description, "tags": list(a.tags)}
            for a in ACTIONS.values()
        ],
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


@router.post("/runtimes/check", status_code=202, response_model=None)
async def runtime_check(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    body = await json_body(request)
    hosts = chosen_hosts(ctx, body)
    if isinstance(hosts, JSONResponse):
        return hosts
    model = body.get("model") or "fake"
    if not isinstance(model, str):
        return unprocessable([{"path": "model", "message": "a model name"}])
    return ctx.actions.check(hosts, model).to_json()


@router.post("/runtimes/actions", status_code=202, response_model=None)
async def runtime_action(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    body = await json_body(request)
    if body.get("action") not in ACTIONS:
        return unprocessable([{"path": "action", "message": f"one of {', '.join(ACTIONS)}"}])
    hosts = chosen_hosts(ctx, body)
    if isinstance(hosts, JSONResponse):
        return hosts
    return ctx.actions.maintenance(str(body["action"]), hosts).to_json()


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
