"""NNPM parts with no server: scenario store, run.log reader, ping parsing, managed inventory."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dit.scenario import expand, load
from dit.web.services.nodes import Inventory, NodeError, check_node
from dit.web.services.probe import ProbeResult, Target, parse_ping, tcp_connect
from dit.web.services.store import Store, diff, version_hash
from dit.web.services.terminal import BACKLOG_BYTES, parse_line, read_lines, start_offset
from tests.conftest import REPO

DOC = {"name": "s1", "model": "fake", "devices": ["device1", "device2"], "repetitions": 2}


def test_version_hash_is_the_scenario_hash_without_a_sweep() -> None:
    (scenario,) = load(REPO / "scenarios" / "quickstart.yaml")
    assert version_hash(scenario.to_dict()) == scenario.hash
    # spelling out a default saves no new version; changing a value does
    assert version_hash({**DOC, "warmup": 1}) == version_hash(DOC)
    assert version_hash({**DOC, "repetitions": 3}) != version_hash(DOC)


def test_store_versions_are_immutable_with_history_and_diff(tmp_path: Path) -> None:
    store = Store(tmp_path / "nnpm.sqlite")
    v1, created = store.save(DOC, expand(DOC))
    assert created and v1.hash == version_hash(DOC)
    again, created = store.save(dict(reversed(list(DOC.items()))), expand(DOC))
    assert not created and again.hash == v1.hash
    doc2 = {**DOC, "repetitions": 4, "network": {"device1": {"delay_ms": 5}}}
    v2, _ = store.save(doc2, expand(doc2))
    assert [v.hash for v in store.history("s1")] == [v2.hash, v1.hash]
    assert store.find(v1.hash[:10]) == v1
    assert store.find("zz") is None
    (variant,) = expand(doc2)
    assert store.version_of_variant(variant.hash) == v2.hash
    d = diff(v1, v2)
    paths = {c["path"]: c for c in d["changes"]}
    assert paths["repetitions"]["a"] == 2 and paths["repetitions"]["b"] == 4
    assert "-repetitions: 2" in d["unified"] and "+repetitions: 4" in d["unified"]
    store.close()
    reopened = Store(tmp_path / "nnpm.sqlite")
    assert [n["name"] for n in reopened.names()] == ["s1"]


def test_a_versions_note_changes_neither_its_hash_nor_its_document(tmp_path: Path) -> None:
    """Issue 36 item 11: a note on a version, kept beside it (the version stays immutable)."""
    store = Store(tmp_path / "nnpm.sqlite")
    v1, _ = store.save(DOC, expand(DOC))
    noted = store.set_note(v1.hash, "baseline before the fan swap")
    assert noted.note == "baseline before the fan swap" and noted.hash == v1.hash
    assert noted.document == v1.document and store.get(v1.hash) == noted
    assert store.history("s1")[0].note == noted.note and store.find(v1.hash[:10]) == noted
    assert store.save(DOC, expand(DOC)) == (noted, False)  # saving it again keeps the note
    with pytest.raises(ValueError, match="at most 10000"):
        store.set_note(v1.hash, "x" * 10_001)
    with pytest.raises(KeyError):
        store.set_note("ab" * 32, "no such version")
    assert store.set_note(v1.hash, " ").note == ""  # blank: removed
    store.close()


def test_a_benchmarks_derived_version_is_marked_and_never_the_one_opened(tmp_path: Path) -> None:
    """Issue 49 item 2: the benchmark's profiling-only copy is the newest version of its name, yet the
    stored list and the editor open the researcher's own; saving that document oneself makes it theirs."""
    from dit.web.services.benchmark import benchmark_document
    from dit.web.services.store import opens

    store = Store(tmp_path / "nnpm.sqlite")
    mine, _ = store.save(DOC, expand(DOC))
    profiling, wrong = benchmark_document(DOC, {"repetitions": 4})
    assert wrong == []
    bench, created = store.save(profiling, expand(profiling), "benchmark", mine.hash)
    assert created and bench.derived and not mine.derived
    assert bench.summary()["derived"] is True and bench.summary()["derived_from"] == mine.hash
    history = store.history("s1")
    assert [v.hash for v in history] == [bench.hash, mine.hash]  # listed, newest first
    assert opens(history) == mine
    assert [n["latest"]["hash"] for n in store.names()] == [mine.hash]
    # the researcher saving the same document from the editor: no longer derived, so it opens
    again, created = store.save(profiling, expand(profiling))
    assert not created and again.hash == bench.hash and not again.derived and again.derived_from is None
    assert opens(store.history("s1")) == again
    store.close()


