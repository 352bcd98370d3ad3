"""The token as a browser meets it: refused without it, the printed URL sets the cookie, the page works on.

Its own module: the browser profile (``browser_context``) is per module, so no other module's cookie
lets the first request in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Server, shot, web_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with web_server(tmp_path_factory.mktemp("nnpm-token"), "--probe", "off") as running:
        yield running


def test_the_page_needs_the_printed_url_and_then_works_from_its_cookie(
    browser_context: Any, server: Server
) -> None:
    assert server.token
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    refused = page.goto(server.url)
    assert refused is not None and refused.status == 401
    assert "?token=" in page.inner_text("body") and "dit web" in page.inner_text("body")
    shot(page, "50-token-refused")
    assert page.evaluate("() => fetch('/api/config').then((r) => r.status)") == 401

    page.goto(server.open_url)
    page.wait_for_selector("body[data-ready='1']")
    assert "token" not in page.url  # dropped from the address bar and the history
    (cookie,) = [c for c in browser_context.cookies(server.url) if c["name"].startswith("nnpm_token_")]
    port = server.url.rsplit(":", 1)[1].strip("/")
    assert cookie["name"] == f"nnpm_token_{port}" and cookie["value"] == server.token
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("() => document.cookie") == ""  # no script can read it

    page.reload()  # the address has no token now: the cookie alone
    page.wait_for_selector("body[data-ready='1']")
    assert page.evaluate("() => fetch('/api/config').then((r) => r.json()).then((c) => c.token_required)")
    saved = page.evaluate(
        "() => fetch('/api/nodes', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify({name: 'n1', role: 'device', address: '10.0.0.1', x: 10, y: 20})})"
        ".then((r) => r.status)"
    )
    assert saved == 201
    shot(page, "51-token-cookie-page")
    assert errors == [], errors
    page.close()
