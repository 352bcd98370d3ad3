"""What the integration tests share: NNPM apps behind a client that carries their token."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from dit.web.app import WebConfig

StartNnpm = Callable[..., "TestClient"]


@pytest.fixture
def nnpm() -> Iterator[StartNnpm]:
    """``nnpm(config)``: NNPM for ``config`` behind a started TestClient (closed when the test ends).

    The app makes its token as ``dit web`` does (``config.token`` holds it afterwards) and the client
    sends it on every request and WebSocket as ``Authorization: Bearer``; ``authorised=False`` gives a
    client that sends none. ``base_url`` defaults to the loopback address NNPM binds by default.
    """
    from fastapi.testclient import TestClient

    from dit.web.app import create_app

    with contextlib.ExitStack() as stack:

        def start(
            config: WebConfig, *, authorised: bool = True, base_url: str = "http://127.0.0.1"
        ) -> TestClient:
            app = create_app(config)
            headers: dict[str, Any] = {}
            if authorised and config.token:
                headers["authorization"] = f"Bearer {config.token}"
            return stack.enter_context(TestClient(app, base_url=base_url, headers=headers))

        yield start


def loopback_inventory(path: Path, **more_devices: Mapping[str, Any]) -> Path:
    """An inventory file of an edge and ``device1`` on this machine (local connection, loopback
    addresses), plus ``more_devices`` by name with their host variables."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    devices = {"device1": {**local, "ansible_host": "127.0.0.2"}, **more_devices}
    doc = {"all": {"vars": {"dit_python": sys.executable}, "children": {
        "edge": {"hosts": {"edge": {**local, "ansible_host": "127.0.0.1"}}},
        "devices": {"hosts": devices}}}}  # fmt: skip
    path.write_text(yaml.safe_dump(doc), "utf-8")
    return path
