"""NNPM's guard as a browser meets it: the Origin of WebSockets and posts, refusals a page can read."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from dit.web.app import WebConfig, create_app
from tests.conftest import free_port

LOOPBACK = {"host": "127.0.0.1:8765"}


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[TestClient]:
    config = WebConfig(inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs", probe="off")
    with TestClient(create_app(config), base_url="http://127.0.0.1:8765") as client:
        yield client


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


def test_the_policy_admits_the_configured_tile_host(tmp_path: Path) -> None:
    config = WebConfig(
        inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs", probe="off",
        tiles="https://{s}.tiles.example.org/{z}/{x}/{y}.png",
    )  # fmt: skip
    with TestClient(create_app(config), base_url="http://127.0.0.1:8765") as client:
        assert (
            _policy(client.get("/", headers=LOOPBACK))["img-src"]
            == "'self' data: https://*.tiles.example.org"
        )
    # no tiles configured (the default): a floor plan, and no image host beyond NNPM itself
    default = WebConfig(inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs", probe="off")
    with TestClient(create_app(default), base_url="http://127.0.0.1:8765") as client:
        assert _policy(client.get("/", headers=LOOPBACK))["img-src"] == "'self' data:"


def test_the_page_has_no_inline_script_or_handler(loopback: TestClient) -> None:
    html = loopback.get("/", headers=LOOPBACK).text
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert re.findall(r"\son[a-z]+\s*=", html) == []
    assert re.findall(r"\sstyle\s*=", html) == []
