"""Values a user gives are data, never Ansible template text (issue 28, items 1 and 2).

A ``{{ lookup('pipe', 'touch FILE') }}`` planted in every user-reachable string — a scenario's
``model.params`` at any depth (keys too), a runtime action's inputs — must reach the nodes literally: run
and ``--check``, from the CLI and from NNPM. Each test proves the file was never created, and that the
value arrived as it was written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from dit.runtime_ops import plays as ops
from tests.conftest import REPO
from tests.integration.conftest import StartNnpm, loopback_inventory

pytestmark = pytest.mark.root
LOOPBACK = {"host": "127.0.0.1"}


def plant(marker: Path) -> str:
    """A template that would create ``marker`` on this machine if Ansible rendered it."""
    return "{{ lookup('pipe', 'touch " + str(marker) + "') }}"


def scenario_with_payloads(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A one-device fake-model scenario whose free strings all carry a payload, each its own marker."""
    markers = [tmp_path / f"planted-{i}" for i in range(5)]
    doc: dict[str, Any] = {
        "name": "values_are_data",
        "description": "d" + plant(markers[0]),
        "model": {
            "name": "fake",
            "params": {
                "note": plant(markers[1]),
                "nested": [{"deeper": "x" + plant(markers[2])}, plant(markers[3])],
                plant(markers[4]): "a key",
            },
        },
        "devices": ["device1"],
        "repetitions": 1,
        "seed": 0,
        "edge_server": {"policy": "RR"},
        "inference": {"enabled": True, "partition_points": [0, 11], "repetitions": 1},
    }
    path = tmp_path / "values_are_data.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path, markers


