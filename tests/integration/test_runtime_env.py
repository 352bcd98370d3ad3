"""An external runtime in its own venv (issue 12, item 5), in local mode, offline.

A mirror holding the echo fixture runtime is built by mirror/build's runtime step from
tests/fixtures/runtime_sources.yaml; ``dit runtimes install echo`` installs it with roles/runtime_env
into ``$DIT_RUNTIMES_DIR/echo-<pin12>`` (no index, hashes required), a second install changes nothing,
and a run of the echo scenario starts its processes with that venv's interpreter and records the pin,
the venv's packages and the checkpoint's SHA-256 in metadata.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dit.mirror.build import host_arch
from dit.mirror.runtimes import load_runtimes
from tests.conftest import DIT, REPO, dit_env, install_fixture_package
from tests.integration.test_runtime_plugin import echo_scenario

SOURCES = REPO / "tests" / "fixtures" / "runtime_sources.yaml"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("runtime-env")
    site = install_fixture_package("runtime_pkg", work)
    mirror = work / "mirror"
    subprocess.run(
        [sys.executable, "-m", "dit.mirror", "build", "--out", str(mirror), "--skip-wheels", "--skip-debs",
         "--skip-sources", "--skip-weights", "--arch", host_arch(), "--sources", str(SOURCES)],
        check=True, capture_output=True, env={**dit_env(), "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    return {"site": site, "mirror": mirror, "runtimes": work / "runtimes", "work": work}


def dit(world: dict[str, Path], *args: str, runtimes: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dit_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(world["site"]), env.get("PYTHONPATH", "")) if p)
    env["DIT_MIRROR_SOURCES"] = str(SOURCES)
    env["DIT_RUNTIMES_DIR"] = str(runtimes or world["runtimes"])
    return subprocess.run(
        [*DIT, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_install_refuses_an_undeclared_runtime_or_a_mirror_without_its_pin(world: dict[str, Path]) -> None:
    undeclared = dit(world, "runtimes", "install", "layers", "--mirror", str(world["mirror"]))
    assert undeclared.returncode == 2
    assert f"runtime layers is not declared in {SOURCES}" in " ".join(undeclared.stderr.split())
    empty = world["work"] / "empty-mirror"
    empty.mkdir()
    missing = dit(world, "runtimes", "install", "echo", "--mirror", str(empty))
    assert missing.returncode == 2
    assert "run mirror/build --runtime echo" in " ".join(missing.stderr.split())
    assert not world["runtimes"].exists()

    # a wheel whose SHA-256 is not the one mirror/build wrote into the requirements is refused by pip
    tampered = world["work"] / "tampered-mirror"
    shutil.copytree(world["mirror"], tampered)
    [wheel] = tampered.glob("runtimes/echo-*/*.whl")
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("echo_runtime/extra.py", "print('not what was built')\n")
    elsewhere = world["work"] / "tampered-runtimes"
    refused = dit(world, "runtimes", "install", "echo", "--mirror", str(tampered), runtimes=elsewhere)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stdout
    assert not list(elsewhere.glob("echo-*/.dit-runtime"))  # nothing is recorded as installed


def test_installed_runtime_runs_in_its_venv_and_preflight_records_it(
    world: dict[str, Path], tmp_path: Path
) -> None:
    [source] = load_runtimes(SOURCES)
    pin = source.pin
    venv = world["runtimes"] / f"echo-{pin[:12]}"

    first = dit(world, "runtimes", "install", "echo", "--mirror", str(world["mirror"]))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "changed" in first.stdout  # the venv was made and the runtime installed
    stamp = (venv / ".dit-runtime").read_text(encoding="utf-8")
    assert stamp.startswith(f"name=echo pin={pin} requirements_sha256=")
    read = "import importlib.metadata as m; print(m.version('dit-echo-runtime'))"
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", read], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == "0.1.0"
    stamp_mtime = (venv / ".dit-runtime").stat().st_mtime_ns

    again = dit(world, "runtimes", "install", "echo", "--mirror", str(world["mirror"]))
    assert again.returncode == 0, again.stdout + again.stderr
    assert " changed" not in again.stdout  # nothing to do the second time
    assert (venv / ".dit-runtime").stat().st_mtime_ns == stamp_mtime

    checkpoint = tmp_path / "weights.bin"
    checkpoint.write_bytes(b"\x01\x02" * 5000)
    scenario = echo_scenario(tmp_path, rounds=2, checkpoint=str(checkpoint))
    done = dit(world, "run", str(scenario), "--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs" / "echo").iterdir()
    runtime = json.loads((run_dir / "metadata.json").read_text(encoding="utf-8"))["runtime"]
    assert (runtime["name"], runtime["version"], runtime["pin"]) == ("echo", "0.1.0", pin)
    assert runtime["venv"] == str(venv)
    assert {"name": "dit-echo-runtime", "version": "0.1.0"} in runtime["packages"]
    assert all(p["name"] != "dit" for p in runtime["packages"])  # the venv is the runtime's, not dit's
    assert runtime["checkpoints"] == [
        {
            "path": str(checkpoint),
            "sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(),
            "size": 10000,
            "hosts": ["device1", "device2", "edge"],
        }
    ]
    assert {h: n["installed"] for h, n in runtime["nodes"].items()} == {
        "device1": True,
        "device2": True,
        "edge": True,
    }
    log = (run_dir / "run.log").read_text(encoding="utf-8")
    assert f"[echo-controller] controller runs in {venv}" in log
    assert log.count(f"worker runs in {venv}") == 2
