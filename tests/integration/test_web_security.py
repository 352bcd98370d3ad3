"""NNPM's guard as a browser meets it: the token (on loopback too), the Origin of WebSockets and posts,
refusals a page can read, and bodies refused by size and type before they are read."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from dit.web.app import MAX_BODY_BYTES, WebConfig, create_app
from dit.web.security import TOKEN_ENV
from tests.conftest import dit_env, free_port
from tests.e2e.conftest import Server, web_server
from tests.integration.conftest import StartNnpm

LOOPBACK = {"host": "127.0.0.1:8765"}


def config_for(tmp_path: Path, **options: Any) -> WebConfig:
    return WebConfig(inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs", probe="off", **options)


@pytest.fixture
def loopback(tmp_path: Path, nnpm: StartNnpm) -> TestClient:
    return nnpm(config_for(tmp_path), base_url="http://127.0.0.1:8765")


def test_websocket_from_a_foreign_origin_is_refused(loopback: TestClient) -> None:
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        loopback.websocket_connect(
            "/api/runs/a/b/terminal", headers={**LOOPBACK, "origin": "https://evil.example"}
        ) as ws,
    ):
        ws.receive_json()
    assert refused.value.code == 4403
    # a page on another port of the same machine is another origin too
    with (
        pytest.raises(WebSocketDisconnect) as other_port,
        loopback.websocket_connect(
            "/api/runs/a/b/terminal", headers={**LOOPBACK, "origin": "http://127.0.0.1:9999"}
        ) as ws,
    ):
        ws.receive_json()
    assert other_port.value.code == 4403


@pytest.mark.parametrize("origin", ["http://127.0.0.1:8765", "http://localhost:8765", None])
def test_websocket_from_the_apps_own_origin_is_accepted(loopback: TestClient, origin: str | None) -> None:
    host = "localhost:8765" if origin and "localhost" in origin else "127.0.0.1:8765"
    headers = {"host": host, **({"origin": origin} if origin else {})}
    with (
        pytest.raises(WebSocketDisconnect) as past_guard,
        loopback.websocket_connect("/api/runs/a/b/terminal", headers=headers) as ws,
    ):
        ws.receive_json()
    assert past_guard.value.code == 4404  # the guard let it through: there is no such run


def test_state_changing_request_from_a_foreign_origin_is_refused(loopback: TestClient) -> None:
    body = {"name": "n1", "role": "device", "address": "10.0.0.1", "x": 1, "y": 2}  # on the floor plan
    foreign = loopback.post("/api/nodes", json=body, headers={**LOOPBACK, "origin": "https://evil.example"})
    assert foreign.status_code == 403 and "origin" in foreign.json()["detail"].lower()
    assert loopback.get("/api/nodes", headers=LOOPBACK).json()["nodes"] == []
    own = loopback.post("/api/nodes", json=body, headers={**LOOPBACK, "origin": "http://127.0.0.1:8765"})
    assert own.status_code == 201
    # reads stay open to any origin's navigation (the page itself, its static files)
    assert (
        loopback.get("/api/nodes", headers={**LOOPBACK, "origin": "https://evil.example"}).status_code == 200
    )


@pytest.fixture
def exposed_server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """The exposed app under a real uvicorn (the TestClient does not show what a browser gets)."""
    import uvicorn

    port = free_port()
    # 127.0.0.2 is loopback for the socket, but not a loopback *name* for the guard: a token is needed
    config = WebConfig(
        host="0.0.0.0", port=port, inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs", probe="off"
    )
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets-sansio")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        assert config.token
        yield port, config.token
    finally:
        server.should_exit = True
        thread.join(10)


def test_tokenless_websocket_is_closed_with_4401_on_a_real_server(exposed_server: tuple[int, str]) -> None:
    port, token = exposed_server
    url = f"ws://127.0.0.1:{port}/api/runs/a/b/terminal"
    try:
        with connect(url, open_timeout=10) as ws, pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    except InvalidStatus as exc:  # refused at the handshake: the page only sees code 1006
        pytest.fail(f"the handshake was refused with HTTP {exc.response.status_code}, not closed with 4401")
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    with connect(f"{url}?token={token}", open_timeout=10) as ws, pytest.raises(ConnectionClosed) as past:
        ws.recv(timeout=10)
    assert past.value.rcvd is not None and past.value.rcvd.code == 4404


def _policy(response: object) -> dict[str, str]:
    header = response.headers.get("content-security-policy", "")  # type: ignore[attr-defined]
    return {d.split(" ", 1)[0]: d.split(" ", 1)[1] for d in header.split("; ") if " " in d}


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", "/", LOOPBACK),
        ("GET", "/static/app.js", LOOPBACK),
        ("GET", "/vendor/leaflet/leaflet.js", LOOPBACK),
        ("GET", "/api/nodes", LOOPBACK),
        ("GET", "/api/no-such-thing", LOOPBACK),  # a 404
        ("GET", "/", {"host": "evil.example"}),  # refused by the guard: 403
        ("POST", "/api/nodes", {**LOOPBACK, "origin": "https://evil.example"}),  # 403
        ("POST", "/api/nodes", LOOPBACK),  # an empty body: 422
    ],
)
def test_every_answer_carries_the_content_security_policy(
    loopback: TestClient, method: str, path: str, headers: dict[str, str]
) -> None:
    response = loopback.request(method, path, headers=headers)
    policy = _policy(response)
    assert policy.get("script-src") == "'self'", (response.status_code, policy)  # no inline script
    assert policy.get("object-src") == "'none'"
    assert policy.get("base-uri") == "'none'"
    assert policy.get("frame-ancestors") == "'none'"
    assert "unsafe-inline" not in response.headers["content-security-policy"]
    assert policy["img-src"].split()[:2] == ["'self'", "data:"]
    assert response.headers.get("x-content-type-options") == "nosniff"


def test_the_policy_admits_the_configured_tile_host(tmp_path: Path, nnpm: StartNnpm) -> None:
    tiled = nnpm(config_for(tmp_path, tiles="https://{s}.tiles.example.org/{z}/{x}/{y}.png"))
    assert _policy(tiled.get("/", headers=LOOPBACK))["img-src"] == "'self' data: https://*.tiles.example.org"
    # no tiles configured (the default): a floor plan, and no image host beyond NNPM itself
    default = nnpm(config_for(tmp_path))
    assert _policy(default.get("/", headers=LOOPBACK))["img-src"] == "'self' data:"


def test_the_page_has_no_inline_script_or_handler(loopback: TestClient) -> None:
    html = loopback.get("/", headers=LOOPBACK).text
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert re.findall(r"\son[a-z]+\s*=", html) == []
    assert re.findall(r"\sstyle\s*=", html) == []


# -- the token, on loopback too (issue 28 item 8a) ---------------------------------------------------

NODE = {"name": "n1", "role": "device", "address": "10.0.0.1", "x": 1, "y": 2}


def test_loopback_refuses_the_api_and_the_page_without_the_token(tmp_path: Path, nnpm: StartNnpm) -> None:
    config = config_for(tmp_path)
    anonymous = nnpm(config, authorised=False, base_url="http://127.0.0.1:8765")
    assert config.token and len(config.token) >= 43  # made per start: 256 random bits
    api = anonymous.get("/api/nodes", headers=LOOPBACK)
    assert api.status_code == 401 and api.headers["content-type"] == "application/json"
    assert "?token=" in api.json()["detail"] and "Authorization: Bearer" in api.json()["detail"]
    page = anonymous.get("/", headers={**LOOPBACK, "accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert "?token=" in page.text and "dit web" in page.text
    # the road of issue 28 item 1: a runtime action, root command execution when NNPM runs as root
    action = {"runtime": "layers", "action": "check", "inputs": {}, "hosts": ["edge"]}
    assert anonymous.post("/api/runtimes/actions", json=action, headers=LOOPBACK).status_code == 401
    assert anonymous.post("/api/nodes", json=NODE, headers=LOOPBACK).status_code == 401
    wrong = {**LOOPBACK, "authorization": "Bearer " + "x" * len(config.token)}
    assert anonymous.get("/api/nodes", headers=wrong).status_code == 401
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        anonymous.websocket_connect("/api/runs/a/b/terminal", headers=LOOPBACK) as ws,
    ):
        ws.receive_json()
    assert refused.value.code == 4401 and "?token=" in (refused.value.reason or "")
    assert not (tmp_path / "inv.yml").exists()


def test_the_query_token_sets_a_strict_httponly_cookie_the_page_then_works_from(
    tmp_path: Path, nnpm: StartNnpm
) -> None:
    config = config_for(tmp_path)
    browser = nnpm(config, authorised=False, base_url="http://127.0.0.1:8765")
    assert browser.get("/?token=wrong", headers=LOOPBACK).status_code == 401 and not browser.cookies
    opened = browser.get(f"/?token={config.token}", headers=LOOPBACK)
    assert opened.status_code == 200 and "NNPM" in opened.text
    cookie = opened.headers["set-cookie"]
    # named after the port: browsers send a host's cookies to all its ports
    assert cookie.startswith(f"nnpm_token_8765={config.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    # from now on the cookie alone: the page's scripts, its API calls, its posts, its WebSocket
    assert browser.get("/static/app.js", headers=LOOPBACK).status_code == 200
    assert browser.get("/api/config", headers=LOOPBACK).json()["token_required"] is True
    own = {**LOOPBACK, "origin": "http://127.0.0.1:8765"}
    assert browser.post("/api/nodes", json=NODE, headers=own).status_code == 201
    with (
        pytest.raises(WebSocketDisconnect) as past_guard,
        browser.websocket_connect("ws://127.0.0.1:8765/api/runs/a/b/terminal", headers=own) as ws,
    ):
        ws.receive_json()
    assert past_guard.value.code == 4404  # no such run: the cookie got it past the guard
    browser.cookies.clear()
    assert browser.get("/api/config", headers=LOOPBACK).status_code == 401


def test_api_clients_send_the_token_as_a_bearer_header(tmp_path: Path, nnpm: StartNnpm) -> None:
    token = "given-by-DIT_NNPM_TOKEN"
    client = nnpm(config_for(tmp_path, token=token), authorised=False)
    assert client.get("/api/nodes", headers={"authorization": f"Bearer {token}"}).status_code == 200
    assert (
        client.post("/api/nodes", json=NODE, headers={"authorization": f"Bearer {token}"}).status_code == 201
    )
    assert client.get("/api/nodes", headers={"authorization": f"Bearer {token[:-1]}"}).status_code == 401
    assert client.get("/api/nodes", headers={"authorization": token}).status_code == 401  # not a Bearer
    assert not client.cookies  # a header sets no cookie


def test_tokens_differ_per_start_and_unfit_ones_are_refused(tmp_path: Path) -> None:
    first, second = config_for(tmp_path), config_for(tmp_path)
    assert first.ensure_token() != second.ensure_token()
    for bad in ("short", "has space in the token", "semi;colon-breaks-the-cookie"):
        with pytest.raises(ValueError, match=TOKEN_ENV):
            config_for(tmp_path, token=bad).ensure_token()
    with pytest.raises(ValueError, match="--no-token"):
        config_for(tmp_path, host="0.0.0.0", no_token=True).ensure_token()
    assert config_for(tmp_path, no_token=True).ensure_token() is None


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_dit_web_prints_the_url_with_its_token(tmp_path: Path) -> None:
    with web_server(tmp_path, "--probe", "off") as served:
        assert served.token
        log = (tmp_path / "server.log").read_text("utf-8")
        assert f"NNPM: {served.url}?token={served.token}\n" in log
        assert get(served.url + "api/config")[0] == 401
        status, config = get(served.url + "api/config", served.auth)
        assert status == 200 and config["token_required"] is True


def test_no_token_serves_any_local_user_and_says_so_in_one_line(tmp_path: Path) -> None:
    with web_server(tmp_path, "--probe", "off", "--no-token") as served:
        status, config = get(served.url + "api/config")
        assert status == 200 and config["token_required"] is False
        lines = (tmp_path / "server.log").read_text("utf-8").splitlines()
    assert f"NNPM: {served.url}" in lines
    (warning,) = [line for line in lines if "--no-token" in line]
    assert "any local user of this machine can drive NNPM" in warning
    assert ("as root" in warning) == (os.geteuid() == 0)


@pytest.mark.parametrize(
    ("options", "token", "says"),
    [
        (["--no-token", "--host", "0.0.0.0"], None, "--no-token: NNPM bound to 0.0.0.0 would be open"),
        ([], "short", f"{TOKEN_ENV}: must be 16 to 256 characters"),
        (["--no-token"], "a-token-given-as-well", f"{TOKEN_ENV} gives a token as well"),
    ],
)
def test_dit_web_refuses_a_token_setting_that_cannot_be_honoured(
    tmp_path: Path, options: list[str], token: str | None, says: str
) -> None:
    env = dit_env()
    env.pop(TOKEN_ENV, None)
    if token:
        env[TOKEN_ENV] = token
    argv = [sys.executable, "-m", "dit", "web", "--port", str(free_port()), "--inventory", str(tmp_path / "i.yml"),
            "--runs-dir", str(tmp_path / "runs"), "--probe", "off", *options]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and says in done.stderr, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr


# -- bodies: size before reading, JSON also when chunked (issue 28 item 8b, 8c) ---------------------


def test_a_chunked_body_must_be_json_too(loopback: TestClient) -> None:
    def chunks(text: str) -> Iterator[bytes]:
        yield text.encode()  # no Content-Length: httpx sends Transfer-Encoding: chunked

    body = json.dumps(NODE)
    plain = loopback.post(
        "/api/nodes", content=chunks(body), headers={**LOOPBACK, "content-type": "text/plain"}
    )
    assert plain.status_code == 415 and "JSON" in plain.json()["detail"]
    assert loopback.get("/api/nodes", headers=LOOPBACK).json()["nodes"] == []
    as_json = {**LOOPBACK, "content-type": "application/json"}
    assert loopback.post("/api/nodes", content=chunks(body), headers=as_json).status_code == 201
    # a type that only starts like JSON is not JSON
    faked = {**LOOPBACK, "content-type": "application/jsonx"}
    assert loopback.post("/api/nodes", json={**NODE, "name": "n2"}, headers=faked).status_code == 415


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text("utf-8").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def read_answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass  # closed with our unread bytes in its buffer; what it answered is kept
    return answer


def request_head(served: Server, method: str, path: str, *headers: str) -> bytes:
    port = served.url.rsplit(":", 1)[1].strip("/")
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Authorization: Bearer {served.token}",
             "Content-Type: application/json", *headers]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_an_oversized_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    huge = 150 * 1024 * 1024  # the body that made NNPM peak at 537 MB before its 413
    with web_server(tmp_path, "--probe", "off") as served:
        port = int(served.url.rsplit(":", 1)[1].strip("/"))
        before = peak_rss_bytes(served.proc.pid)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            # a Content-Length of 150 MiB and 40 bytes of it: the answer comes without the rest
            sock.sendall(request_head(served, "PUT", "/api/floorplan/image", f"Content-Length: {huge}"))
            sock.sendall(b'{"content_type": "image/png", "data": "')
            answer = read_answer(sock)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b"connection: close" in head.lower()  # the rest of the body is never read either
        assert json.loads(body)["detail"] == (
            f"the request body (150 MiB) is larger than NNPM accepts ({MAX_BODY_BYTES // 2**20} MiB)"
        )

        # chunked, no Content-Length: read up to the limit, then refused; the sender is cut off
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(request_head(served, "PUT", "/api/floorplan/image", "Transfer-Encoding: chunked"))
            sent = [0]

            def stream() -> None:
                chunk = b"A" * (1024 * 1024)
                frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
                try:
                    while sent[0] < huge:
                        sock.sendall(frame)
                        sent[0] += len(chunk)
                    sock.sendall(b"0\r\n\r\n")
                except OSError:
                    pass  # the server closed the connection: the point

            sender = threading.Thread(target=stream, daemon=True)
            sender.start()
            answer = read_answer(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # ends the sender if it still blocks
            sender.join(60)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b"larger than NNPM accepts" in answer
        assert sent[0] < huge  # the server stopped reading long before the end
        grown = peak_rss_bytes(served.proc.pid) - before
        # at most the limit held in memory (plus buffers), never the 150 MiB
        assert grown < MAX_BODY_BYTES + 32 * 1024 * 1024, f"peak RSS grew by {grown / 2**20:.0f} MiB"
        status, _ = get(served.url + "api/config", served.auth)
        assert status == 200  # and NNPM goes on answering
