"""What every NNPM router shares: the server's state (one :class:`Context` per app) and JSON helpers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, WebSocket
from fastapi.requests import HTTPConnection
from fastapi.responses import JSONResponse

from dit.scenario import FieldError
from dit.web.config import WebConfig
from dit.web.services.nodes import Inventory
from dit.web.services.probe import ProbeLoop
from dit.web.services.runtimes import Actions
from dit.web.services.store import Store


@dataclass(frozen=True)
class Context:
    """The state of one NNPM app, built once by ``create_app`` and kept in ``app.state.ctx``."""

    config: WebConfig
    token: str | None
    runs_root: Path  # absolute: run directories are absolute (RunDir)
    store: Store
    inventory: Inventory
    probe: ProbeLoop
    actions: Actions


def context(conn: HTTPConnection) -> Context:
    ctx: Context = conn.app.state.ctx
    return ctx


Ctx = Annotated[Context, Depends(context)]


def field_errors(errors: list[FieldError]) -> list[dict[str, str]]:
    return [{"path": e.path, "message": e.message} for e in errors]


def unprocessable(errors: list[dict[str, str]]) -> JSONResponse:
    return JSONResponse({"detail": "invalid", "errors": errors}, status_code=422)


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise HTTPException(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return body


async def close_websocket(ws: WebSocket, code: int) -> None:
    """Accept, then close with ``code``: a close before the handshake reaches a page as 1006, no code."""
    await ws.accept()
    await ws.close(code=code)
