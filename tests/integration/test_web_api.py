"""Every NNPM endpoint through FastAPI's TestClient, including bad input, the token and real runs."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from dit.run.procs import run_processes
from dit.run.rundir import FINISHED_STATES, RunDir, write_json
from dit.web.app import WebConfig
from tests.conftest import HELD, REPO
from tests.integration.conftest import StartNnpm
from tests.measured_run import write_measured_run

LOOPBACK = {"host": "127.0.0.1"}
DOC = {
    "name": "api_quick",
    "model": {"name": "fake", "params": {"profile": "tiny"}},
    "devices": ["device1", "device2"],
    "repetitions": 2,
    "inference": {"enabled": True, "partition_points": [0, 2, 4], "repetitions": 2},
    "timing": {"start_lead_s": 1.0},
}


def finished_run(runs: Path) -> RunDir:
    """The hand-assembled fixture run, as a finished run directory."""
    path = runs / "fixture_small" / "20260101T000000Z-abcdef12"
    shutil.copytree(REPO / "tests" / "fixtures" / "run_small", path)
    for sub in ("aggregate", "optimise", "ansible"):
        (path / sub).mkdir(exist_ok=True)
    write_json(
        path / "driver.json", {"pid": 1, "host": "elsewhere", "local": True, "scenario_hash": "0" * 64}
    )
    write_json(path / "status.json", {"state": "completed", "label": "fixture_small", "started_wall_ns": 1,
                                      "finished_wall_ns": 2_000_000_001, "stage_ns": {"profile": 5}})  # fmt: skip
    (path / "run.log").write_text(
        "".join(f"2026-01-01T00:00:00.{i:03d}Z device{i % 2 + 1} stdout line {i}\n" for i in range(30)),
        "utf-8",
    )
    return RunDir(path)


@pytest.fixture
def env(tmp_path: Path, nnpm: StartNnpm) -> Iterator[tuple[TestClient, WebConfig, RunDir]]:
    python = sys.executable
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": python,
                        "dit_python": python,
                    },
                    "children": {
                        "edge": {
                            "hosts": {
                                "edge": {"ansible_host": "127.0.0.1", "dit_lat": 37.98, "dit_lon": 23.72}
                            }
                        },
                        "devices": {
                            "hosts": {
                                "device1": {"ansible_host": "127.0.0.2", "dit_lat": 38.0, "dit_lon": 23.8}
                            }
                        },
                    },
                }
            }
        ),
        "utf-8",
    )
    config = WebConfig(
        inventory=inventory, runs_dir=tmp_path / "runs", scenarios_dir=REPO / "scenarios", probe="tcp",
        tiles="https://tile.openstreetmap.org/{z}/{x}/{y}.png",  # a world map: nodes by lat/lon
    )  # fmt: skip
    run = finished_run(tmp_path / "runs")
    yield nnpm(config), config, run


def key(run: RunDir) -> str:
    return f"{run.path.parent.name}/{run.path.name}"


def test_page_config_schema_and_static(env: Any) -> None:
    client, _, _ = env
    page = client.get("/")
    assert page.status_code == 200 and "NNPM" in page.text and "/vendor/leaflet/leaflet.js" in page.text
    assert client.get("/vendor/leaflet/leaflet.js").status_code == 200  # served from xstatic-leaflet
    assert client.get("/static/app.js").status_code == 200
    cfg = client.get("/api/config").json()
    assert cfg["token_required"] is True and {"greedy", "exhaustive", "trend"} <= set(cfg["algorithms"])
    assert client.get("/api/schema").json()["properties"]["network"]
    assert client.get("/", headers={"host": "attacker.example"}).status_code == 403  # DNS rebinding
    refused = client.post(
        "/api/nodes", content=b"name=x", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert refused.status_code == 415  # no cross-site form posts


def test_nodes_crud_probe_and_topology(env: Any) -> None:
    client, config, _ = env
    data = client.get("/api/nodes").json()
    assert [n["name"] for n in data["nodes"]] == ["device1", "edge"] and data["editable"]
    assert data["links"][0]["delay_ms"] == pytest.approx(5 + data["links"][0]["km"], abs=1e-3)
    new = {
        "name": "device2",
        "role": "device",
        "address": "127.0.0.3",
        "lat": 38.1,
        "lon": 23.6,
        "board": {"cores": 4},
    }
    assert client.post("/api/nodes", json=new).status_code == 201
    assert client.post("/api/nodes", json=new).status_code == 409
    bad = client.post("/api/nodes", json={**new, "name": "device3", "lat": 123})
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "lat"
    assert client.post("/api/nodes", json={**new, "name": "edge2", "role": "edge"}).status_code == 422
    put = client.put("/api/nodes/device2", json={**new, "address": "127.0.0.4"})
    assert put.json()["address"] == "127.0.0.4"
    assert client.put("/api/nodes/ghost", json=new).status_code == 404
    moved = client.patch("/api/nodes/device2/position", json={"lat": 38.2, "lon": 23.5})
    assert moved.status_code == 200 and moved.json()["lat"] == 38.2
    assert client.patch("/api/nodes/nope/position", json={"lat": 1, "lon": 1}).status_code == 404
    assert client.patch("/api/nodes/device2/position", json={"lat": "x", "lon": 1}).status_code == 422
    saved = yaml.safe_load(config.inventory.read_text("utf-8"))
    assert saved["all"]["children"]["devices"]["hosts"]["device2"]["dit_lat"] == 38.2
    assert saved["all"]["vars"]["ansible_connection"] == "local"  # kept
    topo = client.get("/api/topology").json()
    assert topo["edge"] == "edge" and set(topo["delays"]) == {"device1", "device2"}
    assert client.delete("/api/nodes/device2").status_code == 204
    assert client.delete("/api/nodes/device2").status_code == 404
    # the probe loop (tcp to the SSH port here: nothing listens on 22 of 127.0.0.x in CI) reports per node
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        n["probe"] for n in client.get("/api/nodes").json()["nodes"]
    ):
        time.sleep(0.2)
    probes = {n["name"]: n["probe"] for n in client.get("/api/nodes").json()["nodes"]}
    assert all(p and p["sent"] == 3 and p["method"] == "tcp:22" for p in probes.values())


def test_invalid_scenario_refused_with_field_errors_and_nothing_saved(env: Any) -> None:
    client, _, _ = env
    bad = {**DOC, "repetitions": 0, "load": {"device2": {"mode": "sometimes"}}}
    response = client.post("/api/scenarios", json={"document": bad})
    assert response.status_code == 422
    paths = {e["path"] for e in response.json()["errors"]}
    assert paths == {"repetitions", "load.device2.mode"}
    assert client.get("/api/scenarios").json()["stored"] == []
    assert client.post("/api/scenarios", json={"yaml": "name: [unclosed"}).status_code == 422
    assert client.post("/api/scenarios", json={"document": [1, 2]}).status_code == 422
    assert (
        client.post("/api/scenarios", content=b"{", headers={"content-type": "application/json"}).status_code
        == 400
    )
    checked = client.post("/api/scenarios/validate", json={"document": bad}).json()
    assert checked["valid"] is False and len(checked["errors"]) == 2
    assert client.get("/api/scenarios").json()["stored"] == []


def test_versions_history_diff_and_files(env: Any) -> None:
    client, _, _ = env
    valid = client.post("/api/scenarios/validate", json={"document": DOC}).json()
    assert valid["valid"] and len(valid["variants"]) == 1
    first = client.post("/api/scenarios", json={"document": DOC})
    assert (
        first.status_code == 201
        and first.json()["created"]
        and first.json()["version"]["hash"] == valid["hash"]
    )
    same = client.post(
        "/api/scenarios", json={"document": {**DOC, "warmup": 1}}
    ).json()  # a default spelled out
    assert same["created"] is False and same["version"]["hash"] == valid["hash"]
    with_topology = client.post("/api/scenarios/topology", json={"document": DOC}).json()
    delay = with_topology["document"]["network"]["device1"]["destinations"]["edge"]["delay_ms"]
    assert delay > 5 and with_topology["not_on_map"] == ["device2"]
    second = client.post("/api/scenarios", json={"document": with_topology["document"]}).json()["version"]
    history = client.get("/api/scenarios/api_quick/versions").json()["versions"]
    assert [v["hash"] for v in history] == [second["hash"], valid["hash"]]
    diff = client.get(f"/api/diff?a={valid['hash']}&b={second['hash'][:16]}").json()
    assert [c["path"] for c in diff["changes"]] == ["network.device1"]
    assert client.get("/api/diff?a=abc&b=def").status_code == 404
    version = client.get(f"/api/versions/{second['hash']}").json()
    assert version["document"]["network"]["device1"]["destinations"]["edge"]["delay_ms"] == delay
    assert second["hash"] in client.get(f"/api/versions/{second['hash']}/yaml").text
    assert client.get("/api/versions/0000").status_code == 404
    # a note on a version (issue 36 item 11): in its summary and the history, its hash unchanged
    noted = client.put(f"/api/versions/{second['hash']}/note", json={"text": "map delays applied"})
    assert noted.status_code == 200 and noted.json()["note"] == "map delays applied"
    assert noted.json()["hash"] == second["hash"]
    history = client.get("/api/scenarios/api_quick/versions").json()["versions"]
    assert [v["note"] for v in history] == ["map delays applied", ""]
    bad = client.put(f"/api/versions/{second['hash']}/note", json={"text": ["x"]})
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "text"
    assert client.put("/api/versions/0000/note", json={"text": "x"}).status_code == 404
    files = client.get("/api/scenarios").json()["files"]
    assert "quickstart.yaml" in {f["file"] for f in files}
    assert client.get("/api/scenarios/files/quickstart.yaml").json()["document"]["name"] == "quickstart"
    assert client.get("/api/scenarios/files/..%2Fpyproject.toml").status_code == 404


def test_finished_run_page_plots_terminal_and_optimise(env: Any) -> None:
    client, _, run = env
    runs = client.get("/api/runs").json()["runs"]
    assert [r["key"] for r in runs] == [key(run)] and runs[0]["state"] == "completed"
    assert runs[0]["duration_s"] == 2.0
    assert client.get("/api/runs/fixture_small/nope").status_code == 404
    assert client.get("/api/runs/..%2F..%2Fetc/passwd").status_code == 404
    assert client.post(f"/api/runs/{key(run)}/stop", json={}).status_code == 409  # already finished
    assert client.post(f"/api/runs/{key(run)}/optimise", json={"algorithm": "nope"}).status_code == 422
    assert client.post(f"/api/runs/{key(run)}/optimise", json={"policy": 5}).status_code == 422
    result = client.post(
        f"/api/runs/{key(run)}/optimise",
        json={"algorithm": "exhaustive", "objective": "variance", "policy": "RR"},
    )
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["file"] == "exhaustive-variance-RR.json" and len(body["vector"]) == 2
    listed = client.get(f"/api/runs/{key(run)}/optimise").json()["results"]
    assert [r["file"] for r in listed if r["algorithm"] == "exhaustive"] == ["exhaustive-variance-RR.json"]
    detail = client.get(f"/api/runs/{key(run)}").json()
    assert (
        detail["phases"]["columns"][0]["key"] == "host" and detail["plots"]["layers"] and detail["aggregated"]
    )
    png = client.get(f"/api/runs/{key(run)}/plots/layers.png")
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.get(f"/api/runs/{key(run)}/plots/monitors.png").status_code in (200, 404)
    assert client.get(f"/api/runs/{key(run)}/plots/other.png").status_code == 404
    # the terminal: every line once, resumable from any offset, filtered by node
    with client.websocket_connect(f"/api/runs/{key(run)}/terminal", headers=LOOPBACK) as ws:
        lines, offset = read_all(ws)
    assert [x["x"] for x in lines] == [f"line {i}" for i in range(30)]
    middle = lines[9]["o"]
    with client.websocket_connect(f"/api/runs/{key(run)}/terminal?offset={middle}", headers=LOOPBACK) as ws:
        rest, end = read_all(ws)
    assert [x["x"] for x in rest] == [f"line {i}" for i in range(10, 30)] and end == offset
    with client.websocket_connect(f"/api/runs/{key(run)}/terminal?node=device1", headers=LOOPBACK) as ws:
        only, _ = read_all(ws)
    assert {x["n"] for x in only} == {"device1"} and len(only) == 15
    with (
        pytest.raises(WebSocketDisconnect),
        client.websocket_connect("/api/runs/a/b/terminal", headers=LOOPBACK) as ws,
    ):
        ws.receive_json()


def read_all(ws: Any) -> tuple[list[dict[str, Any]], int]:
    lines: list[dict[str, Any]] = []
    while True:
        message = ws.receive_json()
        if message["type"] == "lines":
            lines += message["lines"]
        if message["type"] == "end":
            return lines, int(message["offset"])


def test_run_launch_tag_and_stop(env: Any) -> None:
    """A real `dit run` started from NNPM, traced to its version, then stopped exactly like `dit stop`;
    a run queued while it goes waits for it, then really runs (issue 36's queue test)."""
    client, _, _ = env
    assert client.post("/api/runs", json={"version": "f" * 64}).status_code == 422
    assert (
        client.post("/api/runs", json={"version": "x", "kind": "nope", "mode": "cloud"}).json()["errors"][0][
            "path"
        ]
        == "kind"
    )
    slow = {**DOC, "name": "api_slow", "timing": HELD}
    version = client.post("/api/scenarios", json={"document": slow}).json()["version"]["hash"]
    started = client.post("/api/runs", json={"version": version, "kind": "run", "mode": "local"})
    assert started.status_code == 202, started.text
    launch = started.json()["launch"]
    run = wait_for_run(client, launch)
    assert json.loads((run.path / "nnpm.json").read_text("utf-8"))["version"] == version
    summary = next(r for r in client.get("/api/runs").json()["runs"] if r["key"] == key(run))
    assert summary["version"] == version and summary["launch"] == launch
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and run.status().get("stage") not in ("apply", "profile"):
        time.sleep(0.2)
    # issue 36 item 10: a run asked for now waits its turn behind the going one (the lease's holder) ...
    small = {**DOC, "name": "api_next", "devices": ["device1"], "repetitions": 1, "optimisation": {"enabled": False},
             "inference": {"enabled": True, "partition_points": [2], "repetitions": 1}}  # fmt: skip
    following = client.post("/api/scenarios", json={"document": small}).json()["version"]["hash"]
    waiting = client.post("/api/runs", json={"version": following, "mode": "local", "queue": True})
    assert waiting.status_code == 202 and waiting.json()["holder"] == key(run), waiting.text
    time.sleep(1.2)  # the housekeeping ran: nothing started while the run goes
    assert [e["version"] for e in client.get("/api/queue").json()["entries"]] == [following]
    assert [r for r in client.get("/api/runs").json()["runs"] if r["version"] == following] == []
    assert client.post(f"/api/runs/{key(run)}/stop", json={}).status_code == 202
    while time.monotonic() < deadline and run.status().get("state") == "running":
        time.sleep(0.3)
    assert run.status()["state"] == "stopped" and run.status()["teardown"]["ok"] is True
    assert (run.path / "STOP").exists()
    time.sleep(1.0)
    assert run_processes(run.run_id) == []
    # ... and once that run has ended, the queue starts it: a real run, which finishes
    deadline = time.monotonic() + 240
    mine: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not (mine and mine[0]["state"] in FINISHED_STATES):
        time.sleep(0.5)
        mine = [r for r in client.get("/api/runs").json()["runs"] if r["version"] == following]
    # its driver exits a moment after the run finished; till then it holds the queue (issue 49 item 1)
    while time.monotonic() < deadline and client.get("/api/queue").json()["holder"]:
        time.sleep(0.3)
    assert client.get("/api/queue").json() == {"holder": None, "entries": []}
    assert len(mine) == 1 and mine[0]["state"] == "completed", mine
    assert mine[0]["started_wall_ns"] > run.status()["finished_wall_ns"]  # after the first ended
    assert (run.path.parent.parent / mine[0]["key"] / "aggregate" / "phases.csv").is_file()
    bench = client.post("/api/runs", json={"version": version, "kind": "benchmark", "mode": "local"}).json()
    assert bench["version"]["kind"] == "benchmark" and bench["version"]["derived_from"] == version
    derived = client.get(f"/api/versions/{bench['version']['hash']}").json()["document"]
    assert derived["inference"]["enabled"] is False and derived["optimisation"]["enabled"] is False
    bench_run = wait_for_run(client, bench["launch"])
    client.post(f"/api/runs/{key(bench_run)}/stop", json={})
    while time.monotonic() < deadline + 120 and bench_run.status().get("state") in (None, "running"):
        time.sleep(0.3)
    assert bench_run.status()["state"] in ("stopped", "completed")


def test_dry_run_reports_each_nodes_changes_and_leaves_no_run(env: Any) -> None:
    """The "Dry run" button's endpoint: `dit run --check` on a saved version, answered when done."""
    client, _, fixture = env
    bad = client.post("/api/dry-runs", json={"version": "f" * 64, "mode": "cloud"})
    assert bad.status_code == 422 and [e["path"] for e in bad.json()["errors"]] == ["mode", "version"]
    doc = {
        **DOC,
        "name": "api_dry",
        "network": {"device1": {"delay_ms": 7}},
        "load": {"device2": {"mode": "light"}},
    }
    version = client.post("/api/scenarios", json={"document": doc}).json()["version"]["hash"]
    answer = client.post("/api/dry-runs", json={"version": version, "mode": "local"})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["ok"] is True, data["log_tail"]
    (report,) = data["dry_runs"]
    nodes = {n["host"]: n["changes"] for n in report["nodes"]}
    assert set(nodes) == {"edge", "device1", "device2"}
    details = {host: [d for c in changes for d in c["details"]] for host, changes in nodes.items()}
    # recorded netem where the userspace backend cannot run (not root, no iptables), else the link
    # emulator's rules for device1's own source address and its process
    recorded = any("netem delay 7ms" in d for d in details["device1"])
    emulated = any("! -s 127." in d for d in details["device1"]) and any(
        d.startswith("start 'link-emulator'") for d in details["device1"]
    )
    assert recorded or emulated, details["device1"]
    assert any(d.startswith("start 'load'") for d in details["device2"])
    assert any(d.startswith("start 'edge'") for d in details["edge"])
    runs = client.get("/api/runs").json()["runs"]
    assert [r["key"] for r in runs] == [key(fixture)]  # a dry run is not a run
    assert run_processes(report["run_id"]) == []
    # kept as the version's last dry run in that mode (issue 36 item 7); none in the other mode
    last = client.get(f"/api/versions/{version}/dry-run", params={"mode": "local"})
    assert last.status_code == 200 and last.json()["dry_runs"] == data["dry_runs"]
    assert client.get(f"/api/versions/{version}/dry-run", params={"mode": "inventory"}).status_code == 404
    assert client.get(f"/api/versions/{version}/dry-run", params={"mode": "cloud"}).status_code == 422
    # in the background: the action at once, its progress in its log line by line, then the report kept
    wrong = client.post("/api/dry-runs", json={"version": version, "background": "yes"})
    assert wrong.status_code == 422 and [e["path"] for e in wrong.json()["errors"]] == ["background"]
    started = client.post("/api/dry-runs", json={"version": version, "mode": "local", "background": True})
    assert started.status_code == 202, started.text
    action = started.json()["action"]
    assert action["kind"] == "dry-run" and action["state"] == "running"
    deadline = time.monotonic() + 300
    while action["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.3)
        action = client.get(f"/api/actions/{action['id']}").json()
    assert action["state"] == "done", action
    log = Path(client.get("/api/config").json()["runs_dir"]) / ".nnpm" / "actions" / f"{action['id']}.log"
    lines = log.read_text(encoding="utf-8").splitlines()
    assert any(line.split(" ")[1:3] == ["device2", "ansible"] for line in lines), lines[:5]
    again = client.get(f"/api/versions/{version}/dry-run").json()
    assert again["finished_ns"] > last.json()["finished_ns"] and again["ok"] is True


def wait_for_run(client: TestClient, launch: str) -> RunDir:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        data = client.get(f"/api/launches/{launch}").json()
        if data["runs"]:
            return RunDir(Path(client.get("/api/config").json()["runs_dir"]) / data["runs"][0]["key"])
        assert data["alive"], data["log_tail"]
        time.sleep(0.3)
    raise AssertionError("the launched run never appeared")


def test_runtime_readiness_check_and_actions(env: Any) -> None:
    client, _, _ = env
    assert client.post("/api/runtimes/check", json={"hosts": ["ghost"]}).status_code == 422
    assert client.post("/api/runtimes/actions", json={"action": "format-disk"}).status_code == 422
    info = client.get("/api/runtimes").json()
    layers = next(r for r in info["runtimes"] if r["name"] == "layers")
    assert {a["name"] for a in layers["actions"]} == {"install-runtime", "distribute-weights"}
    action = client.post("/api/runtimes/check", json={"hosts": ["device1"], "model": "fake"}).json()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and action["state"] == "running":
        time.sleep(0.5)
        action = client.get(f"/api/actions/{action['id']}").json()
    assert action["state"] == "done", action
    assert [n["state"] for n in action["nodes"]] == ["ok"], action["nodes"]
    checks = action["checks"]["device1"]
    assert checks["python"]["ok"] and checks["python"]["detail"] == ".".join(map(str, sys.version_info[:3]))
    assert checks["dit-device.pyz"]["ok"] and "framework" not in checks  # fake needs none: not checked
    with client.websocket_connect(f"/api/actions/{action['id']}/terminal", headers=LOOPBACK) as ws:
        lines, _ = read_all(ws)
    assert any(x["n"] == "device1" and "check: python" in x["x"] for x in lines)
    assert client.get("/api/actions/nope").status_code == 404


def test_token_required_when_exposed(tmp_path: Path, nnpm: StartNnpm) -> None:
    config = WebConfig(
        host="0.0.0.0", inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs", probe="off"
    )
    client = nnpm(config, authorised=False, base_url="http://192.0.2.1:8765")
    token = config.token
    assert token and len(token) >= 32
    assert client.get("/api/config").status_code == 401
    assert client.get("/").status_code == 401
    assert client.get("/api/config", headers={"X-NNPM-Token": "wrong"}).status_code == 401
    assert client.get("/api/config", headers={"X-NNPM-Token": token}).json()["token_required"] is True
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    page = client.get(f"/?token={token}")
    assert page.status_code == 200 and "nnpm_token_8765=" in page.headers["set-cookie"]
    assert client.get("/static/app.js").status_code == 200  # the cookie now carries the token
    client.cookies.clear()
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        client.websocket_connect("/api/runs/a/b/terminal") as ws,
    ):
        ws.receive_json()
    assert refused.value.code == 4401
    with (
        pytest.raises(WebSocketDisconnect) as missing,
        client.websocket_connect(f"/api/runs/a/b/terminal?token={token}") as ws,
    ):
        ws.receive_json()
    assert missing.value.code == 4404  # past the guard: there is no such run


def test_run_report_downloads_as_one_self_contained_file(env: Any) -> None:
    client, _, run = env
    got = client.get(f"/api/runs/{key(run)}/report")
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/html")
    assert got.headers["content-disposition"] == (
        f'attachment; filename="fixture_small-{run.path.name}-report.html"'
    )
    assert '<section id="phases">' in got.text and "fixture_small" in got.text
    assert client.get("/api/runs/fixture_small/nope/report").status_code == 404


def test_a_runs_note_is_set_from_nnpm_and_listed(env: Any) -> None:
    """Issue 36 item 11: PUT a run's note; the runs list and the run page carry it; bad input is named."""
    client, _, run = env
    url = f"/api/runs/{key(run)}/note"
    assert client.put(url, json={"text": "fan unplugged from round 3"}).json() == {
        "note": "fan unplugged from round 3\n"
    }
    listed = {r["key"]: r for r in client.get("/api/runs").json()["runs"]}
    assert listed[key(run)]["note"] == "fan unplugged from round 3\n"
    assert client.get(f"/api/runs/{key(run)}").json()["note"] == "fan unplugged from round 3\n"
    for bad, message in (({"text": 3}, "a string"), ({"text": "x" * 10_001}, "at most 10000")):
        got = client.put(url, json=bad)
        assert got.status_code == 422 and message in got.json()["errors"][0]["message"]
        assert got.json()["errors"][0]["path"] == "text"
    assert client.put(url, json={"text": ""}).json() == {"note": ""}
    assert not (run.path / "note.md").exists()
    assert client.put("/api/runs/fixture_small/nope/note", json={"text": "x"}).status_code == 404


def test_a_finished_run_downloads_as_an_archive_and_a_going_one_is_refused(env: Any) -> None:
    """Issue 36 item 10: the run directory as one .tar.gz; links kept as links, never followed."""
    import io
    import json
    import os
    import tarfile

    client, _, run = env
    (run.path / "outside").symlink_to("/etc/hostname")
    got = client.get(f"/api/runs/{key(run)}/archive")
    assert got.status_code == 200 and got.headers["content-type"] == "application/gzip"
    top = f"fixture_small-{run.path.name}"
    assert f'filename="{top}.tar.gz"' in got.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(got.content), mode="r:gz") as tar:
        names = set(tar.getnames())
        assert {f"{top}/status.json", f"{top}/run.log", f"{top}/raw/device1", f"{top}/scenario.yaml"} <= names
        link = tar.getmember(f"{top}/outside")
        assert link.issym() and link.linkname == "/etc/hostname"
    assert not list((run.path.parent.parent / ".nnpm" / "archives").glob("*"))  # removed once sent
    going = run.path.parent / "going"
    going.mkdir()
    (going / "status.json").write_text(json.dumps({"state": "running", "label": "going"}))
    (going / "driver.json").write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    refused = client.get("/api/runs/fixture_small/going/archive")
    assert refused.status_code == 409 and "would be partial" in refused.json()["detail"]
    assert client.get("/api/runs/fixture_small/nope/archive").status_code == 404


