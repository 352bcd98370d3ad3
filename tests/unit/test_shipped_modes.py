"""What a run ships to a node is its user's alone: 0600 (issue 46, item 5).

dit runs as root and reads what a scenario names (HeadSplit's ``perplexity_paragraph``, a profile run's
costs); the run then writes it into files on the node. Every process reading them runs as the module's
own user, so none of them is readable by anyone else.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dit.run.launch import launch_vars
from dit.runtime_api import registry
from dit.runtimes import LaunchContext
from dit.scenario import resolve
from tests.ansible_modules import library_module, module_util, run_in_process

procs = module_util("dit_procs")


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The usual 022: a stricter umask of the test's would hide a missing chmod."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_dit_node_ships_the_device_code_0600(tmp_path: Path) -> None:
    payload = b"PK device code"
    content = base64.b64encode(payload).decode()
    root = tmp_path / "node" / "run1"
    args = {
        "path": str(root),
        "run_id": "run1",
        "files": [
            {"name": "dit-device.pyz", "content": content, "sha256": hashlib.sha256(payload).hexdigest()}
        ],
    }
    res = run_in_process(library_module("dit_node"), args)
    assert not res.get("failed"), res
    assert res["shipped"] == ["dit-device.pyz"]
    assert (root / "dit-device.pyz").stat().st_mode & 0o777 == 0o600


@pytest.fixture
def headsplit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    pytest.importorskip("headsplit")
    monkeypatch.setattr(
        registry, "BUILTIN", {**registry.BUILTIN, "headsplit": "headsplit.dit_runtime:HeadSplitRuntime"}
    )
    registry.reset()
    yield registry.get("headsplit")
    monkeypatch.undo()
    registry.reset()


def test_a_root_only_perplexity_paragraph_reaches_the_node_0600(headsplit: Any, tmp_path: Path) -> None:
    """The issue's case end to end, without torch: a root-only paragraph (a root-owned scenario may name
    it) goes into the controller's headsplit.json, which dit_launch writes 0600 on the node."""
    paragraph = tmp_path / "paragraph.txt"
    paragraph.write_text("Only root may read this paragraph.\n", encoding="utf-8")
    paragraph.chmod(0o600)
    scenario = resolve(
        {
            "name": "hs",
            "devices": ["device1"],
            "inference": {"enabled": False},
            "runtime": {"name": "headsplit", "workers": ["device1"], "perplexity": True,
                        "perplexity_paragraph": str(paragraph)},
        }
    )  # fmt: skip
    root = tmp_path / "node"
    root.mkdir()
    ctx = LaunchContext(
        run_id=f"modes-{uuid.uuid4().hex[:12]}",
        block=scenario["runtime"],
        scenario=scenario,
        edge_host="edge",
        devices=("device1",),
        addresses={"edge": "127.0.0.1", "device1": "127.0.0.1"},
        node_roots={"edge": str(root), "device1": str(root)},
        pythons={"edge": sys.executable, "device1": sys.executable},
        local=True,
        model={},
        edge_port=None,
    )
    (controller,) = launch_vars(headsplit, ctx, ("edge", "device1"))["edge"]["main"]
    # the controller's own files, started with a stand-in argv (the real one needs torch)
    spec = {**controller, "argv": [sys.executable, "-c", "pass"], "result_files": []}
    try:
        res = run_in_process(
            library_module("dit_launch"),
            {"run_id": ctx.run_id, "host": "edge", "node_root": str(root), "processes": [spec], "wait": True},
        )
    finally:
        procs.reap(ctx.run_id, grace_s=1.0)
    assert not res.get("failed"), res
    config = root / "headsplit.json"
    assert (
        json.loads(config.read_text(encoding="utf-8"))["perplexity"]["text"]
        == "Only root may read this paragraph."
    )
    assert config.stat().st_mode & 0o777 == 0o600


def _modes(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "mode" and isinstance(value, str):
                yield value
            yield from _modes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _modes(value)


def test_headsplit_s_actions_copy_files_for_their_owner_only(headsplit: Any, tmp_path: Path) -> None:
    """distribute-checkpoint and build-speculation-profile put a checkpoint (perhaps one only its author
    could read here), its shards, the corpus ids and the profile on the nodes: 0600 files."""
    from headsplit.plugin import actions

    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}", encoding="utf-8")
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    sha = "a" * 64
    plans = [
        actions.distribute_checkpoint({"path": str(checkpoint / "config.json"), "sha256": sha}),
        actions.distribute_checkpoint({"path": str(checkpoint), "sha256": sha}),
        actions.distribute_checkpoint(
            {"path": str(checkpoint), "sha256": sha, "mode": "placement", "workers": ["device1"]}
        ),
        actions.build_speculation_profile({"model": "gpt2-tiny", "tau": 0.05}),
    ]
    copies = [
        task["ansible.builtin.copy"]
        for plan in plans
        for play in plan.plays
        for task in play["tasks"]
        if "ansible.builtin.copy" in task
    ]
    assert len(copies) >= 4
    assert all(copy["mode"] == "u=rwX,go=" for copy in copies), copies
    assert not [m for plan in plans for m in _modes(plan.plays) if m not in ("u=rwX,go=", "0755")]
