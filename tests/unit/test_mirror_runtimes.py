"""External runtimes in the mirror (issue 12, item 5): declarations, pins, wheels built at mirror-build time.

Offline: the runtime is the echo fixture (tests/fixtures/runtime_pkg), its wheel is built with the
builder's setuptools and no index; a git source is a throwaway local repository; the requirement wheels
come from a local find-links directory with an empty directory as the index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dit.mirror import build, manifest, runtimes
from dit.mirror.manifest import sha256_file
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "fixtures" / "molecule"))
import small_mirror

FIXTURE = REPO / "tests" / "fixtures" / "runtime_pkg"


def _git(*args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z"}  # fmt: skip
    return subprocess.run(["git", *args], capture_output=True, text=True, env=env, check=True).stdout.strip()


def _options(out: Path, sources_file: Path, **kw: object) -> build.BuildOptions:
    return build.BuildOptions(out=out, repo=REPO, skip_wheels=True, skip_debs=True, skip_sources=True,
                              skip_weights=True, sources_file=sources_file, **kw)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "git": "u", "commit": "main"}, r"runtimes\[0\]\.commit: 'main' is not a full 40-hex"),
        ({"name": "x", "git": "u", "path": "p"}, r"runtimes\[0\]: exactly one of git"),
        ({"name": "x"}, r"runtimes\[0\]: exactly one of git"),
        ({"name": "../x", "path": "p"}, r"runtimes\[0\]\.name: '\.\./x' is not a plain name"),
        ({"name": "x", "path": "p", "commit": "a" * 40}, r"runtimes\[0\]\.commit: only with git"),
        ({"name": "x", "path": "p", "requirements": {"sparc": "r"}}, r"runtimes\[0\]\.requirements: 'sparc'"),
        ({"name": "x", "path": "p", "wheel_sha256": "abc"}, r"runtimes\[0\]\.wheel_sha256: 'abc' is not"),
        ({"name": "x", "path": "p", "subdirectory": "../up"}, r"runtimes\[0\]\.subdirectory"),
        ({"name": "x", "path": "p", "branch": "main"}, r"runtimes\[0\]: unknown field\(s\) branch"),
    ],
)
def test_declarations_are_refused_naming_the_field(entry: dict[str, object], message: str) -> None:
    with pytest.raises(runtimes.RuntimeSourceError, match=message):
        runtimes.parse_runtimes([entry], Path("/base"))


def test_the_repositorys_sources_file_declares_valid_runtimes() -> None:
    for src in runtimes.load_runtimes(REPO / "mirror" / "sources.yaml"):
        assert src.commit is not None or (src.path is not None and src.path.is_dir())


def test_a_directory_is_pinned_by_its_files_not_its_build_by_products(tmp_path: Path) -> None:
    tree = tmp_path / "rt"
    shutil.copytree(FIXTURE, tree)
    pin = runtimes.tree_sha256(tree)
    (tree / "echo_runtime" / "__pycache__").mkdir()
    (tree / "echo_runtime" / "__pycache__" / "x.pyc").write_bytes(b"x")
    (tree / "build").mkdir()
    assert runtimes.tree_sha256(tree) == pin
    (tree / "echo_runtime" / "node.py").write_text("changed\n")
    assert runtimes.tree_sha256(tree) != pin


def test_a_directory_runtime_is_built_into_the_mirror_with_hashed_requirements(tmp_path: Path) -> None:
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    probe = small_mirror.write_wheel(probe_dir)
    (tmp_path / "index").mkdir()
    lock = tmp_path / "rt-lock.txt"
    lock.write_text(
        f"# dit-lock: name=rt sources=local\ndit-molecule-probe==0.1 --hash=sha256:{sha256_file(probe)}\n"
    )
    tree = tmp_path / "echo"
    shutil.copytree(FIXTURE, tree)
    sources_file = tmp_path / "mirror" / "sources.yaml"
    sources_file.parent.mkdir()
    sources_file.write_text(
        json.dumps({"runtimes": [{"name": "echo", "path": "../echo", "requirements": "../rt-lock.txt"}]})
    )
    [src] = runtimes.load_runtimes(sources_file)
    pin = runtimes.tree_sha256(tree)
    assert src.pin == pin and src.env_name() == f"echo-{pin[:12]}"

    out = tmp_path / "m"
    options = _options(out, sources_file, archs=("x86_64",), index_url=(tmp_path / "index").as_uri(),
                       source_locations={"local": str(probe_dir)})  # fmt: skip
    doc = build.build_mirror(options, log=lambda _: None)

    directory = out / "runtimes" / f"echo-{pin[:12]}"
    [wheel] = directory.glob("*.whl")
    assert wheel.name == "dit_echo_runtime-0.1.0-py3-none-any.whl"
    assert "echo_runtime/node.py" in zipfile.ZipFile(wheel).namelist()
    assert not (tree / "build").exists() and not list(tree.glob("*.egg-info"))  # built from a copy
    digest = sha256_file(wheel)
    reqs = (directory / "requirements-x86_64.txt").read_text().splitlines()
    assert f"dit-echo-runtime==0.1.0 --hash=sha256:{digest}" in reqs
    assert f"dit-molecule-probe==0.1 --hash=sha256:{sha256_file(probe)}" in reqs
    assert not (directory / "requirements-aarch64.txt").exists()  # --arch x86_64 only
    record = json.loads((directory / "runtime.json").read_text())
    assert record["pin"] == pin and record["wheel_sha256"] == digest and record["version"] == "0.1.0"
    files = {f["path"]: f for f in doc["files"]}
    entry = files[f"runtimes/echo-{pin[:12]}/{wheel.name}"]
    assert (entry["kind"], entry["runtime"], entry["pin"], entry["sha256"]) == (
        "runtime-wheel",
        "echo",
        pin,
        digest,
    )
    assert files[f"wheels/x86_64/{probe.name}"]["locks"] == ["runtime:echo"]
    assert manifest.verify_mirror(out)[0] == []

    # the same pin builds the same bytes (SOURCE_DATE_EPOCH), so a wheel hash can pin it too
    again = _options(tmp_path / "m2", sources_file, archs=("x86_64",), index_url=(tmp_path / "index").as_uri(),
                     source_locations={"local": str(probe_dir)})  # fmt: skip
    build.build_mirror(again, log=lambda _: None)
    assert sha256_file(tmp_path / "m2" / "runtimes" / f"echo-{pin[:12]}" / wheel.name) == digest
    sources_file.write_text(
        json.dumps({"runtimes": [{"name": "echo", "path": "../echo", "wheel_sha256": "0" * 64}]})
    )
    with pytest.raises(
        build.BuildError, match=f"has sha256 {digest}, the declaration pins wheel_sha256 0000"
    ):
        build.build_mirror(_options(tmp_path / "m3", sources_file), log=lambda _: None)


def test_a_git_runtime_is_cloned_bare_and_built_at_its_pinned_commit(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _git("init", "-q", "-b", "main", str(work))
    shutil.copytree(FIXTURE, work / "python")
    _git("-C", str(work), "add", "-A")
    _git("-C", str(work), "commit", "-q", "-m", "one")
    pinned = _git("-C", str(work), "rev-parse", "HEAD")
    (work / "python" / "echo_runtime" / "node.py").write_text("# the next commit\n")
    _git("-C", str(work), "commit", "-q", "-am", "two")
    sources_file = tmp_path / "sources.yaml"
    sources_file.write_text(
        json.dumps(
            {"runtimes": [{"name": "echo", "git": "work", "commit": pinned, "subdirectory": "python"}]}
        )
    )

    out = tmp_path / "m"
    doc = build.build_mirror(_options(out, sources_file, archs=("aarch64",)), log=lambda _: None)

    bare = out / "sources" / "echo.git"
    assert _git("-C", str(bare), "rev-parse", "HEAD") == pinned
    [wheel] = (out / "runtimes" / f"echo-{pinned[:12]}").glob("*.whl")
    node = zipfile.ZipFile(wheel).read("echo_runtime/node.py").decode()
    assert node == (FIXTURE / "echo_runtime" / "node.py").read_text()  # the pinned commit, not the newest
    reqs = (out / "runtimes" / f"echo-{pinned[:12]}" / "requirements-aarch64.txt").read_text()
    assert reqs.splitlines()[-1] == f"dit-echo-runtime==0.1.0 --hash=sha256:{sha256_file(wheel)}"
    kinds = {f["kind"] for f in doc["files"]}
    assert {"source", "runtime", "runtime-wheel"} <= kinds
    with pytest.raises(build.BuildError, match="runtime\\(s\\) nope not declared"):
        build.build_mirror(_options(out, sources_file, runtime_names=("nope",)), log=lambda _: None)