def test_runs_asked_for_while_one_is_going_are_queued_with_their_position(env: Any) -> None:
    """Issue 36 item 10: queue N runs behind the going one (its key is the holder), list, cancel."""
    import json
    import os

    client, _, run = env
    version = client.post("/api/scenarios", json={"document": {**DOC, "name": "api_queue"}}).json()["version"]
    going = run.path.parent / "20260101T000001Z-going"
    going.mkdir()
    (going / "status.json").write_text(json.dumps({"state": "running", "label": "fixture_small"}))
    (going / "driver.json").write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    body = {"version": version["hash"], "mode": "local"}
    for wrong, path in (
        ({"count": 0, "queue": True}, "count"),
        ({"count": 2, "queue": False}, "count"),
        ({"queue": "yes"}, "queue"),
    ):
        got = client.post("/api/runs", json={**body, **wrong})
        assert got.status_code == 422 and [e["path"] for e in got.json()["errors"]] == [path], wrong
    # issue 49 item 1: nothing waits, yet the holder is said, and one Run is refused (queue false: 409
    # naming it) or queued; never a second driver beside the going one
    assert client.get("/api/queue").json() == {"holder": f"fixture_small/{going.name}", "entries": []}
    refused = client.post("/api/runs", json={**body, "queue": False})
    assert refused.status_code == 409 and refused.json()["holder"] == f"fixture_small/{going.name}"
    assert refused.json()["detail"].startswith(f"fixture_small/{going.name} is going: "), refused.text
    one = client.post("/api/runs", json=body)
    assert one.status_code == 202 and "launch" not in one.json(), one.text
    assert [e["position"] for e in one.json()["queued"]] == [1]
    assert one.json()["holder"] == f"fixture_small/{going.name}"
    client.delete(f"/api/queue/{one.json()['queued'][0]['id']}")
    # issue 49 item 2: a benchmark (queued too) saves its derived version, the newest of the name, yet
    # the editor opens the researcher's own, and the stored list names that as the latest
    bench = client.post("/api/runs", json={**body, "kind": "benchmark"}).json()
    assert bench["version"]["derived"] is True and bench["version"]["derived_from"] == version["hash"]
    history = client.get("/api/scenarios/api_queue/versions").json()
    assert [v["hash"] for v in history["versions"]] == [bench["version"]["hash"], version["hash"]]
    assert history["opens"] == version["hash"] and history["versions"][1]["derived"] is False
    stored = {s["name"]: s["latest"]["hash"] for s in client.get("/api/scenarios").json()["stored"]}
    assert stored["api_queue"] == version["hash"]
    client.delete(f"/api/queue/{bench['queued'][0]['id']}")
    queued = client.post("/api/runs", json={**body, "queue": True, "count": 2})
    assert queued.status_code == 202, queued.text
    data = queued.json()
    assert data["holder"] == f"fixture_small/{going.name}" and [e["position"] for e in data["queued"]] == [
        1,
        2,
    ]
    time.sleep(1.2)  # the housekeeping ran: nothing started while the holder goes
    line = client.get("/api/queue").json()
    assert [e["id"] for e in line["entries"]] == [e["id"] for e in data["queued"]]
    assert client.get("/api/launches/none").status_code == 404 and client.get("/api/runs").json()["runs"]
    after = client.delete(f"/api/queue/{data['queued'][0]['id']}").json()
    assert [(e["id"], e["position"]) for e in after["entries"]] == [(data["queued"][1]["id"], 1)]
    assert client.delete(f"/api/queue/{data['queued'][0]['id']}").status_code == 404
    client.delete(f"/api/queue/{data['queued'][1]['id']}")
    (going / "status.json").write_text(json.dumps({"state": "completed", "label": "fixture_small"}))
    assert client.get("/api/queue").json() == {"holder": None, "entries": []}


