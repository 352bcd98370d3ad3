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

- **Headers**, on every HTTP answer (refusals too): a ``Content-Security-Policy`` that allows script
  only from NNPM's own files (no inline script, no ``eval``, no handler attributes, no plugins, no
  framing, no ``<base>``), images from NNPM, ``data:`` and the configured tile host, and no inline
  style attributes (Leaflet positions its elements through ``element.style``, which the policy does not
  govern); and ``X-Content-Type-Options: nosniff``. The page builds every view from DOM nodes and
  text; the policy is the second line if a value ever reaches markup (stored XSS, issue 16).

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
CSP_BASE = (
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
)

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


def tile_source(template: str | None) -> str | None:
    """The CSP source of a tile URL template (``https://{s}.tile.example.org/…`` → ``https://*.tile.example.org``)."""
    if not template:
        return None
    parts = urlsplit(template.replace("{s}", "*"))
    if parts.scheme not in ("http", "https") or not parts.netloc or any(c in parts.netloc for c in "{} ;,'"):
        return None  # a template CSP cannot name: tiles stay blocked rather than the policy widened
    return f"{parts.scheme}://{parts.netloc}"


def security_headers(tiles: str | None = None) -> list[tuple[bytes, bytes]]:
    """The headers every HTTP answer carries: the Content-Security-Policy and ``nosniff``."""
    images = " ".join(s for s in ("'self'", "data:", tile_source(tiles)) if s)
    policy = "; ".join((*CSP_BASE, f"img-src {images}"))
    return [
        (b"content-security-policy", policy.encode("latin-1")),
        (b"x-content-type-options", b"nosniff"),
    ]


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

    def __init__(self, app: ASGIApp, token: str | None, tiles: str | None = None) -> None:
        self.app = app
        self.token = token
        self.headers = security_headers(tiles)

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
        if scope["type"] == "http":
            send = self._with_headers(send, self.headers)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        refused = self.problem(scope, headers, query)
        if refused is not None:
            await self._refuse(scope, receive, send, *refused)
            return
        if self.token is not None and scope["type"] == "http" and presented_token(headers, query)[1]:
            cookie = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            send = self._with_headers(send, [(b"set-cookie", cookie.encode("latin-1"))])
        await self.app(scope, receive, send)

    @staticmethod
    def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
        """``send`` that adds ``extra`` to the response's headers."""

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        return sending

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