def test_run_log_lines_resume_from_an_offset(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "2026-01-01T00:00:00.000Z device1 stdout [profile] a b\n2026-01-01T00:00:00.001Z edge ans", "utf-8"
    )
    lines, offset = read_lines(log, 0)
    assert [(x["n"], x["s"], x["x"]) for x in lines] == [("device1", "stdout", "[profile] a b")]
    assert offset == lines[0]["o"] == len(log.read_bytes().split(b"\n")[0]) + 1  # the partial line waits
    with log.open("a", encoding="utf-8") as out:
        out.write("ible ok: task\n")
    more, end = read_lines(log, offset)
    assert [(x["n"], x["s"], x["x"]) for x in more] == [("edge", "ansible", "ok: task")]
    assert end == log.stat().st_size
    assert read_lines(log, end) == ([], end)
    # the backlog on connect is bounded; a skipped backlog resumes at a line start
    assert start_offset(10, None) == (0, 0)
    assert start_offset(BACKLOG_BYTES + 100, 0) == (100, 100)
    assert start_offset(50, 999) == (0, 0)  # a replaced file starts over
    assert parse_line("no header") == {"t": "", "n": "", "s": "", "x": "no header"}


def test_read_lines_mid_line_offset_skips_to_the_next_line(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("2026-01-01T00:00:00.000Z a stdout one\n2026-01-01T00:00:00.000Z b stdout two\n", "utf-8")
    lines, _ = read_lines(log, 5)
    assert [x["x"] for x in lines] == ["two"]


PING_OUT = """PING 127.0.0.1 (127.0.0.1) 56(84) bytes of data.
64 bytes from 127.0.0.1: icmp_seq=1 ttl=64 time=0.045 ms
64 bytes from 127.0.0.1: icmp_seq=3 ttl=64 time=0.051 ms

--- 127.0.0.1 ping statistics ---
3 packets transmitted, 2 received, 33.3333% packet loss, time 404ms
"""


def test_parse_ping_and_green_only_when_all_three_answer() -> None:
    rtts = parse_ping(PING_OUT)
    assert rtts == (0.045, None, 0.051)
    assert not ProbeResult("n", "a", "ping", rtts, "").ok
    assert ProbeResult("n", "a", "ping", (0.1, 0.2, 0.3), "").ok


def test_tcp_probe_on_loopback() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        up = asyncio.run(tcp_connect(Target("n", "127.0.0.1", port)))
    assert up.ok and up.method == f"tcp:{port}"
    down = asyncio.run(tcp_connect(Target("n", "127.0.0.1", port)))  # closed now
    assert not down.ok and down.answered == 0 and "0/3" in down.detail


def node(name: str, role: str = "device", **extra: object) -> dict[str, object]:
    return check_node({"name": name, "role": role, "address": "127.0.0.2", "lat": 38.0, "lon": 23.7, **extra})


def test_managed_inventory_keeps_what_it_does_not_manage(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {"ansible_user": "pi"},
                    "children": {
                        "edge": {
                            "hosts": {
                                "server": {"ansible_host": "10.0.0.1", "dit_inference_address": "10.1.0.1"}
                            }
                        },
                        "devices": {"vars": {"dit_python": "/opt/venv/bin/python"}, "hosts": {"pi1": None}},
                        "monitoring": {"hosts": {"grafana": {"ansible_host": "10.0.0.9"}}},
                    },
                }
            }
        ),
        "utf-8",
    )
    inv = Inventory(path)
    nodes = {n.name: n for n in inv.nodes()}
    assert nodes["server"].role == "edge" and nodes["pi1"].hostvars["dit_python"] == "/opt/venv/bin/python"
    assert nodes["pi1"].hostvars["ansible_user"] == "pi" and nodes["pi1"].lat is None
    inv.upsert(node("pi1", board={"model": "Raspberry Pi 4 Model B", "memory_mb": 4096}), create=False)
    inv.upsert(node("pi2"), create=True)
    moved = inv.move("pi2", 38.5, 23.9)
    assert (moved.lat, moved.lon) == (38.5, 23.9)
    data = yaml.safe_load(path.read_text("utf-8"))
    assert data["all"]["vars"] == {"ansible_user": "pi"}
    assert data["all"]["children"]["monitoring"]["hosts"]["grafana"] == {"ansible_host": "10.0.0.9"}
    assert data["all"]["children"]["devices"]["hosts"]["pi1"]["dit_board"]["memory_mb"] == 4096
    with pytest.raises(NodeError) as second_edge:
        inv.upsert(node("edge2", "edge"), create=True)
    assert second_edge.value.field == "role"
    with pytest.raises(NodeError):
        inv.upsert(node("pi2"), create=True)  # exists
    inv.delete("pi2")
    assert "pi2" not in {n.name for n in inv.nodes()}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "1bad", "address": "a", "lat": 0, "lon": 0}, "name"),
        ({"name": "ok", "address": "a b", "lat": 0, "lon": 0}, "address"),
        ({"name": "ok", "address": "a", "lat": 91, "lon": 0}, "lat"),
        ({"name": "ok", "address": "a", "lat": 0, "lon": "x"}, "lon"),
        ({"name": "ok", "address": "a", "lat": 0, "lon": 0, "role": "king"}, "role"),
        ({"name": "ok", "address": "a", "lat": 0, "lon": 0, "board": {"memory_mb": -1}}, "board.memory_mb"),
        ({"name": "ok", "address": "a", "lat": 0, "lon": 0, "board": {"gpu": "x"}}, "board.gpu"),
    ],
)
def test_check_node_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(NodeError) as exc:
        check_node(data)
    assert exc.value.field == field