def test_compare_refuses_what_is_not_two_runs_of_this_runs_directory(env: Any) -> None:
    """Issue 36 item 9's endpoint: run keys only, resolved inside the runs directory, two or more."""
    client, _, run = env
    one = client.get("/api/compare/report", params={"runs": [key(run)]})
    assert one.status_code == 422 and "two or more" in one.json()["detail"]
    assert (
        client.get("/api/compare/report", params={"runs": [key(run), "fixture_small/nope"]}).status_code
        == 404
    )
    for bad in ("no-slash", "a/b/c", "/x"):
        got = client.get("/api/compare/report", params={"runs": [key(run), bad]})
        assert got.status_code == 422 and "is not a run key" in got.json()["detail"], bad
    outside = client.get("/api/compare/report", params={"runs": [key(run), "../etc"]})
    assert outside.status_code == 404
    twice = client.get("/api/compare/report", params={"runs": [key(run), key(run)]})
    assert twice.status_code == 422 and "given twice" in twice.json()["detail"]


def test_a_file_saved_unchanged_has_the_cli_hash_and_bad_numbers_are_field_errors(env: Any) -> None:
    """Issue 36 items 4 and 6, the API's side: the hash is the CLI run's; "2e" is refused at its field."""
    from dit.scenario import expand, load_yaml

    client, _, _ = env
    cli_hash = expand(load_yaml(REPO / "scenarios" / "quickstart.yaml"))[0].hash
    document = client.get("/api/scenarios/files/quickstart.yaml").json()["document"]
    saved = client.post("/api/scenarios", json={"document": document}).json()["version"]
    assert saved["hash"] == cli_hash
    assert client.get(f"/api/versions/{cli_hash}").json()["document"] == document  # stored as written
    refused = client.post("/api/scenarios", json={"document": {**DOC, "warmup": "2e"}})
    assert refused.status_code == 422
    assert [e["path"] for e in refused.json()["errors"]] == ["warmup"]
    assert client.get("/api/scenarios/api_quick/versions").json()["versions"] == []


