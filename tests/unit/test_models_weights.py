"""Deterministic weights, the safetensors writer and the checksum gate (numpy only)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from dit.models import weights as W


def specs() -> list[W.TensorSpec]:
    return [
        W.TensorSpec("dense/kernel", (4, 3), limit=0.5),
        W.TensorSpec("dense/bias", (3,), constant=0.0),
        W.TensorSpec("norm", (3,), dtype="float16", limit=0.1),
        W.TensorSpec("count", (), dtype="int64", constant=7),
    ]


def test_uniform_is_pinned() -> None:
    # pins the generator across platforms and numpy versions: a change here changes every checksum
    u = W.uniform(0, "probe", (1000,), 1.0)
    assert u.dtype == np.float32
    assert float(u.min()) >= -1.0 and float(u.max()) < 1.0
    assert hashlib.sha256(u.tobytes()).hexdigest() == PINNED


PINNED = "54ed0723b0045e3b93495aa6d0fd5bbd0ae097e1d3dab9086cc1aab8b599ebfa"


def test_uniform_depends_on_name_and_seed() -> None:
    a = W.uniform(0, "a", (16,), 1.0)
    assert np.array_equal(a, W.uniform(0, "a", (16,), 1.0))
    assert not np.array_equal(a, W.uniform(0, "b", (16,), 1.0))
    assert not np.array_equal(a, W.uniform(1, "a", (16,), 1.0))


def test_safetensors_roundtrip_and_bytes_are_deterministic(tmp_path: Path) -> None:
    t = W.generate(specs(), 3)
    W.save_safetensors(tmp_path / "a.safetensors", t, {"m": "x"})
    W.save_safetensors(tmp_path / "b.safetensors", dict(reversed(list(t.items()))), {"m": "x"})
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    back = W.load_safetensors(tmp_path / "a.safetensors")
    for k, v in t.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k


def test_safetensors_readable_by_the_reference_reader(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    t = W.generate(specs(), 3)
    W.save_safetensors(tmp_path / "a.safetensors", t, {"m": "x"})
    ref = st.load_file(str(tmp_path / "a.safetensors"))
    for k, v in t.items():
        assert np.array_equal(ref[k], v), k


def ensure(tmp_path: Path, expected: str | None = None, params: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    return W.ensure_weights(
        name="toy",
        params=params or {"w": 1},
        seed=0,
        specs=specs,
        expected_sha256=expected,
        directory=tmp_path,
    )


def test_generate_once_then_verify(tmp_path: Path) -> None:
    t1, r1 = ensure(tmp_path)
    assert r1.generated and r1.source == "sidecar"
    t2, r2 = ensure(tmp_path)
    assert not r2.generated and r2.sha256 == r1.sha256
    assert r1.sha256 == hashlib.sha256(r1.path.read_bytes()).hexdigest()
    assert np.array_equal(t1["dense/kernel"], t2["dense/kernel"])


def test_same_inputs_same_checksum_in_another_directory(tmp_path: Path) -> None:
    _, r1 = ensure(tmp_path / "a")
    _, r2 = ensure(tmp_path / "b")
    assert r1.sha256 == r2.sha256 and r1.path.name == r2.path.name


def test_corrupted_file_refuses_to_load(tmp_path: Path) -> None:
    _, r = ensure(tmp_path)
    data = bytearray(r.path.read_bytes())
    data[-1] ^= 0xFF
    r.path.write_bytes(bytes(data))
    with pytest.raises(W.ChecksumMismatch) as exc:
        ensure(tmp_path)
    msg = str(exc.value)
    assert str(r.path) in msg and r.sha256 in msg and exc.value.actual in msg


def test_catalogue_checksum_mismatch_refuses(tmp_path: Path) -> None:
    _, r = ensure(tmp_path)
    with pytest.raises(W.ChecksumMismatch, match="model catalogue"):
        ensure(tmp_path, expected="0" * 64)
    _, ok = ensure(tmp_path, expected=r.sha256)
    assert ok.source == "catalogue"


def test_fresh_generation_checked_against_catalogue(tmp_path: Path) -> None:
    with pytest.raises(W.ChecksumMismatch, match="generated just now"):
        ensure(tmp_path, expected="f" * 64)


def test_missing_sidecar_refuses(tmp_path: Path) -> None:
    _, r = ensure(tmp_path)
    r.path.with_name(r.path.name + ".sha256").unlink()
    with pytest.raises(W.WeightsError, match="no checksum recorded"):
        ensure(tmp_path)


def test_weights_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIT_WEIGHTS_DIR", str(tmp_path / "env"))
    assert W.weights_dir() == tmp_path / "env"
    assert W.weights_dir(str(tmp_path / "p")) == tmp_path / "p"
    monkeypatch.delenv("DIT_WEIGHTS_DIR")
    assert W.weights_dir() == Path.home() / ".cache" / "dit" / "weights"


def test_params_key_is_order_independent() -> None:
    assert W.params_key("m", {"a": 1, "b": [1, 2]}, 0) == W.params_key("m", {"b": [1, 2], "a": 1}, 0)
    assert W.params_key("m", {"a": 1}, 0) != W.params_key("m", {"a": 1}, 1)
