"""Source archives pinned by version and SHA-256 (mirror/sources.yaml ``sdists``): the repository's
entries parse, malformed entries name their field, and mirror/build's sdists part fetches from the
simple index (a fake download function, no network) or a local directory and refuses a wrong hash."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from dit.mirror import build, sdists

REPO = Path(__file__).resolve().parents[2]


def test_the_repository_pins_the_llama_cpp_python_sdist() -> None:
    pinned = {s.name: s for s in sdists.load_sdists(REPO / "mirror" / "sources.yaml")}
    sdist = pinned["llama-cpp-python"]
    assert sdist.version == "0.3.36"
    assert sdist.filename == "llama_cpp_python-0.3.36.tar.gz"
    assert sdist.project == "llama-cpp-python"
    assert sdist.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "version": "1.0", "sha256": "abc"}, "sdists[0].sha256: 'abc' is not a SHA-256"),
        ({"name": "x", "version": 1.0, "sha256": "0" * 64}, "sdists[0].version: 1.0 is not an exact version"),
        ({"name": "", "version": "1", "sha256": "0" * 64}, "sdists[0].name: '' is not a project name"),
        ({"name": "x", "version": "1", "sha256": "0" * 64, "url": "u"}, "sdists[0]: unknown field(s) url"),
    ],
)
def test_malformed_entries_name_the_field(tmp_path: Path, entry: dict[str, object], message: str) -> None:
    file = tmp_path / "sources.yaml"
    file.write_text(json.dumps({"sdists": [entry]}))
    with pytest.raises(sdists.SdistError, match=re.escape(message)):
        sdists.load_sdists(file)


def _pinned(data: bytes) -> sdists.Sdist:
    return sdists.Sdist("Some.Project", "1.2", hashlib.sha256(data).hexdigest())


def test_fetch_from_the_index_follows_the_simple_page_and_verifies(tmp_path: Path) -> None:
    data = b"the archive"
    sdist = _pinned(data)
    fetched: list[str] = []

    def fake(url: str, dest: Path) -> None:
        fetched.append(url)
        if url == "https://idx.example/simple/some-project/":
            dest.write_text(
                '<a href="../../files/some_project-1.2.tar.gz#sha256=ff">x</a><a href="o.whl">o</a>'
            )
        elif url == "https://idx.example/files/some_project-1.2.tar.gz":
            dest.write_bytes(data)
        else:
            raise OSError(f"unexpected {url}")

    out = sdists.fetch_sdist(sdist, tmp_path / "m", "https://idx.example/simple", (), print, fake)
    assert out == tmp_path / "m" / "some_project-1.2.tar.gz"
    assert out.read_bytes() == data
    assert fetched[-1] == "https://idx.example/files/some_project-1.2.tar.gz"
    # a second fetch keeps the verified file and downloads nothing
    fetched.clear()
    assert sdists.fetch_sdist(sdist, tmp_path / "m", "https://idx.example/simple", (), print, fake) == out
    assert fetched == []


def test_a_wrong_hash_is_refused_from_the_index_and_from_a_local_directory(tmp_path: Path) -> None:
    sdist = _pinned(b"expected")

    def fake(url: str, dest: Path) -> None:
        dest.write_text('<a href="some_project-1.2.tar.gz">x</a>' if url.endswith("/") else "tampered")

    with pytest.raises(sdists.SdistError, match="SHA-256 .* pinned " + sdist.sha256):
        sdists.fetch_sdist(sdist, tmp_path / "m", "https://idx.example/simple", (), print, fake)
    assert not (tmp_path / "m" / sdist.filename).exists()
    local = tmp_path / "local"
    local.mkdir()
    (local / sdist.filename).write_bytes(b"tampered")
    with pytest.raises(sdists.SdistError, match=re.escape("local/some_project-1.2.tar.gz: SHA-256")):
        sdists.fetch_sdist(sdist, tmp_path / "m", "https://idx.example/simple", (local,), print, fake)


def test_mirror_build_copies_a_pinned_sdist_from_a_local_directory_into_the_manifest(tmp_path: Path) -> None:
    data = b"archive bytes"
    local = tmp_path / "local"
    local.mkdir()
    (local / "some_project-1.2.tar.gz").write_bytes(data)
    sources_file = tmp_path / "sources.yaml"
    sha = hashlib.sha256(data).hexdigest()
    sources_file.write_text(f"sdists:\n  - {{name: some-project, version: '1.2', sha256: {sha}}}\n")
    options = build.BuildOptions(
        out=tmp_path / "mirror",
        repo=REPO,
        skip_wheels=True,
        skip_debs=True,
        skip_sources=True,
        skip_weights=True,
        skip_runtimes=True,
        sources_file=sources_file,
        sdists_from=(local,),
        index_url="http://127.0.0.1:9/unreachable",
    )
    doc = build.build_mirror(options, log=lambda _m: None)
    [entry] = [f for f in doc["files"] if f["path"] == "sdists/some_project-1.2.tar.gz"]
    assert entry["sha256"] == sha
    assert entry["kind"] == "sdist"
