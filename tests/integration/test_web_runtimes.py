"""NNPM's Runtimes page through the API: every installed runtime, readiness only from the real check
(a node that does not answer is unreachable, with the reason, never ready) and maintenance actions whose
Ansible output streams live through the action's terminal WebSocket (issue 12 item 7, issue 16 item 2)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dit.mirror.build import host_arch
from dit.mirror.runtimes import load_runtimes
from dit.runtime_api import registry
from dit.web.app import WebConfig
from tests.conftest import REPO, dit_env, install_fixture_package
from tests.integration.conftest import StartNnpm, loopback_inventory

LOOPBACK = {"host": "127.0.0.1"}
SOURCES = REPO / "tests" / "fixtures" / "runtime_sources.yaml"  # declares the echo fixture runtime


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
    # a node added on the map at a loopback address, nothing said of how to reach it: a local-mode node
    lonely = {"ansible_host": "127.0.0.3"}
    # a local node whose runtime interpreter is missing: every check that runs it fails
    broken = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
              "ansible_host": "127.0.0.4", "dit_python": "/nonexistent/bin/python3"}  # fmt: skip
    inventory = loopback_inventory(tmp_path / "inventory.yml", ghost=ghost, lonely=lonely, broken=broken)
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
        client,
        client.post("/api/runtimes/check", json={"runtime": "echo", "hosts": ["device1", "broken"]}).json(),
    )
    nodes = {n["host"]: n for n in action["nodes"]}
    assert nodes["device1"] == {
        "host": "device1",
        "state": "ok",
        "reason": "",
        "checks": [
            {"name": "python", "ok": True, "detail": sys.version.split()[0]},
            {"name": "tcp", "ok": True, "detail": "listens"},
        ],
    }
    # the same plug-in's checks on a node without its interpreter: failed, never ready, saying which
    broken = nodes["broken"]
    assert broken["state"] == "failed", broken
    assert [(c["name"], c["ok"]) for c in broken["checks"]] == [("python", False), ("tcp", False)], broken
    assert "python" in broken["reason"], broken
    latest = client.get("/api/runtimes").json()["readiness"]["echo"]
    assert latest["broken"]["state"] == "failed" and latest["device1"]["state"] == "ok"


def test_a_local_mode_node_is_checked_on_this_machine_not_over_ssh(client: TestClient) -> None:
    # issue 35 item 4: a node of the map at 127.0.0.3 was red "ssh ... port 22: Connection refused"
    # while the map showed it green
    action = finish(
        client, client.post("/api/runtimes/check", json={"runtime": "layers", "hosts": ["lonely"]}).json()
    )
    (lonely,) = action["nodes"]
    assert lonely["state"] == "ok", lonely
    assert {c["name"] for c in lonely["checks"]} == {"python", "dit-device.pyz"}
    lines = terminal_lines(client, action["id"])
    assert any(x["n"] == "lonely" and "local-mode node (127.0.0.3)" in x["x"] for x in lines), lines
    said = [x["x"].lower() for x in lines if x["n"] == "lonely"]
    assert not any("refused" in x or "unreachable" in x or "ssh:" in x for x in said), said


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
    assert summary == {  # no fake sensor in this run: nothing is marked modelled
        "runtime": "layers",
        "values": [
            {**values[0].to_json(), "modelled": "", "text": "8"},
            {**values[1].to_json(), "modelled": "", "text": "1.23 ms"},  # dit.units, as dit show says it
        ],
        "modelled_note": "",
    }


def test_the_install_button_installs_a_declared_runtime_then_checks_it(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 35 item 4: what `dit runtimes install echo` does, from the Runtimes page, output live
    mirror = tmp_path / "mirror"
    subprocess.run(
        [sys.executable, "-m", "dit.mirror", "build", "--out", str(mirror), "--skip-wheels", "--skip-debs",
         "--skip-sources", "--skip-weights", "--arch", host_arch(), "--sources", str(SOURCES)],
        check=True, capture_output=True, env={**dit_env(), "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    runtimes = tmp_path / "runtimes"
    monkeypatch.setenv("DIT_MIRROR_SOURCES", str(SOURCES))
    monkeypatch.setenv("DIT_RUNTIMES_DIR", str(runtimes))
    monkeypatch.setenv("DIT_MIRROR_DIR", str(tmp_path / "empty"))
    listed = {r["name"]: r for r in client.get("/api/runtimes").json()["runtimes"]}
    assert listed["echo"]["installable"] and not listed["layers"]["installable"]
    # refused before anything runs: the built-in runtime, or a mirror without the runtime's build
    for runtime, says in (("layers", "is not declared"), ("echo", "run mirror/build --runtime echo")):
        refused = client.post("/api/runtimes/install", json={"runtime": runtime, "hosts": ["device1"]})
        assert refused.status_code == 422, refused.text
        assert (
            refused.json()["errors"][0]["path"] == "runtime"
            and says in refused.json()["errors"][0]["message"]
        )
    assert not runtimes.exists()

    monkeypatch.setenv("DIT_MIRROR_DIR", str(mirror))
    started = client.post("/api/runtimes/install", json={"runtime": "echo", "hosts": ["device1", "lonely"]})
    assert started.status_code == 202, started.text
    action = finish(client, started.json())
    assert action["state"] == "done" and action["kind"] == "install", action
    [source] = load_runtimes(SOURCES)
    stamp = (runtimes / f"echo-{source.pin[:12]}" / ".dit-runtime").read_text(encoding="utf-8")
    assert stamp.startswith(f"name=echo pin={source.pin} ")
    # then the readiness check, on both nodes (local-mode: one install on this machine served both)
    assert {n["host"]: n["state"] for n in action["nodes"]} == {"device1": "ok", "lonely": "ok"}
    assert client.get("/api/runtimes").json()["readiness"]["echo"]["lonely"]["state"] == "ok"
    said = [x["x"] for x in terminal_lines(client, action["id"])]
    assert "one install on this machine for device1, lonely" in said
    assert any(x.startswith("changed: ") for x in said), said  # the role's tasks, streamed
    assert "readiness for the runtime echo after the install" in said
