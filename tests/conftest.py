"""Shared fixtures: small scenarios written to a temporary directory, run dirs under tmp."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DIT = [sys.executable, "-m", "dit"]


@pytest.fixture(scope="session", autouse=True)
def _session_lease_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Local runs lease this machine (dit.run.lease_decision): a test session must not contend with the user's
    own runs or another session's. Module-scoped fixtures that run dit see this directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIT_LOCAL_LEASE_DIR", str(tmp_path_factory.mktemp("lease")))
        yield


@pytest.fixture(scope="session", autouse=True)
def _local_cpu_share_off() -> Iterator[None]:
    """Local runs give each device its own CPU cgroup by default (``DIT_LOCAL_CPU_SHARE=auto``), which
    slows a run's devices to their share (the quickstart: 62 s against 54 s). The suite turns it off;
    ``test_local_pipeline_runs_all_stages_and_leaves_nothing`` runs the default and checks the cgroups."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIT_LOCAL_CPU_SHARE", "off")
        yield


@pytest.fixture(autouse=True)
def _lease_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own machine lease, so that a run a failed test left behind blocks no other test."""
    path = tmp_path_factory.mktemp("lease")
    monkeypatch.setenv("DIT_LOCAL_LEASE_DIR", str(path))
    return path


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (``./dev test``), keep together on one worker, in order,
    the tests of a module that share a module- or class-scoped fixture (a run several tests read, a
    server and browser whose state the next test builds on): spread over workers, each would make the
    run again. Every other test is scheduled on its own."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = any(
            d.scope in ("module", "class", "package") for defs in info.name2fixturedefs.values() for d in defs
        )
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fixture runtime (tests/fixtures/runtime_pkg), registered in this process as a built-in (the
    integration tests install it with pip); it declares nothing of where it sends from."""
    from dit.runtime_api import registry

    monkeypatch.syspath_prepend(str(REPO / "tests" / "fixtures" / "runtime_pkg"))
    monkeypatch.setattr(registry, "BUILTIN", {**registry.BUILTIN, "echo": "echo_runtime:EchoRuntime"})
    registry.reset()
    yield registry.get("echo")
    monkeypatch.undo()
    sys.modules.pop("echo_runtime", None)
    registry.reset()


# A run held in its profile stage at no CPU cost, for the tests that stop, kill or queue behind a run
# that is going: its device agents prepare, then sleep until a start instant ten minutes ahead (the
# schema's maximum lead). Heavy fake stages did the holding before, and their agents kept both cores
# busy for every second a test held them, beside the suite's other workers (and uncounted: orphans).
HELD: dict[str, object] = {"start_lead_s": 600}


def write_scenario(directory: Path, **overrides: object) -> Path:
    """A small local scenario (the 4-stage fake model, two devices) with ``overrides`` applied."""
    doc: dict[str, object] = {
        "name": "itest",
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": ["device1", "device2"],
        "repetitions": 2,
        "warmup": 1,
        "seed": 7,
        # a short capacity profile (the default lasts 2 s: tests/integration/test_edge_service.py)
        "edge_server": {"policy": "SJF", "profile_min_s": 0.2},
        "inference": {"enabled": True, "partition_points": [0, 2, 4], "repetitions": 3},
        "optimisation": {"enabled": True, "algorithm": "greedy", "objective": "total_delay"},
        "timing": {"start_lead_s": 1.0},
    }
    doc.update(overrides)
    path = directory / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of no run's (``sleep 120``): the pid a stale or forged driver.json names."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def scenario_dir(tmp_path: Path) -> Path:
    d = tmp_path / "scenarios"
    d.mkdir()
    return d


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def dit_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DIT_RUN_ID", None)
    return env


