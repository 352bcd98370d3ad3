"""NNPM end to end: a real ``dit web`` server and Debian's chromium driven by Playwright for Python.

Never ``playwright install``: the browser is ``/usr/bin/chromium`` (``apt-get install chromium``). The
tests are marked ``e2e`` and skip, saying why, when Playwright or chromium is missing. Screenshots of
every step go to ``tests/e2e/artifacts/``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from dit.web.security import TOKEN_ENV
from tests.conftest import REPO, dit_env, free_port

CHROMIUM = os.environ.get("DIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: NNPM in a real headless browser (Playwright + Debian's chromium)"
    )


@dataclass
class Server:
    url: str  # the base: API paths are joined to it; requests need the token (or the page's cookie)
    root: Path
    runs: Path
    inventory: Path
    proc: subprocess.Popen[bytes]
    token: str | None  # None: started with --no-token

    @property
    def open_url(self) -> str:
        """The URL to open the page with, as ``dit web`` prints it: the answer sets the token's cookie."""
        return f"{self.url}?token={self.token}" if self.token else self.url

    @property
    def auth(self) -> dict[str, str]:
        """The header a client that is not the page sends."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


@contextmanager
def web_server(
    root: Path,
    *options: str,
    inventory: Path | None = None,
    runs: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """``dit web OPTIONS`` on a free loopback port, run from ``root`` (its log in ``server.log``), up
    until the block ends; the inventory and runs directory default to ``root``'s. The token is made here
    and given as ``DIT_NNPM_TOKEN`` (unless ``--no-token`` is among the options); open ``open_url``."""
    inventory = inventory or root / "inventory.yml"
    runs = runs or root / "runs"
    port = free_port()
    token = None if "--no-token" in options else secrets.token_urlsafe(32)
    env = dict(env or dit_env())
    env.pop(TOKEN_ENV, None)
    if token:
        env[TOKEN_ENV] = token
    argv = [
        sys.executable, "-m", "dit", "web", "--port", str(port), "--inventory", str(inventory),
        "--runs-dir", str(runs), "--scenarios-dir", str(REPO / "scenarios"), *options,
    ]  # fmt: skip
    with (root / "server.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert proc.poll() is None, (root / "server.log").read_text()
                time.sleep(0.2)
        try:
            yield Server(f"http://127.0.0.1:{port}/", root, runs, inventory, proc, token)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("nnpm")
    closed = free_port()  # nothing listens here: the tile layer is unreachable, as on an offline rack
    with web_server(root, "--tiles", f"http://127.0.0.1:{closed}/{{z}}/{{x}}/{{y}}.png") as running:
        yield running


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        context.set_default_timeout(30_000)
        yield context
        context.close()


#: How long the page may take to be ready (its first four API answers): at the start of a parallel
#: pass, with three test workers and their servers starting, they took over 30 s twice in CI.
READY_TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def page(browser_context: Any, server: Server) -> Iterator[Any]:
    page = browser_context.new_page()
    errors: list[str] = []
    outstanding: dict[str, float] = {}  # request URL -> when it was sent (monotonic)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda request: outstanding.__setitem__(request.url, time.monotonic()))
    page.on("requestfinished", lambda request: outstanding.pop(request.url, None))
    failed: list[str] = []  # (the map's tiles fail by design: a diagnosis, not an error)
    page.on("requestfailed", lambda request: failed.append(f"{request.url}: {request.failure}"))
    page.goto(server.open_url)
    try:
        page.wait_for_selector("body[data-ready='1']", timeout=READY_TIMEOUT_MS)
    except Exception as exc:
        now = time.monotonic()
        waiting = {url: round(now - sent, 1) for url, sent in outstanding.items()}
        log = (server.root / "server.log").read_text(errors="replace")[-3000:]
        raise AssertionError(
            f"the page was not ready in {READY_TIMEOUT_MS / 1000:.0f} s ({exc}); requests still waiting "
            f"(seconds): {waiting}; failed: {failed}; page errors: {errors}; the server's log ends:\n{log}"
        ) from exc
    yield page
    assert errors == [], errors


def shot(page: Any, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


class HeldRequests:
    """Requests matching ``pattern`` held back (as a slow server would answer them) until
    :meth:`release`: a test acts on the page meanwhile, then lets the late answers land."""

    #: Holds a test left in place when it failed before releasing them: let go after that test
    #: (:func:`_let_go_of_held_requests`), or every later test on the module's one page would wait on them.
    left: ClassVar[list[HeldRequests]] = []

    def __init__(self, page: Any, pattern: str) -> None:
        self.page, self.pattern = page, pattern
        self.routes: list[Any] = []
        page.route(pattern, self._hold)
        HeldRequests.left.append(self)

    def _hold(self, route: Any) -> None:
        self.routes.append(route)

    def release(self, missing: str) -> None:
        """Let every held request through and wait for its answer; ``missing``: the assertion's message
        when none was made."""
        for _ in range(100):
            if self.routes:
                break
            self.page.wait_for_timeout(50)
        assert self.routes, missing
        with self.page.expect_response(self.pattern):
            for route in self.routes:
                route.continue_()
        self.page.unroute(self.pattern)
        HeldRequests.left.remove(self)

    def let_go(self) -> None:
        """Release what is held without waiting for it (after a failed test)."""
        for route in self.routes:
            with contextlib.suppress(Exception):
                route.continue_()
        with contextlib.suppress(Exception):
            self.page.unroute(self.pattern)


@pytest.fixture(autouse=True)
def _let_go_of_held_requests() -> Iterator[None]:
    yield
    while HeldRequests.left:
        HeldRequests.left.pop().let_go()
