"""NNPM's guard: the token, the loopback rules, the Origin of browsers, the size and type of bodies.

- **Token**, whatever the bind address (as Jupyter does): ``dit web`` makes a random one per start
  (or takes ``DIT_NNPM_TOKEN``) and prints the URL with it. Every request and WebSocket carries it as
  ``Authorization: Bearer`` or ``X-NNPM-Token`` header, ``?token=`` query parameter (the page is opened
  as ``/?token=…``; the answer sets an HttpOnly, SameSite=Strict cookie and the page then works from the
  cookie) or that cookie, named per port (``nnpm_token_8765``: cookies ignore ports, two NNPMs on one
  host must not overwrite each other's). Without it the answer is 401 saying where the URL is. Without
  a token on a loopback bind NNPM is open to every local user, who can then run its actions with its
  rights (root, when ``dit web`` runs as root); ``--no-token`` does that on purpose, on loopback only.
- **Loopback Host**, on a loopback bind: only requests whose ``Host`` is a loopback name are answered
  (a web page cannot reach NNPM through DNS rebinding).
- **Origin**: a browser names the page that opens a WebSocket or sends a request in ``Origin``.
  WebSockets are not bound by the same-origin policy, so without this check any page the user visits
  could open the live terminal of a run on ``ws://127.0.0.1``. A WebSocket or a state-changing request
  whose ``Origin`` is not NNPM's own (``http(s)://`` + the ``Host`` it was addressed to) is refused with
  403. Clients that are not browsers send no ``Origin`` and pass.
- **Bodies**: a state-changing request with a body (``Content-Length`` above 0 or any
  ``Transfer-Encoding``) must be JSON (a cross-site form cannot post to it), and no body may be larger
  than the guard's limit: a ``Content-Length`` above it is refused with 413 before one byte of the body
  is read, and a body without ``Content-Length`` (chunked) is read here chunk by chunk only up to the
  limit, then refused, so memory stays bounded whatever a client sends. A refusal before the body is
  read closes the connection (``Connection: close``): the server does not read the rest either.

- **Headers**, on every HTTP answer (refusals too): a ``Content-Security-Policy`` that allows script
  only from NNPM's own files (no inline script, no ``eval``, no handler attributes, no plugins, no
  framing, no ``<base>``), images from NNPM, ``data:`` and the configured tile host, and no inline
  style attributes (Leaflet positions its elements through ``element.style``, which the policy does not
  govern); and ``X-Content-Type-Options: nosniff``. The page builds every view from DOM nodes and
  text; the policy is the second line if a value ever reaches markup (stored XSS, issue 16).
  One answer brings its own, stricter policy (:data:`REPORT_CSP`), which then replaces this one: a report
  viewed in the browser (its styles are inline in the file) runs in a sandbox with no script at all.

A refused WebSocket is accepted and then closed with code ``4000 + status`` (4401, 4403): a
WebSocket refused at the handshake reaches the page only as code 1006, with no reason to show.
"""

from __future__ import annotations

