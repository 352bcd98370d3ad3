"""The mirror builds a runtime's wheel with the build requirements the runtime declares, from the
mirror's own wheels, in pip's isolated build environment: ``dit mirror build`` works from a plain
install whose environment has no usable build backend (issue 29 item 5). Without those wheels the error
names the requirements and where they come from.

The runtime here declares a build backend that exists only as a wheel in the test's "mirror"
(``dit-fake-backend``), so the builder's own environment can never serve it."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from dit.mirror import runtimes

BACKEND = """
import base64, hashlib, os, zipfile

def _hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name, version = "dit_fake_runtime", "0.1.0"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{info}/METADATA": f"Metadata-Version: 2.1\\nName: dit-fake-runtime\\nVersion: {version}\\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: fake\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = "".join(f"{p},{_hash(d)},{len(d)}\\n" for p, d in files.items()) + f"{info}/RECORD,,\\n"
    wheel = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/RECORD", record)
    return wheel
"""


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def backend_wheel(directory: Path) -> Path:
    """``dit_fake_backend-1.0-py3-none-any.whl``: a PEP 517 backend of one module."""
    info = "dit_fake_backend-1.0.dist-info"
    files = {
        "dit_fake_backend.py": BACKEND.encode(),
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: dit-fake-backend\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},{_hash(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "dit_fake_backend-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", record)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    project = tmp_path / "runtime"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["dit-fake-backend==1.0"]\nbuild-backend = "dit_fake_backend"\n\n'
        '[project]\nname = "dit-fake-runtime"\nversion = "0.1.0"\n',
        encoding="utf-8",
    )
    return project


def test_the_declared_build_backend_comes_from_the_mirrors_wheels(tree: Path, tmp_path: Path) -> None:
    mirror_wheels = tmp_path / "mirror" / "wheels" / "x86_64"
    backend_wheel(mirror_wheels)
    logged: list[str] = []
    wheel = runtimes.build_wheel(tree, tmp_path / "out", 0, logged.append, backend_wheels=mirror_wheels)
    assert wheel.name == "dit_fake_runtime-0.1.0-py3-none-any.whl"
    assert f"build requirements from {mirror_wheels}" in logged[0]


def test_without_them_the_error_names_the_requirements_and_where_they_come_from(
    tree: Path, tmp_path: Path
) -> None:
    # a mirror whose wheels lack the backend: the builder's environment is tried, which lacks it too
    unrelated = tmp_path / "wheels"
    unrelated.mkdir()
    (unrelated / "other-1.0-py3-none-any.whl").write_bytes(b"")
    for wheels in (None, unrelated):
        with pytest.raises(runtimes.RuntimeSourceError) as caught:
            runtimes.build_wheel(tree, tmp_path / "out", 0, lambda _m: None, backend_wheels=wheels)
        message = str(caught.value)
        assert "The build requirements of runtime (dit-fake-backend==1.0) are missing" in message
        assert "mirror/build without --skip-wheels" in message
        assert "pip install 'dit-fake-backend==1.0'" in message and "'.[dev]'" in message


def test_the_declared_build_requirements_are_read_from_pyproject(tree: Path, tmp_path: Path) -> None:
    assert runtimes.build_requires(tree) == ["dit-fake-backend==1.0"]
    assert runtimes.build_requires(tmp_path) == ["setuptools>=40.8.0"]  # PEP 518's default


def test_the_shipped_runtimes_declare_a_backend_the_mirrors_locks_pin() -> None:
    # setuptools with bdist_wheel built in (>= 70.1): the edge and device locks pin such a setuptools
    repo = Path(__file__).resolve().parents[2]
    for project in sorted((repo / "runtimes").glob("*/pyproject.toml")):
        assert runtimes.build_requires(project.parent) == ["setuptools>=70.1"], project
    for lock in ("edge.txt", "device.txt"):
        pins = (repo / "requirements" / lock).read_text(encoding="utf-8")
        assert "\nsetuptools==84." in pins, lock