def test_measured_links_of_a_scenarios_latest_run_and_map_delays_keep_typed_ones(env: Any) -> None:
    """Issue 36 item 1: the map's per-link control offers the latest run's measured RTT as a delay (RTT
    to the edge, RTT / 2 between devices), says when nothing was measured, names a bad field; Apply map
    delays keeps a typed destination delay unless the editor says the map wrote it."""
    client, config, _ = env
    none = client.get("/api/scenarios/api_quick/measured-links")
    assert none.status_code == 200 and none.json() == {"scenario": "api_quick", "run": None, "state": None,
                                                       "links": []}  # fmt: skip
    assert client.get("/api/scenarios/fixture_small/measured-links").json()["run"] is None  # no links.csv
    write_measured_run(config.runs_dir, "api_quick", "20260101T000000Z-00000001")
    newest = write_measured_run(config.runs_dir, "api_quick", "20260102T000000Z-00000002")
    got = client.get("/api/scenarios/api_quick/measured-links").json()
    assert got["run"] == f"api_quick/{newest.name}" and got["state"] == "completed"
    edge, d2d = got["links"]  # device2 → edge has no RTT: not offered
    assert edge == {"device": "device1", "target": "edge", "rtt_ms_mean": 0.0441, "rtt_ms_min": 0.027,
                    "rtt_ms_max": 0.072, "baseline_rtt_ms": 0.0414, "intended_delay_ms": 5.0, "pings": 10,
                    "delay_ms": 0.0441,
                    "delay_rule": "the RTT: netem adds a device's delay to the edge once per round trip"}  # fmt: skip
    assert (d2d["target"], d2d["delay_ms"], d2d["baseline_rtt_ms"]) == ("device2", 0.01345, None)
    bad = client.get("/api/scenarios/..hidden/measured-links")
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "name"

    typed = {**DOC, "network": {"device1": {"destinations": {"edge": {"delay_ms": 12, "jitter_ms": 2}}}}}
    kept = client.post("/api/scenarios/topology", json={"document": typed}).json()
    assert kept["document"]["network"]["device1"]["destinations"]["edge"] == {"delay_ms": 12, "jitter_ms": 2}
    (note,) = kept["links"]
    assert note["source"] == "typed" and note["delay_ms"] == 12 and note["map_ms"] > 5
    follow = client.post(
        "/api/scenarios/topology",
        json={"document": typed, "from_map": [{"device": "device1", "peer": "edge"}]},
    ).json()
    assert follow["document"]["network"]["device1"]["destinations"]["edge"] == {
        "delay_ms": note["map_ms"],
        "jitter_ms": 2,
    }
    assert follow["links"][0]["source"] == "map" and follow["links"][0]["previous_ms"] == 12
    for wrong, path in (
        ("x", "from_map"),
        ([{"device": "device1"}], "from_map[0].peer"),
        ([3], "from_map[0]"),
    ):
        refused = client.post("/api/scenarios/topology", json={"document": typed, "from_map": wrong})
        assert refused.status_code == 422 and [e["path"] for e in refused.json()["errors"]] == [path], wrong