import contextlib
import hmac
import html
import json
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
TOKEN_ENV = "DIT_NNPM_TOKEN"  # noqa: S105 - the name of the variable, not a secret
TOKEN_HEADER = "x-nnpm-token"  # noqa: S105 - a header name, not a secret
TOKEN_COOKIE = "nnpm_token"  # noqa: S105 - a cookie name (suffixed with the port)
# it travels in a URL and a cookie unescaped, and must not be guessable by trying
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9._~-]{16,256}")
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
REPORT_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'; sandbox"
)
"""A ``dit report`` file viewed in NNPM (a comparison): its own inline styles and data: images, nothing
else, in a sandbox (no script runs whatever the file holds)."""
HOW_TO_GET_IN = (
    "NNPM needs its token: open the URL with ?token=… that `dit web` printed when it started (the page "
    "then keeps the token in a cookie), or send the header 'Authorization: Bearer <token>'"
)
HOW_TO_GET_IN_SHORT = (
    "NNPM needs its token: open the URL with ?token=… that dit web printed"  # a close reason: ≤ 123 bytes
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether a bind address is a loopback one (only local users can reach it)."""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def new_token() -> str:
    """A token for one start of NNPM (256 random bits)."""
    return secrets.token_urlsafe(32)


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be NNPM's token, or None."""
    if TOKEN_SHAPE.fullmatch(token):
        return None
    return (
        "must be 16 to 256 characters from A-Z a-z 0-9 . _ ~ - (it travels in a URL and a cookie), "
        "e.g. the output of: python3 -c 'import secrets; print(secrets.token_urlsafe())'"
    )


def cookie_name(port: int) -> str:
    """The token's cookie for NNPM on ``port`` (browsers share cookies between the ports of a host)."""
    return f"{TOKEN_COOKIE}_{port}"


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


def presented_token(headers: dict[str, str], query: dict[str, list[str]], cookie: str) -> tuple[str, bool]:
    """The token a request carries, and whether it came in the query (then set as the cookie ``cookie``)."""
    presented = headers.get(TOKEN_HEADER) or ""
    auth = headers.get("authorization", "")
    if not presented and auth.lower().startswith("bearer "):
        presented = auth[7:].strip()
    if not presented and query.get("token"):
        return query["token"][0], True
    if not presented and "cookie" in headers:
        jar: SimpleCookie = SimpleCookie()
        with contextlib.suppress(Exception):
            jar.load(headers["cookie"])
        if cookie in jar:
            presented = jar[cookie].value
    return presented, False


def is_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` is JSON (``application/json``, parameters allowed)."""
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def mib(n_bytes: int) -> str:
    return f"{n_bytes / (1024 * 1024):g} MiB"


class Guard:
    """ASGI middleware: the token, the loopback Host, the Origin, the size and type of bodies."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        *,
        loopback: bool,
        port: int,
        max_body_bytes: int,
        tiles: str | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.loopback = loopback
        self.cookie = cookie_name(port)
        self.max_body_bytes = max_body_bytes
        self.headers = security_headers(tiles)

    def problem(
        self, scope: Scope, headers: dict[str, str], query: dict[str, list[str]]
    ) -> tuple[int, str] | None:
        """Why the request is refused (status, reason), or None. Reads no body."""
        if self.loopback and host_name(headers.get("host", "")) not in LOOPBACK_HOSTS:
            return 403, "NNPM answers on its loopback address only"
        if self.token is not None:
            presented, _ = presented_token(headers, query, self.cookie)
            if not hmac.compare_digest(presented.encode(), self.token.encode()):
                return 401, HOW_TO_GET_IN
        method = scope.get("method", "GET")
        changing = scope["type"] == "websocket" or method in STATE_CHANGING
        if changing and "origin" in headers and not same_origin(headers["origin"], headers.get("host", "")):
            return 403, "cross-origin request refused: the Origin is not this NNPM"
        if scope["type"] != "http":
            return None
        length = headers.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                return 400, f"Content-Length {length[:40]!r} is not a number of bytes"
            if int(length) > self.max_body_bytes:
                return 413, (
                    f"the request body ({mib(int(length))}) is larger than NNPM accepts "
                    f"({mib(self.max_body_bytes)})"
                )
        has_body = "transfer-encoding" in headers or (length is not None and int(length) > 0)
        if method in STATE_CHANGING and has_body and not is_json(headers.get("content-type", "")):
            return 415, "requests must be JSON (Content-Type: application/json)"
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
            await self._refuse(scope, receive, send, *refused, page=self._wants_page(scope, headers))
            return
        if scope["type"] == "http" and "content-length" not in headers and "transfer-encoding" in headers:
            bounded = await self._read_bounded(receive)
            if bounded is None:
                detail = f"the request body is larger than NNPM accepts ({mib(self.max_body_bytes)})"
                await self._refuse(scope, receive, send, 413, detail)
                return
            receive = bounded
        if (
            self.token is not None
            and scope["type"] == "http"
            and presented_token(headers, query, self.cookie)[1]
        ):
            cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
            send = self._with_headers(send, [(b"set-cookie", cookie.encode("latin-1"))])
        await self.app(scope, receive, send)

    async def _read_bounded(self, receive: Receive) -> Receive | None:
        """The body read up to the limit and handed on as one message; None when it is larger."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                first = message
                break
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        handed: list[Message] = [first]

        async def replaying() -> Message:
            return handed.pop() if handed else await receive()

        return replaying

    @staticmethod
    def _wants_page(scope: Scope, headers: dict[str, str]) -> bool:
        """Whether the refusal should be a page (a browser navigating), not JSON."""
        return (
            scope["type"] == "http"
            and scope.get("method") == "GET"
            and not str(scope.get("path", "")).startswith("/api/")
            and "text/html" in headers.get("accept", "")
        )

    @staticmethod
    def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
        """``send`` that adds ``extra`` to the response's headers."""

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                # an answer with its own policy keeps it (REPORT_CSP, stricter): two policies would both apply
                own = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in extra if h[0] not in own)]
            await send(message)

        return sending

    @staticmethod
    async def _refuse(
        scope: Scope, receive: Receive, send: Send, status: int, detail: str, *, page: bool = False
    ) -> None:
        if scope["type"] == "websocket":
            # accept, then close: a close code after the handshake is what a page can read
            message = await receive()
            if message.get("type") != "websocket.connect":
                return
            await send({"type": "websocket.accept"})
            reason = HOW_TO_GET_IN_SHORT if status == 401 else detail[:120]
            await send({"type": "websocket.close", "code": 4000 + status, "reason": reason})
            return
        if page:
            text = html.escape(detail)
            body = (
                "<!doctype html><html lang=en><head><meta charset=utf-8><title>NNPM: "
                f"{status}</title></head><body><h1>NNPM</h1><p>{text}</p></body></html>"
            ).encode()
            ctype = b"text/html; charset=utf-8"
        else:
            body = json.dumps({"detail": detail}).encode()
            ctype = b"application/json"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", ctype),
                    (b"content-length", str(len(body)).encode()),
                    # the body was not read: the connection cannot carry another request
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