def env_with_site(site: Path) -> dict[str, str]:
    """:func:`dit_env` with ``site`` (a package installed by :func:`install_fixture_package`) importable."""
    env = dit_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def dit_with_site(site: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``dit ARGS`` from the repository, with the plug-in package installed in ``site``."""
    return subprocess.run(
        [*DIT, *args], cwd=REPO, env=env_with_site(site), capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def process_tag(proc: object) -> str | None:
    """A run process's ``DIT_TAG``, or None once it has exited (between listing and reading it)."""
    import psutil

    from dit.device.tags import TAG_ENV

    try:
        return proc.environ().get(TAG_ENV)  # type: ignore[attr-defined,no-any-return]
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def install_fixture_package(name: str, work: Path, source_dir: Path | None = None) -> Path:
    """pip-install ``tests/fixtures/<name>`` (or ``source_dir``) offline into a throwaway target; the
    directory to import from. The package is built from a copy: the build writes into its source tree.
    """
    source = work / name
    shutil.copytree(
        source_dir or REPO / "tests" / "fixtures" / name,
        source,
        ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info", "build"),
    )
    site = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(source)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return site


def scenario_runtime(path: Path) -> str:
    """The runtime a scenario file names (``layers`` without a ``runtime`` block)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    block = doc.get("runtime") if isinstance(doc, dict) else None
    return str(block.get("name", "layers")) if isinstance(block, dict) else "layers"


def scenario_runtimes(path: Path) -> list[str]:
    """Every runtime a scenario file names: its ``runtime`` block's and those of a sweep over ``runtime``
    (ch6_compare sweeps headsplit against llamacpp-rpc)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    names = [scenario_runtime(path)]
    for axis in (doc.get("sweep") or []) if isinstance(doc, dict) else []:
        if isinstance(axis, dict) and axis.get("path") == "runtime":
            names += [str(v["name"]) for v in axis.get("values") or [] if isinstance(v, dict) and "name" in v]
    return list(dict.fromkeys(names))


@contextmanager
def shipped_runtime(path: Path) -> Iterator[str]:
    """The runtimes the scenario ``path`` names, usable in this process for the block's duration.

    Installed (the venv's entry points), or else registered from this repository's own distribution
    ``runtimes/<name>/`` (its ``dit.runtimes`` entry point, its ``src`` on ``sys.path``) as the test
    of a shipped scenario needs it; the test is skipped when neither gives it (e.g. CI without it).
    Yields the name of the scenario's own ``runtime`` block.
    """
    from dit.runtime_api import registry

    names = scenario_runtimes(path)
    missing = [name for name in names if name not in registry.installed()]
    if not missing:
        yield names[0]
        return
    saved_builtin, saved_path = registry.BUILTIN, list(sys.path)
    extra: dict[str, str] = {}
    for name in missing:
        project = REPO / "runtimes" / name / "pyproject.toml"
        if not project.is_file():
            project = next(
                (
                    p
                    for p in sorted((REPO / "runtimes").glob("*/pyproject.toml"))
                    if name
                    in tomllib.loads(p.read_text(encoding="utf-8"))["project"]
                    .get("entry-points", {})
                    .get("dit.runtimes", {})
                ),
                project,
            )
        if not project.is_file():
            pytest.skip(f"{path.name}: runtime {name} is not installed and not in runtimes/")
        extra[name] = tomllib.loads(project.read_text(encoding="utf-8"))["project"]["entry-points"][
            "dit.runtimes"
        ][name]
        sys.path.insert(0, str(project.parent / "src"))
    registry.BUILTIN = {**saved_builtin, **extra}
    registry.reset()
    try:
        for name in missing:
            if name not in registry.installed():
                pytest.skip(f"{path.name}: runtime {name} does not load: {registry.problems().get(name)}")
        yield names[0]
    finally:
        registry.BUILTIN = saved_builtin
        sys.path[:] = saved_path
        registry.reset()


CPU_LOG = "DIT_TEST_CPU_LOG"  # a file: each test appends "<cpu seconds>\t<wall seconds>\t<node id>"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``DIT_TEST_CPU_LOG`` set, the CPU time each test costs (its worker's and every child process
    it waited for: the driver, ansible-playbook and the modules it runs) is appended to that file, to
    see where the suite's CPU goes (``sort -rn`` it); processes a run leaves to init are not counted."""
    path = os.environ.get(CPU_LOG)
    if not path:
        return (yield)
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    before, started = cpu(), time.monotonic()
    try:
        return (yield)
    finally:
        line = f"{cpu() - before:.2f}\t{time.monotonic() - started:.2f}\t{item.nodeid}\n"
        with open(path, "a", encoding="utf-8") as log:
            log.write(line)
