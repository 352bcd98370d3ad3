"""NNPM's guard: the token when exposed, the loopback rules when not, the Origin of browsers always.

- **Loopback** (the default): no token, but only requests whose ``Host`` is a loopback name are
  answered (a web page cannot reach NNPM through DNS rebinding), and state-changing requests must be
  JSON (a cross-site form cannot post to it).
- **Exposed** (any other bind address): every request and WebSocket needs the token printed at
  start: ``X-NNPM-Token`` / ``Authorization: Bearer`` header, ``?token=`` query parameter (the page
  is opened as ``/?token=…`` and then keeps it in a cookie) or the ``nnpm_token`` cookie; without it
  the answer is 401.
- **Origin**, in both modes: a browser names the page that opens a WebSocket or sends a request in
  ``Origin``. WebSockets are not bound by the same-origin policy, so without this check any page
  the user visits could open the live terminal of a run on ``ws://127.0.0.1``. A WebSocket or a
  state-changing request whose ``Origin`` is not NNPM's own (``http(s)://`` + the ``Host`` it was
  addressed to) is refused with 403. Clients that are not browsers send no ``Origin`` and pass.

A refused WebSocket is accepted and then closed with code ``4000 + status`` (4401, 4403): a
WebSocket refused at the handshake reaches the page only as code 1006, with no reason to show.
"""

from __future__ import annotations

import contextlib
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
TOKEN_HEADER = "x-nnpm-token"  # noqa: S105 - a header name, not a secret
TOKEN_COOKIE = "nnpm_token"  # noqa: S105 - a cookie name
STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether a bind address is a loopback one (NNPM then needs no token)."""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def host_name(raw: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8765`` → ``[::1]``, ``localhost:80`` → ``localhost``)."""
    if raw.startswith("["):
        return raw[: raw.find("]") + 1] if "]" in raw else raw
    return raw.rsplit(":", 1)[0] if raw.count(":") == 1 else raw


def same_origin(origin: str, host: str) -> bool:
    """Whether ``origin`` (a browser's ``Origin`` header) is the server addressed as ``host``."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or not host:
        return False  # includes "null": sandboxed frames, file:// pages
    return parts.netloc.lower() == host.strip().lower()


def presented_token(headers: dict[str, str], query: dict[str, list[str]]) -> tuple[str, bool]:
    """The token a request carries, and whether it came in the query (then set as a cookie)."""
    presented = headers.get(TOKEN_HEADER) or ""
    auth = headers.get("authorization", "")
    if not presented and auth.lower().startswith("bearer "):
        presented = auth[7:].strip()
    if not presented and query.get("token"):
        return query["token"][0], True
    if not presented and "cookie" in headers:
        cookie: SimpleCookie = SimpleCookie()
        with contextlib.suppress(Exception):
            cookie.load(headers["cookie"])
        if TOKEN_COOKIE in cookie:
            presented = cookie[TOKEN_COOKIE].value
    return presented, False


class Guard:
    """ASGI middleware: the token when exposed; loopback Host and JSON bodies when not; Origin always."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    def problem(
        self, scope: Scope, headers: dict[str, str], query: dict[str, list[str]]
    ) -> tuple[int, str] | None:
        """Why the request is refused (status, reason), or None."""
        if self.token is not None:
            presented, _ = presented_token(headers, query)
            if not hmac.compare_digest(presented.encode(), self.token.encode()):
                return 401, "a valid NNPM token is required (printed by dit web at start)"
        elif host_name(headers.get("host", "")) not in LOOPBACK_HOSTS:
            return 403, "NNPM answers on its loopback address only"
        method = scope.get("method", "GET")
        changing = scope["type"] == "websocket" or method in STATE_CHANGING
        if changing and "origin" in headers and not same_origin(headers["origin"], headers.get("host", "")):
            return 403, "cross-origin request refused: the Origin is not this NNPM"
        if self.token is None and scope["type"] == "http" and method in STATE_CHANGING:
            ctype = headers.get("content-type", "")
            if headers.get("content-length", "0") != "0" and not ctype.startswith("application/json"):
                return 415, "requests must be JSON"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        refused = self.problem(scope, headers, query)
        if refused is not None:
            await self._refuse(scope, receive, send, *refused)
            return
        set_cookie = self.token is not None and scope["type"] == "http" and presented_token(headers, query)[1]
        if not set_cookie:
            await self.app(scope, receive, send)
            return
        token = self.token or ""

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                value = f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", value.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
        if scope["type"] == "websocket":
            # accept, then close: a close code after the handshake is what a page can read
            message = await receive()
            if message.get("type") != "websocket.connect":
                return
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 4000 + status, "reason": detail[:120]})
            return
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
