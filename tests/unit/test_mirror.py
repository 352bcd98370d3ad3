"""The mirror's parts without the network: manifest and verify, the flat apt index, the sources list,
bare clones at a pinned commit (against a local repository), the pip download command line, the
build's bookkeeping of what an earlier build left."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from dit.mirror import build, debs, locks, manifest, sources, wheels


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


# ------------------------------------------------------------------------------------------------ manifest


def test_manifest_lists_every_file_and_verify_names_each_problem(tmp_path: Path) -> None:
    _tree(tmp_path, {"a/x.whl": b"one", "b/y.deb": b"two", "c.txt": b"three"})
    origins = {"a/x.whl": {"kind": "wheel"}, "b/y.deb": {"kind": "deb"}, "c.txt": {"kind": "lock"}}
    doc = manifest.write_manifest(tmp_path, origins, {"command": "test"})
    assert [f["path"] for f in doc["files"]] == ["a/x.whl", "b/y.deb", "c.txt"]
    assert doc["files"][0] == {
        "path": "a/x.whl",
        "sha256": hashlib.sha256(b"one").hexdigest(),
        "size": 3,
        "kind": "wheel",
    }
    assert json.loads((tmp_path / "manifest.json").read_text()) == doc
    assert manifest.verify_mirror(tmp_path) == ([], 3, 11)

    (tmp_path / "a/x.whl").write_bytes(b"ONE")  # same size
    (tmp_path / "b/y.deb").unlink()
    (tmp_path / "c.txt").write_bytes(b"three!")
    (tmp_path / "d.bin").write_bytes(b"")
    problems, checked, _ = manifest.verify_mirror(tmp_path)
    assert checked == 0
    assert [p.split(":")[0] for p in problems] == [
        "HASH a/x.whl",
        "MISSING b/y.deb",
        "SIZE c.txt",
        "EXTRA d.bin",
    ]
    assert manifest.main([str(tmp_path)]) == 1


def test_manifest_refuses_files_of_unknown_origin_and_bad_manifests(tmp_path: Path) -> None:
    _tree(tmp_path, {"stray.whl": b"?"})
    with pytest.raises(manifest.ManifestError, match=r"came from no build step.*stray\.whl"):
        manifest.write_manifest(tmp_path, {}, {})
    (tmp_path / "manifest.json").write_text("{}")
    problems, _, _ = manifest.verify_mirror(tmp_path)
    assert problems and problems[0].startswith("MANIFEST ") and "format-1" in problems[0]
    assert manifest.verify_mirror(tmp_path / "none")[0][0].startswith("MANIFEST ")


def test_manifest_checker_runs_standalone_with_plain_python3(tmp_path: Path) -> None:
    """roles/mirror_serve copies manifest.py to the edge server and runs it without dit installed."""
    _tree(tmp_path / "m", {"w/a.whl": b"a"})
    manifest.write_manifest(tmp_path / "m", {"w/a.whl": {"kind": "wheel"}}, {})
    script = tmp_path / "mirror_manifest.py"
    script.write_bytes(Path(manifest.__file__).read_bytes())
    env = {"PATH": os.environ["PATH"]}
    ok = subprocess.run(
        ["python3", "-I", str(script), str(tmp_path / "m")], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0 and "ok, 1 files" in ok.stdout, ok.stderr
    (tmp_path / "m/w/a.whl").write_bytes(b"b")
    bad = subprocess.run(
        ["python3", "-I", str(script), str(tmp_path / "m")], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 1 and bad.stdout.startswith("HASH w/a.whl: sha256 ")


# ------------------------------------------------------------------------------------------------ apt index


def _deb(directory: Path, name: str, version: str, arch: str = "arm64") -> Path:
    root = directory / f"src-{name}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share/doc" / name).mkdir(parents=True)
    (root / "usr/share/doc" / name / "README").write_text(name)
    (root / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: t <t@t>\n"
        f"Description: test package\n long line\n"
    )
    out = directory / f"{name}_{version}_{arch}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
        check=True,
        capture_output=True,
    )
    return out


def test_flat_apt_index_is_deterministic_and_hashes_every_package(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, version in (("zeta", "1.0"), ("alpha", "2:0.5-1")):
        _deb(tmp_path, name, version).rename(repo / f"{name}.deb")
    first = debs.write_index(repo, "arm64")
    snapshot = {p.name: p.read_bytes() for p in first}
    debs.write_index(repo, "arm64")
    assert {p.name: p.read_bytes() for p in first} == snapshot  # byte-identical (gzip without mtime)
    stanzas = (repo / "Packages").read_text().split("\n\n")
    assert [s.splitlines()[0] for s in stanzas] == ["Package: alpha", "Package: zeta"]
    alpha = debs.parse_control(stanzas[0])
    assert alpha["Version"] == "2:0.5-1" and alpha["Filename"] == "./alpha.deb"
    assert alpha["SHA256"] == hashlib.sha256((repo / "alpha.deb").read_bytes()).hexdigest()
    assert alpha["Description"] == "test package\n long line"
    assert gzip.decompress((repo / "Packages.gz").read_bytes()) == (repo / "Packages").read_bytes()
    release = (repo / "Release").read_text()
    assert "Origin: dit-mirror" in release and "Date:" not in release
    sha = hashlib.sha256((repo / "Packages").read_bytes()).hexdigest()
    assert f" {sha} {(repo / 'Packages').stat().st_size} Packages" in release


def test_apt_runs_with_a_private_configuration(tmp_path: Path) -> None:
    archive = debs.DebianArchive(("http://deb.debian.org/debian bookworm main",))
    opts = debs._apt_options(tmp_path / "work", "arm64", archive, tmp_path / "out")
    flat = dict(o.split("=", 1) for o in opts if o != "-o")
    assert flat["APT::Architecture"] == "arm64" and flat["APT::Architectures::"] == "arm64"
    assert flat["Dir::State::Status"] == str(tmp_path / "work/status")  # empty: the full dependency closure
    assert flat["Dir::Cache::Archives"] == str(tmp_path / "out")
    assert (tmp_path / "work/status").read_text() == ""
    assert (tmp_path / "work/etc/sources.list").read_text() == (
        "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        "http://deb.debian.org/debian bookworm main\n"
    )


# ------------------------------------------------------------------------------------------------ sources


def test_sources_yaml_of_the_repository_is_valid() -> None:
    repo = Path(__file__).resolve().parents[2]
    srcs = sources.load_sources(repo / "mirror/sources.yaml")
    assert set(srcs.packages) == {"arm64", "amd64"}
    for needed in ("chrony", "iperf3", "iproute2", "python3-venv"):
        assert needed in srcs.packages["arm64"] and needed in srcs.packages["amd64"]
    assert "i2c-tools" in srcs.packages["arm64"]
    assert all(len(g.commit) == 40 for g in srcs.git)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "url": "u", "commit": "main"}, "not a full 40-hex commit id"),
        ({"name": "x", "url": "u"}, "not a full 40-hex commit id"),
        ({"name": "../x", "url": "u", "commit": "a" * 40}, "not a plain name"),
        ({"name": "x", "commit": "a" * 40}, "is not a URL"),
    ],
)
def test_sources_refuse_unpinned_or_malformed_git_entries(
    tmp_path: Path, entry: dict[str, str], message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"git": [entry]}))
    with pytest.raises(sources.SourcesError, match=message):
        sources.load_sources(path)


def _git(*args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], capture_output=True, text=True, env=env, check=True).stdout.strip()


def test_bare_clone_fetches_verifies_and_points_at_the_pinned_commit(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _git("init", "-q", "-b", "main", str(work))
    (work / "f").write_text("1")
    _git("-C", str(work), "add", "f")
    _git("-C", str(work), "commit", "-q", "-m", "one")
    pinned = _git("-C", str(work), "rev-parse", "HEAD")
    (work / "f").write_text("2")
    _git("-C", str(work), "commit", "-q", "-am", "two")
    origin = tmp_path / "origin.git"
    _git("clone", "-q", "--bare", str(work), str(origin))
    src = sources.GitSource("rt", f"file://{origin}", pinned)
    repo = sources.clone_source(src, tmp_path / "mirror", lambda _: None)
    assert repo == tmp_path / "mirror/rt.git"
    assert _git("-C", str(repo), "rev-parse", "HEAD") == pinned  # HEAD -> dit-pinned -> the commit
    assert (repo / "info/refs").is_file() and not (repo / "hooks").exists()  # dumb HTTP, no hook samples
    assert list((repo / "objects/pack").glob("*.pack"))
    again = sources.clone_source(src, tmp_path / "mirror", lambda _: None)  # an existing clone is reused
    assert again == repo
    missing = sources.GitSource("rt2", f"file://{origin}", "0" * 40)
    with pytest.raises(sources.SourcesError, match=f"commit {'0' * 40} is not in"):
        sources.clone_source(missing, tmp_path / "mirror", lambda _: None)


# ------------------------------------------------------------------------------------------------ wheels


def test_pip_download_command_is_isolated_platform_pinned_and_hash_checked(tmp_path: Path) -> None:
    argv = wheels.download_argv(
        tmp_path / "l.txt", locks.PLATFORMS["aarch64"], tmp_path / "d", "https://i", ["/fl"]
    )
    assert argv[1:5] == ["-m", "pip", "--isolated", "download"]
    for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:"):
        assert flag in argv
    assert argv[argv.index("--python-version") + 1] == "3.11" and argv[argv.index("--abi") + 1] == "cp311"
    platforms = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert platforms == locks.PLATFORMS["aarch64"].pip_platforms()
    assert argv[argv.index("--find-links") + 1] == "/fl" and argv[-2:] == ["-r", str(tmp_path / "l.txt")]
    env = wheels.pip_env()
    assert env["PIP_CONFIG_FILE"] == os.devnull and not [
        k
        for k in env
        if k.startswith("PIP_") and k not in ("PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK")
    ]


def test_wheels_are_matched_to_pins_by_hash(tmp_path: Path) -> None:
    good = tmp_path / "Foo_Bar-1.0-py3-none-any.whl"
    good.write_bytes(b"wheel")
    (tmp_path / "other-2.0-py3-none-any.whl").write_bytes(b"unrelated")
    digest = hashlib.sha256(b"wheel").hexdigest()
    lock_path = tmp_path / "l.txt"
    lock_path.write_text(f"foo-bar==1.0 --hash=sha256:{digest}\n")
    found = wheels.match_lock(locks.read_lock(lock_path), tmp_path)
    assert found["foo-bar"].path == good and found["foo-bar"].sha256 == digest
    lock_path.write_text(f"foo-bar==1.0 --hash=sha256:{'0' * 64}\nbaz==1 --hash=sha256:{'1' * 64}\n")
    with pytest.raises(wheels.WheelError, match="no wheel with a locked hash for baz, foo-bar"):
        wheels.match_lock(locks.read_lock(lock_path), tmp_path)
    assert wheels.parse_wheel_name("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == (
        "torch",
        "2.13.0+cpu",
    )


# ------------------------------------------------------------------------------------------------ build


def test_build_keeps_what_an_earlier_build_left_and_resolves_locks(tmp_path: Path) -> None:
    out = tmp_path / "m"
    _tree(out, {"weights/a.safetensors": b"w"})
    manifest.write_manifest(out, {"weights/a.safetensors": {"kind": "weights", "model": "a"}}, {})
    lock = tmp_path / "small.txt"
    lock.write_text(f"# dit-lock: name=small arch=aarch64\nsix==1 --hash=sha256:{'a' * 64}\n")
    options = build.BuildOptions(out=out, repo=tmp_path, lock_names=(str(lock),), archs=("x86_64",))
    assert build.resolve_locks(options) == []  # an aarch64 lock is not built for --arch x86_64
    both = build.BuildOptions(out=out, repo=tmp_path, lock_names=(str(lock),))
    [(parsed, arch)] = build.resolve_locks(both)
    assert parsed.name == "small" and arch == "aarch64"
    doc = build.build_mirror(
        build.BuildOptions(
            out=out, repo=tmp_path, skip_wheels=True, skip_debs=True, skip_sources=True, skip_weights=True
        ),
        log=lambda _: None,
    )
    assert [(f["path"], f["model"]) for f in doc["files"]] == [("weights/a.safetensors", "a")]
    lock.write_text("six>=1\n")
    with pytest.raises(build.BuildError, match="not a pinned requirement"):
        build.resolve_locks(both)
    lock.write_text("six==1\n")
    with pytest.raises(build.BuildError, match="without a hash"):
        build.resolve_locks(both)