def dit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_scenario_strings_stay_literal_in_a_run_and_a_dry_run(tmp_path: Path) -> None:
    scenario, markers = scenario_with_payloads(tmp_path)
    checked = dit("run", "--check", str(scenario), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert not [m for m in markers if m.exists()], "a dry run rendered a scenario value as a template"

    # the runs directory is the user's text too: local mode's inventory holds paths below it
    markers.append(tmp_path / "planted-runs-dir")
    runs = tmp_path / ("r" + plant(markers[-1]))
    done = dit("run", str(scenario), "--runs-dir", str(runs), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not [m for m in markers if m.exists()], "a run rendered a user's value as a template"
    (run,) = (runs / "values_are_data").iterdir()
    # every stage's extra variables: the planted strings are there, written unsafe, as the user wrote them
    params = yaml.safe_load((run / "scenario.yaml").read_text(encoding="utf-8"))["model"]["params"]
    apply_vars = (run / "ansible" / "apply" / "env" / "extravars").read_text(encoding="utf-8")
    assert f"!unsafe '{params['note']}'" in apply_vars.replace("''", "'")
    for stage in ("preflight", "apply", "profile", "collect", "teardown"):
        text = (run / "ansible" / stage / "env" / "extravars").read_text(encoding="utf-8")
        assert "lookup(" not in text or "!unsafe" in text
    status = json.loads((run / "status.json").read_text(encoding="utf-8"))
    assert status["state"] == "completed"


def test_a_runtime_action_input_stays_literal_from_the_cli(tmp_path: Path) -> None:
    """headsplit's distribute-checkpoint with a path that carries a template: the action fails (no such
    checkpoint) and says so with the path as given; nothing runs."""
    from headsplit.dit_runtime import HeadSplitRuntime

    marker = tmp_path / "planted-action"
    runtime = HeadSplitRuntime()
    action = ops.action_of(runtime, "distribute-checkpoint")
    inputs = ops.validate_inputs(
        action, ops.parse_sets([f"path=CK{plant(marker)}", f"sha256={'0' * 64}"], action.inputs)
    )
    assert inputs["sha256"] == "0" * 64  # typed by the schema: a string, not the integer 0
    lines: list[str] = []
    with ops.nodes(None, ("device1",)) as (inv, work):
        outcome = ops.act(runtime, action, inputs, inv, work, lambda e: lines.append(e.message()))
    assert not marker.exists(), "an action input was rendered as a template"
    assert not outcome.ok or outcome.failures()
    failed = "\n".join(lines)
    assert f"CK{plant(marker)}: SHA-256 (no such file), expected {'0' * 64}" in failed, failed


def test_llamacpp_s_mirror_url_stays_literal_from_the_dit_command(tmp_path: Path) -> None:
    """The second path the issue reproduced, through ``dit runtimes act`` itself (the plug-in as ``./dev``
    installs it): the fetch fails against a closed port, and nothing runs."""
    from dit.runtime_api import registry

    if "llamacpp-rpc" not in registry.installed():
        pytest.skip("the llamacpp-rpc plug-in is not installed here (./dev setup installs it)")
    marker = tmp_path / "planted-mirror"
    url = "http://127.0.0.1:1/x" + plant(marker)
    done = dit("runtimes", "act", "llamacpp-rpc", "build", "--set", f"mirror_url={url}", "--set", "jobs=1",
               cwd=tmp_path)  # fmt: skip
    assert not marker.exists(), "an action input was rendered as a template"
    assert done.returncode != 0, done.stdout
    assert "/x{{ lookup('pipe'" in done.stdout + done.stderr, done.stdout[-3000:]  # the URL as given


def test_a_runtime_action_input_stays_literal_from_nnpm(
    tmp_path: Path, nnpm: StartNnpm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The echo plug-in's ``say`` through ``POST /api/runtimes/actions``: the message is printed as given."""
    from dit.runtime_api import registry
    from dit.web.app import WebConfig
    from tests.conftest import install_fixture_package

    monkeypatch.syspath_prepend(str(install_fixture_package("runtime_pkg", tmp_path / "site")))
    registry.reset()
    inventory = loopback_inventory(tmp_path / "inventory.yml")
    config = WebConfig(
        inventory=inventory, runs_dir=tmp_path / "runs", scenarios_dir=REPO / "scenarios", probe="off"
    )
    client = nnpm(config)
    marker = tmp_path / "planted-nnpm"
    message = "m" + plant(marker)
    started = client.post(
        "/api/runtimes/actions",
        json={
            "runtime": "echo",
            "action": "say",
            "inputs": {"message": message, "count": 1},
            "hosts": ["device1"],
        },
    )
    assert started.status_code == 202, started.text
    lines: list[dict[str, Any]] = []
    with client.websocket_connect(f"/api/actions/{started.json()['id']}/terminal", headers=LOOPBACK) as ws:
        while (message_ := ws.receive_json())["type"] != "end":
            lines += message_.get("lines", []) if message_["type"] == "lines" else []
    action = client.get(f"/api/actions/{started.json()['id']}").json()
    registry.reset()
    assert not marker.exists(), "an NNPM action input was rendered as a template"
    assert action["state"] == "done", action
    said = [x["x"] for x in lines if x["n"] == "device1" and x["s"] == "stdout"]
    assert said == [message], lines


def test_a_scenario_from_nnpm_stays_literal_in_its_dry_run(tmp_path: Path, nnpm: StartNnpm) -> None:
    from dit.web.app import WebConfig

    scenario, markers = scenario_with_payloads(tmp_path)
    inventory = loopback_inventory(tmp_path / "inventory.yml")
    config = WebConfig(
        inventory=inventory, runs_dir=tmp_path / "runs", scenarios_dir=tmp_path / "scenarios", probe="off"
    )
    client = nnpm(config)
    saved = client.post(
        "/api/scenarios", json={"document": yaml.safe_load(scenario.read_text(encoding="utf-8"))}
    )
    assert saved.status_code == 201, saved.text
    digest = saved.json()["version"]["hash"]
    dry = client.post("/api/dry-runs", json={"version": digest, "mode": "local"})
    assert dry.status_code == 200, dry.text
    assert dry.json()["ok"] is True, dry.json().get("log_tail", "")[-2000:]
    assert not [m for m in markers if m.exists()], "an NNPM dry run rendered a scenario value as a template"


def test_a_board_fact_typed_in_nnpm_stays_literal_when_a_playbook_reads_the_inventory(tmp_path: Path) -> None:
    """NNPM writes the node's fields into the user's inventory: unsafe, while the user's own templates
    in the same file stay templates."""
    from dit.web.services.nodes import Inventory, check_node

    marker = Path(tempfile.mkdtemp(prefix="dit-")) / "b"  # short: a board fact is at most 100 characters
    path = tmp_path / "inventory.yml"
    path.write_text(
        yaml.safe_dump({"all": {"vars": {"mine": "{{ 40 + 2 }}"}, "children": {"edge": {"hosts": {}}}}}),
        "utf-8",
    )
    inventory = Inventory(path)
    node = check_node({"name": "device1", "address": "127.0.0.1", "lat": 1.0, "lon": 2.0,
                       "board": {"model": "Pi " + plant(marker)}})  # fmt: skip
    inventory.upsert(node, create=True)
    inventory.upsert({**node, "lat": 3.0}, create=False)  # written again: still unsafe
    playbook = tmp_path / "read.yml"
    playbook.write_text(
        yaml.safe_dump([{"hosts": "device1", "gather_facts": False, "tasks": [
            {"ansible.builtin.debug": {"msg": "{{ dit_board.model }}|{{ mine }}"}}]}]),
        "utf-8",
    )  # fmt: skip
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(path),
            str(playbook),
            "-c",
            "local",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists(), "a board fact from NNPM was rendered as a template"
    assert json.dumps("Pi " + plant(marker) + "|42")[1:-1] in done.stdout, done.stdout
