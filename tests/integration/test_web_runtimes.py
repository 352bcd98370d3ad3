"""NNPM's Runtimes page through the API: every installed runtime, readiness only from the real check
(a node that does not answer is unreachable, with the reason, never ready) and maintenance actions whose
Ansible output streams live through the action's terminal WebSocket (issue 12 item 7, issue 16 item 2)."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dit.runtime_api import registry
from dit.web.app import WebConfig
from tests.conftest import REPO, install_fixture_package
from tests.integration.conftest import StartNnpm, loopback_inventory

LOOPBACK = {"host": "127.0.0.1"}


def dead_port() -> int:
    """A TCP port on which nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def runtime_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_fixture_package("runtime_pkg", tmp_path_factory.mktemp("runtime"))


@pytest.fixture
def client(
    tmp_path: Path, runtime_site: Path, monkeypatch: pytest.MonkeyPatch, nnpm: StartNnpm
) -> Iterator[TestClient]:
    # the echo plug-in, found through its entry point, as an installed package would be
    monkeypatch.syspath_prepend(str(runtime_site))
    registry.reset()
    # ssh to a port nothing answers on: the node does not answer
    ghost = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": dead_port(),
             "ansible_user": "nobody", "ansible_ssh_common_args": "-o ConnectTimeout=3 -o BatchMode=yes"}  # fmt: skip
    inventory = loopback_inventory(tmp_path / "inventory.yml", ghost=ghost)
    config = WebConfig(
        inventory=inventory, runs_dir=tmp_path / "runs", scenarios_dir=REPO / "scenarios", probe="off"
    )
    yield nnpm(config)
    registry.reset()


def finish(client: TestClient, action: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and action["state"] == "running":
        time.sleep(0.3)
        action = client.get(f"/api/actions/{action['id']}").json()
    assert action["state"] != "running", action
    return action


def terminal_lines(client: TestClient, action_id: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    with client.websocket_connect(f"/api/actions/{action_id}/terminal", headers=LOOPBACK) as ws:
        while True:
            message = ws.receive_json()
            if message["type"] == "lines":
                lines += message["lines"]
            if message["type"] == "end":
                return lines


def test_every_installed_runtime_is_listed_with_its_block_checks_and_actions(client: TestClient) -> None:
    info = client.get("/api/runtimes").json()
    runtimes = {r["name"]: r for r in info["runtimes"]}
    assert {"layers", "echo"} <= set(runtimes)  # the built-in and the entry-point plug-in
    assert runtimes["echo"]["checks"] == ["python", "tcp"]
    assert runtimes["echo"]["block"]["properties"]["placement"]["enum"] == ["round_robin", "greedy"]
    assert [a["name"] for a in runtimes["echo"]["actions"]] == ["say"]
    assert {a["name"] for a in runtimes["layers"]["actions"]} == {"install-runtime", "distribute-weights"}
    assert info["readiness"] == {}  # nothing checked yet: no verdict, and certainly no green one


def test_a_node_that_does_not_answer_is_unreachable_with_its_reason(client: TestClient) -> None:
    # issue 16: the page showed a green "fake needs no framework" for every node, even one that is down
    started = client.post(
        "/api/runtimes/check", json={"runtime": "layers", "hosts": ["device1", "ghost"], "model": "fake"}
    )
    assert started.status_code == 202
    action = finish(client, started.json())
    nodes = {n["host"]: n for n in action["nodes"]}
    assert nodes["device1"]["state"] == "ok", nodes["device1"]
    assert {c["name"] for c in nodes["device1"]["checks"]} == {"python", "dit-device.pyz"}
    ghost = nodes["ghost"]
    assert ghost["state"] == "unreachable", ghost
    assert "ssh" in ghost["reason"].lower() or "connect" in ghost["reason"].lower(), ghost
    assert all(not c["ok"] for c in ghost["checks"])  # no check of its is a pass
    latest = client.get("/api/runtimes").json()["readiness"]["layers"]
    assert latest["ghost"]["state"] == "unreachable" and latest["device1"]["state"] == "ok"
    lines = terminal_lines(client, action["id"])
    assert any(x["n"] == "ghost" and "unreachable" in x["x"] for x in lines)


def test_a_failing_check_of_a_plugin_is_failed_and_an_unknown_runtime_is_refused(client: TestClient) -> None:
    refused = client.post("/api/runtimes/check", json={"runtime": "nope", "hosts": ["device1"]})
    assert refused.status_code == 422 and refused.json()["errors"][0]["path"] == "runtime"
    action = finish(
        client, client.post("/api/runtimes/check", json={"runtime": "echo", "hosts": ["device1"]}).json()
    )
    assert action["nodes"] == [
        {
            "host": "device1",
            "state": "ok",
            "reason": "",
            "checks": [
                {"name": "python", "ok": True, "detail": sys.version.split()[0]},
                {"name": "tcp", "ok": True, "detail": "listens"},
            ],
        }
    ]


def test_a_maintenance_action_streams_its_ansible_output_to_the_terminal(client: TestClient) -> None:
    bad = client.post(
        "/api/runtimes/actions", json={"runtime": "echo", "action": "say", "inputs": {"count": 9}}
    )
    assert bad.status_code == 422
    assert {e["path"] for e in bad.json()["errors"]} == {"inputs.message", "inputs.count"}
    assert client.post("/api/runtimes/actions", json={"runtime": "echo", "action": "nope"}).status_code == 422
    started = client.post(
        "/api/runtimes/actions",
        json={
            "runtime": "echo",
            "action": "say",
            "inputs": {"message": "hello-nnpm", "count": 2},
            "hosts": ["device1"],
        },
    )
    assert started.status_code == 202
    # the terminal follows the log while the action runs, and ends when it finishes
    lines = terminal_lines(client, started.json()["id"])
    action = client.get(f"/api/actions/{started.json()['id']}").json()
    assert action["state"] == "done", action
    said = [x for x in lines if x["n"] == "device1" and x["s"] == "stdout" and x["x"] == "hello-nnpm"]
    assert len(said) == 2, lines
    assert any(x["n"] == "device1" and x["x"].startswith("ok: Say it") for x in lines)


def test_the_run_detail_carries_the_runtimes_summary_values_with_units(
    client: TestClient, tmp_path: Path
) -> None:
    from dit.runtime_api.interface import Results, SummaryValue, write_summary
    from tests.integration.test_web_api import finished_run

    run = finished_run(tmp_path / "runs")
    key = f"{run.path.parent.name}/{run.path.name}"
    assert client.get(f"/api/runs/{key}").json()["summary"] is None  # no summary.json: nothing shown
    values = (
        SummaryValue("tokens", 8, "", "int", "tokens generated"),
        SummaryValue("token_latency_mean", 1234567.0, "ns", "float", "mean per-token latency"),
    )
    write_summary(run.path / "aggregate", "layers", Results(summary=values))
    summary = client.get(f"/api/runs/{key}").json()["summary"]
    assert summary == {"runtime": "layers", "values": [v.to_json() for v in values]}