def test_check_node_names_every_bad_field_at_once() -> None:
    """Issue 36 item 8: a form learns all its problems from one answer, not one per try."""
    with pytest.raises(NodeError) as exc:
        check_node({"name": "1bad", "address": "a b", "lat": 91, "lon": "x", "board": {"cores": 0, "gpu": 1}})
    assert [f for f, _ in exc.value.problems] == ["name", "address", "lat", "lon", "board.cores", "board.gpu"]
    assert exc.value.field == "name" and str(exc.value).startswith("letters, digits")


@pytest.mark.parametrize("model", ["Pi 4\nModel B", "Pi\x1b[31m4", "Pi\x00", "Pi\u2028 4", "x" * 101, "   "])
def test_board_model_refuses_control_characters_and_bounds(model: str) -> None:
    with pytest.raises(NodeError) as exc:
        check_node({"name": "ok", "address": "a", "lat": 0, "lon": 0, "board": {"model": model}})
    assert exc.value.field == "board.model"


@pytest.mark.parametrize(
    "model", ["Pi 4 <8GB>", 'Jetson "Orin" & co', "<img src=x onerror=alert(1)>", "Ärger 4"]
)
def test_board_model_keeps_legitimate_text(model: str) -> None:
    # markup characters are text: every view escapes them, so refusing them would only lose data
    node = check_node({"name": "ok", "address": "a", "lat": 0, "lon": 0, "board": {"model": f" {model} "}})
    assert node["board"]["model"] == model


def test_runtime_actions_hand_ansible_runner_the_inventory_as_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 16: `dit web` started with the default relative --inventory failed every readiness check,
    # because ansible-runner took the relative path for inventory content
    import ansible_runner

    from dit.runtime_api import registry
    from dit.web.services.runtimes import Actions

    seen: dict[str, Any] = {}

    class Result:
        rc, status = 0, "successful"

    def run(**kwargs: Any) -> Result:
        seen.update(kwargs)
        return Result()

    monkeypatch.setattr(ansible_runner, "run", run)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "nnpm.yml").write_text("all: {}\n", encoding="utf-8")
    actions = Actions(tmp_path / "base", lambda: Path("inventories/nnpm.yml"))
    layers = registry.get("layers")
    action = actions.maintenance(layers, layers.actions()[0], {}, ["device1"])
    deadline = time.monotonic() + 30
    while action.finished_ns is None and time.monotonic() < deadline:
        time.sleep(0.05)
    # a list of sources (NNPM's, then one for local-mode nodes when there are any), every one absolute
    assert seen["inventory"] == [str(tmp_path / "inventories" / "nnpm.yml")]


class _ClosingSocket:
    """A WebSocket whose page says hello, then goes away: the client closes without a word."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def accept(self) -> None:
        return None

    async def send_json(self, data: dict[str, Any]) -> None:
        self.sent.append(data)

    async def receive(self) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "websocket.disconnect", "code": 1001}

    async def close(self) -> None:
        return None


def test_an_idle_terminal_tail_ends_when_its_page_closes(tmp_path: Path) -> None:
    # A run that is not finished and writes nothing: before, the tail slept and polled forever, so
    # a closed page kept its task alive and uvicorn's shutdown hung on it.
    from dit.web.services.terminal import tail

    log = tmp_path / "run.log"
    log.write_text("")
    ws = _ClosingSocket()
    asyncio.run(asyncio.wait_for(tail(ws, log, None, lambda: False), timeout=5))  # type: ignore[arg-type]
    assert ws.sent[0]["type"] == "hello"


def test_a_diff_lists_no_default_nobody_typed(tmp_path: Path) -> None:
    """Issue 49 item 6: a network block added by Apply map delays brought its defaults (measure_throughput,
    variation) into the diff as added lines, never typed; a default the researcher did type is listed."""
    store = Store(tmp_path / "nnpm.sqlite")
    v1, _ = store.save(DOC, expand(DOC))
    doc2 = {**DOC, "network": {"device1": {"destinations": {"edge": {"delay_ms": 12}}}}}
    v2, _ = store.save(doc2, expand(doc2))
    d = diff(v1, v2)
    assert [(c["path"], c["b"], c["added"]) for c in d["changes"]] == [
        ("network.device1", {"destinations": {"edge": {"delay_ms": 12}}}, True)
    ]
    assert "measure_throughput" not in d["unified"] and "variation" not in d["unified"]
    assert "+      edge: {delay_ms: 12}" in d["unified"].splitlines(), d["unified"]
    typed = {**DOC, "network": {"device1": {"delay_ms": 3, "measure_throughput": False}}}
    v3, _ = store.save(typed, expand(typed))
    (change,) = diff(v1, v3)["changes"]
    assert change["b"] == {"delay_ms": 3, "measure_throughput": False}  # typed, so listed; variation is not
    # the same value in both (a default in one, typed in the other) is no change
    paths = [c["path"] for c in diff(v2, v3)["changes"]]
    assert paths == ["network.device1.delay_ms", "network.device1.destinations"]
