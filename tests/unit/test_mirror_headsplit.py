"""HeadSplit in the mirror (issue 13): declared in mirror/sources.yaml with hash-locked requirements for
both architectures, built into a wheel by mirror/build's runtimes path.

No network and no torch download: the build's requirement downloads are replaced by a recorder (the
locks' wheels are PyPI's and PyTorch's; tests/unit/test_mirror_runtimes.py proves the download path
with a local wheel).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from dit.mirror import build, locks, runtimes, wheels
from tests.conftest import REPO

SOURCES = REPO / "mirror" / "sources.yaml"


def _headsplit() -> runtimes.RuntimeSource:
    found = runtimes.declared("headsplit", SOURCES)
    assert found is not None, "mirror/sources.yaml does not declare headsplit under runtimes:"
    return found


def test_headsplit_is_declared_with_a_lock_per_architecture() -> None:
    src = _headsplit()
    assert src.path == REPO / "runtimes" / "headsplit"
    for arch in ("x86_64", "aarch64"):
        lock_path = src.lock_for(arch)
        assert lock_path is not None, arch
        lock = locks.read_lock(lock_path)
        assert lock.arch == arch and not lock.unhashed and lock.pins, arch
        spec = locks.ALL_LOCKS_BY_NAME[lock.name]
        assert spec.lock_path(REPO) == lock_path


@pytest.mark.parametrize(("arch", "project_lock"), [("x86_64", "edge"), ("aarch64", "device-llm")])
def test_headsplit_torch_is_the_project_locks_torch(arch: str, project_lock: str) -> None:
    """The boards' torch is the CPU-only aarch64 2.10.0 of device-llm; x86_64 the CPU build of edge.
    Every pin agrees with the project lock the runtime lock is constrained by."""
    lock_path = _headsplit().lock_for(arch)
    assert lock_path is not None
    lock = locks.read_lock(lock_path)
    project = locks.read_lock(REPO / "requirements" / f"{project_lock}.txt")
    assert lock.pins["torch"].version == project.pins["torch"].version
    assert lock.pins["torch"].version == ("2.13.0+cpu" if arch == "x86_64" else "2.10.0")
    for name, pin in lock.pins.items():
        if name in project.pins:
            assert pin.version == project.pins[name].version, name
            assert pin.hashes <= project.pins[name].hashes, name
    assert not any(n.startswith(("nvidia-", "triton")) for n in lock.pins), "a CUDA build slipped in"


@pytest.mark.parametrize("spec", locks.RUNTIME_LOCKS, ids=lambda s: s.name)
def test_runtime_lock_input_is_current_with_its_pyproject(spec: locks.LockSpec) -> None:
    pyproject = locks.read_pyproject(spec.pyproject_path(REPO))
    assert spec.lock_path(REPO).with_suffix(".in").read_text() == locks.input_text(spec, pyproject)
    argv = locks.compile_command(spec, "uv", REPO / "requirements", {"torch-cpu": "/w"})
    assert argv[3] == f"{spec.directory}/{spec.output.removesuffix('.txt')}.in"
    assert argv[argv.index("--output-file") + 1] == f"{spec.directory}/{spec.output}"
    assert argv[argv.index("--constraint") + 1] == f"requirements/{spec.constrain[0]}.txt"


@pytest.mark.slow  # pip wheel of runtimes/headsplit: 5-35 s depending on load
def test_mirror_build_runtimes_path_builds_headsplits_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: dict[str, list[str]] = {}

    def record(lock: locks.LockFile, platform: locks.Platform, dest: Path, *_: Any) -> dict[str, Any]:
        fetched[platform.arch] = sorted(lock.pins)
        return {}

    monkeypatch.setattr(wheels, "download_lock", record)
    out = tmp_path / "m"
    options = build.BuildOptions(out=out, repo=REPO, skip_wheels=True, skip_debs=True, skip_sources=True,
                                 skip_weights=True, sources_file=SOURCES, runtime_names=("headsplit",))  # fmt: skip
    doc = build.build_mirror(options, log=lambda _: None)
    src = _headsplit()
    directory = out / "runtimes" / src.env_name()
    record_doc = json.loads((directory / runtimes.RUNTIME_JSON).read_text())
    assert record_doc["distribution"] == "headsplit" and record_doc["pin"] == runtimes.tree_sha256(src.path)  # type: ignore[arg-type]
    wheel = directory / record_doc["wheel"]
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "headsplit = headsplit.dit_runtime:HeadSplitRuntime" in zf.read(entry_points).decode()
    assert {"headsplit/checkpoint.py", "headsplit/shard.py", "headsplit/dit_runtime.py"} <= set(names)
    for arch, torch_version in (("x86_64", "2.13.0+cpu"), ("aarch64", "2.10.0")):
        req = locks.read_lock(directory / f"requirements-{arch}.txt")
        assert req.pins["torch"].version == torch_version and not req.unhashed
        assert req.pins["headsplit"].hashes == {record_doc["wheel_sha256"]}
        assert "torch" in fetched[arch]  # the build would fetch the lock's wheels for that architecture
    kinds = {f["path"]: f.get("kind") for f in doc["files"]}
    assert kinds[wheel.relative_to(out).as_posix()] == "runtime-wheel"
