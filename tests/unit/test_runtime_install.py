"""The in-repo runtimes are part of the install (issue 29 item 1): every shipped scenario validates in
the environment ``./dev setup`` makes, and a scenario naming an in-repo runtime that is not installed is
told where it is and the command that installs it, never only that it is not one of the installed."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dit.runtime_api import registry
from dit.scenario import validate

REPO = Path(__file__).resolve().parents[2]

# One child for every scenario, through the CLI's own validate command: the child sees only what is
# installed (not this test run's pythonpath, which puts runtimes/*/src on sys.path).
VALIDATE_ALL = """
import json, sys
from typer.testing import CliRunner
from dit.cli import app
runner = CliRunner()
failed = {}
for path in sys.argv[1:]:
    result = runner.invoke(app, ["validate", path])
    if result.exit_code != 0:
        failed[path] = result.output[-2000:]
print(json.dumps(failed))
"""


def test_every_shipped_scenario_validates_in_the_environment_dev_sets_up() -> None:
    shipped = sorted(str(p) for p in (REPO / "scenarios").glob("*.yaml"))
    assert any("ch6_" in p for p in shipped)  # the ones that name the in-repo runtimes
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", VALIDATE_ALL, *shipped],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{path}:\n{out}" for path, out in failed.items())


def test_the_in_repo_runtimes_are_found_from_their_pyproject_entry_points() -> None:
    assert registry.shipped() == {
        "headsplit": REPO / "runtimes" / "headsplit",
        "llamacpp-rpc": REPO / "runtimes" / "llamacpp",
    }


@pytest.fixture
def without_in_repo_runtimes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry as it is where the in-repo runtimes were never installed: their entry points unseen."""
    real = importlib.metadata.entry_points
    hidden = set(registry.shipped())

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [ep for ep in real(group=group) if ep.name not in hidden]

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry, "BUILTIN", {k: v for k, v in registry.BUILTIN.items() if k not in hidden})
    monkeypatch.chdir(REPO)
    registry.reset()
    yield
    monkeypatch.undo()
    registry.reset()


def scenario(runtime: dict[str, object]) -> dict[str, object]:
    return {
        "name": "rt",
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": ["device1", "device2"],
        "inference": {"enabled": False},
        "runtime": runtime,
    }


@pytest.mark.usefixtures("without_in_repo_runtimes")
def test_a_scenario_naming_an_in_repo_runtime_that_is_not_installed_is_told_the_install_command() -> None:
    assert "headsplit" not in registry.installed()
    (error,) = validate(scenario({"name": "headsplit"}))
    assert error.path == "runtime.name"
    assert "is not one of" not in error.message
    assert "runtime 'headsplit' is not installed: it ships with dit in ./runtimes/headsplit/" in error.message
    assert "install --no-deps ./runtimes/headsplit`" in error.message
    assert (
        "`dit runtimes install headsplit`" in error.message
    )  # mirror/sources.yaml declares it for the nodes
    (error,) = validate(scenario({"name": "llamacpp-rpc"}))
    assert "install --no-deps ./runtimes/llamacpp`" in error.message
    assert "dit runtimes install" not in error.message  # not a runtime the mirror builds a node venv of
    with pytest.raises(registry.UnknownRuntime, match=r"install --no-deps \./runtimes/headsplit"):
        registry.get("headsplit")


@pytest.mark.usefixtures("without_in_repo_runtimes")
def test_a_runtime_neither_installed_nor_shipped_still_lists_the_installed_ones() -> None:
    (error,) = validate(scenario({"name": "nosuch"}))
    assert str(error) == "runtime.name: 'nosuch' is not one of layers"


def test_an_installed_runtime_that_does_not_load_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "BUILTIN", {**registry.BUILTIN, "broken": "no_such_module_xyz:Thing"})
    registry.reset()
    try:
        (error,) = validate(scenario({"name": "broken"}))
        assert error.message.startswith("runtime 'broken' is installed but does not load (no_such_module_xyz")
    finally:
        monkeypatch.undo()
        registry.reset()
