"""A runtime's environment on the nodes (issue 12, item 5): the expected venv, the checkpoint fields,
the metadata record and interpreters preflight derives from the nodes' facts, the launch's interpreter."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dit.runtimes import LaunchContext
from dit.runtimes.envs import RuntimeEnv, checkpoint_paths, expected_env, runtime_record
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "library"))
import dit_facts


def _ctx(**kw: Any) -> LaunchContext:
    return LaunchContext(run_id="r", block={}, scenario={}, edge_host="edge", devices=("d1",),
                         addresses={}, node_roots={}, pythons={"edge": "/py/edge", "d1": "/py/d1"},
                         local=True, model={}, edge_port=None, **kw)  # fmt: skip


def test_the_launch_context_gives_the_venv_interpreter_else_dit_python() -> None:
    assert _ctx().runtime_python("d1") == "/py/d1"  # built without runtime_pythons: as before
    ctx = _ctx(runtime_pythons={"d1": "/opt/dit/runtimes/echo-abc/bin/python"})
    assert ctx.runtime_python("d1") == "/opt/dit/runtimes/echo-abc/bin/python"
    assert ctx.runtime_python("edge") == "/py/edge"


def test_the_expected_venv_is_named_by_the_declared_pin(tmp_path: Path) -> None:
    commit = "ab" * 20
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        json.dumps({"runtimes": [{"name": "hs", "git": "https://x/hs.git", "commit": commit}]})
    )
    env = expected_env("hs", sources)
    assert (env.pin, env.dirname) == (commit, f"hs-{commit[:12]}")
    assert expected_env("layers", sources) == RuntimeEnv(None, None, None)
    assert expected_env("hs", tmp_path / "missing.yaml").dirname is None


def test_checkpoint_fields_are_found_by_name_or_by_the_schema_mark() -> None:
    schema = {
        "properties": {"weights": {"type": "string", "x-dit-checkpoint": True}, "rounds": {"type": "integer"}}
    }
    block = {
        "name": "x",
        "checkpoint": "a.pt",
        "checkpoints": ["b.pt", "a.pt"],
        "weights": "/w.safetensors",
        "rounds": 3,
    }
    assert checkpoint_paths(schema, block) == ["a.pt", "b.pt", "/w.safetensors"]
    assert checkpoint_paths({"properties": {}}, {"rounds": 3}) == []


ENV = RuntimeEnv(None, "f" * 40, "hs-ffffffffffff")


def _facts(installed: bool, packages: list[dict[str, str]] | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {
        "venv": "/r/hs-ffffffffffff",
        "installed": installed,
        "python": "/r/hs-ffffffffffff/bin/python",
    }
    if installed:
        node |= {"stamp": "name=hs", "packages": packages or [{"name": "hs", "version": "1"}]}
    return {"runtime_env": node}


def test_the_record_uses_the_venv_where_installed_and_warns_where_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dit.mirror.runtimes import RuntimeSource

    env = RuntimeEnv(RuntimeSource("hs", git="https://x", commit="f" * 40), "f" * 40, "hs-ffffffffffff")
    facts = {"edge": _facts(True), "d1": _facts(False)}
    record = runtime_record("hs", "1", {"name": "hs"}, env, facts, {"edge": "/py/edge", "d1": "/py/d1"})
    assert record.pythons == {"edge": "/r/hs-ffffffffffff/bin/python", "d1": "/py/d1"}
    assert record.metadata["pin"] == "f" * 40 and record.metadata["venv"] == "/r/hs-ffffffffffff"
    assert record.metadata["packages"] == [{"name": "hs", "version": "1"}]
    assert record.metadata["nodes"]["d1"] == {"installed": False, "venv": "/r/hs-ffffffffffff"}
    [warning] = record.warnings
    assert "no venv /r/hs-ffffffffffff on d1" in warning and "dit runtimes install hs" in warning

    differ = {"edge": _facts(True), "d1": _facts(True, [{"name": "hs", "version": "2"}])}
    record = runtime_record("hs", "1", {}, env, differ, {"edge": "/py/edge", "d1": "/py/d1"})
    assert record.metadata["packages"] is None
    assert record.metadata["nodes"]["d1"]["packages"] == [{"name": "hs", "version": "2"}]
    assert any("packages differ between nodes" in w for w in record.warnings)


def test_an_undeclared_runtime_keeps_dit_python_and_records_checkpoints_per_hash() -> None:
    facts = {
        "edge": {"checkpoints": [{"path": "/c.pt", "sha256": "aa", "size": 1}]},
        "d1": {"checkpoints": [{"path": "/c.pt", "sha256": "bb", "size": 1}]},
        "d2": {"checkpoints": [{"path": "/c.pt", "sha256": "aa", "size": 1}]},
    }
    pythons = {"edge": "/py", "d1": "/py", "d2": "/py"}
    record = runtime_record("layers", "1", {}, RuntimeEnv(None, None, None), facts, pythons)
    assert record.pythons == pythons and record.metadata["venv"] is None and record.metadata["pin"] is None
    assert record.metadata["checkpoints"] == [
        {"path": "/c.pt", "sha256": "aa", "size": 1, "hosts": ["d2", "edge"]},
        {"path": "/c.pt", "sha256": "bb", "size": 1, "hosts": ["d1"]},
    ]
    assert record.warnings == ["runtime layers: checkpoint /c.pt differs between nodes"]


def test_node_facts_read_the_venv_and_hash_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "w.bin").write_bytes(b"weights")
    assert dit_facts._checkpoint("w.bin", str(tmp_path / "ck")) == {
        "path": str(tmp_path / "ck" / "w.bin"),
        "sha256": hashlib.sha256(b"weights").hexdigest(),
        "size": 7,
    }
    assert dit_facts._checkpoint("/nope/x.pt", "/")["error"]
    assert dit_facts._runtime_env(str(tmp_path / "none")) == {
        "venv": str(tmp_path / "none"), "installed": False, "python": str(tmp_path / "none" / "bin" / "python"),
    }  # fmt: skip
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".dit-runtime").write_text("name=x pin=y requirements_sha256=z\n")
    found = dit_facts._runtime_env(str(venv))
    assert found["installed"] and found["stamp"] == "name=x pin=y requirements_sha256=z"
    assert {"name", "version"} == set(found["packages"][0])


def test_a_runtimes_custom_facts_are_recorded_per_node_under_their_names() -> None:
    build = {"path": "/c/832db0699007/build.json", "content": {"sha256": "83" * 32}}
    missing = {"path": "/c/832db0699007/build.json", "error": "No such file or directory"}
    facts: dict[str, dict[str, Any]] = {
        "edge": {"runtime_facts": {"llamacpp_build": build}},
        "d1": {"runtime_facts": {"llamacpp_build": missing}},
    }
    record = runtime_record(
        "llamacpp-rpc", "1", {}, RuntimeEnv(None, None, None), facts, {"edge": "/py", "d1": "/py"}
    )
    assert record.metadata["nodes"] == {"edge": {"llamacpp_build": build}, "d1": {"llamacpp_build": missing}}
    assert record.warnings == []
