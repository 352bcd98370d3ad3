"""The converter's source tree from the pinned sdist: hash-checked, unpacked safely, idempotent (issue 29
item 5). Small stand-in archives with the sdist's layout; the real sdist is never needed here."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dit_llamacpp import build, models, source

TOP = "llama_cpp_python-0.3.36"
NAME = f"{TOP}.tar.gz"


def make_sdist(
    directory: Path, extra: list[tarfile.TarInfo] | None = None, converter: bool = True, name: str = NAME
) -> tuple[Path, str]:
    """An archive with the sdist's top directory and (by default) the vendored converter; its SHA-256."""
    path = directory / name
    with tarfile.open(path, "w:gz") as tar:
        files = {f"{TOP}/pyproject.toml": b"[project]\nname = 'llama_cpp_python'\n"}
        if converter:
            files[f"{TOP}/vendor/llama.cpp/convert_hf_to_gguf.py"] = b"print('converter')\n"
        for member_name, data in files.items():
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_unpacks_where_the_converter_looks_with_the_pin_recorded(tmp_path: Path) -> None:
    archive, sha = make_sdist(tmp_path)
    dest = tmp_path / "src"
    tree = source.unpack(archive, dest, sha256=sha, log=lambda _m: None)
    assert tree == dest / TOP == source.source_dir(dest)
    assert models.vendored(tree) == tree / "vendor" / "llama.cpp"  # what the converter reads
    assert json.loads((tree / source.MARKER).read_text(encoding="utf-8"))["sha256"] == sha
    assert sorted(p.name for p in dest.iterdir()) == [TOP]  # no scratch left behind


def test_the_defaults_are_the_converters_defaults() -> None:
    assert source.source_dir() == models.DEFAULT_SOURCE
    assert (build.SDIST_SHA256, build.SDIST_VERSION) == (models.SDIST_SHA256, models.SDIST_VERSION)


def test_a_second_call_returns_the_tree_without_the_archive(tmp_path: Path) -> None:
    archive, sha = make_sdist(tmp_path)
    dest = tmp_path / "src"
    first = source.unpack(archive, dest, sha256=sha, log=lambda _m: None)
    stamp = (first / source.MARKER).stat().st_mtime_ns
    archive.unlink()
    logged: list[str] = []
    assert source.unpack(archive, dest, sha256=sha, log=logged.append) == first
    assert (first / source.MARKER).stat().st_mtime_ns == stamp
    assert "already unpacked" in logged[0]


def test_an_incomplete_tree_is_replaced(tmp_path: Path) -> None:
    archive, sha = make_sdist(tmp_path)
    dest = tmp_path / "src"
    (dest / TOP / "vendor").mkdir(parents=True)  # e.g. a half-finished unpack by hand: no marker
    (dest / TOP / "stale.txt").write_text("old", encoding="utf-8")
    tree = source.unpack(archive, dest, sha256=sha, log=lambda _m: None)
    assert not (tree / "stale.txt").exists() and (tree / source.MARKER).is_file()


def test_another_hash_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    archive, sha = make_sdist(tmp_path)
    dest = tmp_path / "src"
    with pytest.raises(source.SourceError, match=f"SHA-256 {sha} is not the pinned {'0' * 64}"):
        source.unpack(archive, dest, sha256="0" * 64, log=lambda _m: None)
    assert not dest.exists() or list(dest.iterdir()) == []


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "member",
    [
        _member(f"{TOP}/../escaped.txt"),
        _member("/tmp/dit-absolute-escape.txt"),
        _member("other_top/file.txt"),
        _member(f"{TOP}/vendor/link", tarfile.SYMTYPE, "../../../outside"),
        _member(f"{TOP}/vendor/abs", tarfile.SYMTYPE, "/etc/passwd"),
        _member(f"{TOP}/hard", tarfile.LNKTYPE, "etc/passwd"),
    ],
    ids=["dotdot", "absolute", "other-top", "symlink-out", "symlink-absolute", "hardlink-out"],
)
def test_a_member_outside_the_top_directory_is_refused(tmp_path: Path, member: tarfile.TarInfo) -> None:
    archive, sha = make_sdist(tmp_path, extra=[member])
    dest = tmp_path / "deep" / "src"
    with pytest.raises(source.SourceError, match=r"outside|leaves"):
        source.unpack(archive, dest, sha256=sha, log=lambda _m: None)
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert list(dest.iterdir()) == []  # the scratch directory is gone, no tree


def test_an_archive_without_the_converter_is_refused(tmp_path: Path) -> None:
    archive, sha = make_sdist(tmp_path, converter=False)
    with pytest.raises(source.SourceError, match=r"convert_hf_to_gguf\.py in it"):
        source.unpack(archive, tmp_path / "src", sha256=sha, log=lambda _m: None)
    assert list((tmp_path / "src").iterdir()) == []


def _mirror(tmp_path: Path, listed_sha: str | None) -> tuple[Path, str]:
    mirror = tmp_path / "mirror"
    (mirror / "sdists").mkdir(parents=True)
    archive, sha = make_sdist(mirror / "sdists")
    if listed_sha is not None:
        files = [{"path": f"sdists/{NAME}", "sha256": listed_sha or sha, "size": archive.stat().st_size}]
        (mirror / "manifest.json").write_text(json.dumps({"format": 1, "files": files}), encoding="utf-8")
    return mirror, sha


def test_the_sdist_is_found_in_the_mirror_and_checked_against_its_manifest(tmp_path: Path) -> None:
    mirror, sha = _mirror(tmp_path, "")
    assert source.find_sdist(mirror, sha) == mirror / "sdists" / NAME


def test_a_manifest_that_pins_another_hash_is_refused(tmp_path: Path) -> None:
    mirror, sha = _mirror(tmp_path, "1" * 64)
    with pytest.raises(
        source.SourceError, match=f"lists sdists/{NAME} with SHA-256 {'1' * 64}, not the pinned"
    ):
        source.find_sdist(mirror, sha)


def test_a_mirror_without_the_sdist_names_what_writes_it(tmp_path: Path) -> None:
    with pytest.raises(source.SourceError, match="mirror/build writes it"):
        source.find_sdist(tmp_path, "0" * 64)


def test_the_program_runs_alone_beside_build_py_as_on_a_node(tmp_path: Path) -> None:
    # the build action copies build.py and source.py to the node, where dit_llamacpp is not installed:
    # -S leaves out site-packages (where this venv has it), so only the files beside it are found
    node = tmp_path / "node"
    node.mkdir()
    for module in (build, source):
        shutil.copy(str(module.__file__), node / Path(str(module.__file__)).name)
    archive, sha = make_sdist(tmp_path)
    argv = [
        sys.executable,
        "-S",
        str(node / "source.py"),
        "--archive",
        str(archive),
        "--dest",
        str(tmp_path / "src"),
    ]
    for _ in range(2):  # the second run finds the tree unpacked
        done = subprocess.run(
            [*argv, "--sha256", sha], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {
            "source": str(tmp_path / "src" / TOP),
            "sha256": sha,
        }
    assert "already unpacked" in done.stdout
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)  # the real pin
    assert bad.returncode == 1 and f"is not the pinned {build.SDIST_SHA256}" in bad.stderr
