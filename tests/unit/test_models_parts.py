"""Framework-free parts of the adapters: cut thinning, the family table, arrays on the wire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dit.models.common import ArraySpec, ArrayStageModel, make_array_input
from dit.models.hf_decoder import FAMILIES
from dit.models.keras_staged import thin_cuts


def test_thin_cuts_balances_work() -> None:
    work = [1.0] * 12
    assert thin_cuts(work, list(range(11)), 3) == [3, 7]
    assert thin_cuts(work, list(range(11)), 1) == []


def test_thin_cuts_respects_candidates() -> None:
    work = [5, 1, 1, 1, 1, 1, 5, 1, 1, 1]
    cuts = thin_cuts([float(w) for w in work], [0, 5, 6], 2)
    assert cuts == [5]


def test_thin_cuts_too_many_stages() -> None:
    with pytest.raises(ValueError, match="only 3 possible stages"):
        thin_cuts([1.0] * 5, [1, 2], 4)


def test_family_table_shape() -> None:
    assert set(FAMILIES) == {"gpt2", "llama", "mistral", "qwen2", "gemma"}
    gpt2 = FAMILIES["gpt2"]
    assert gpt2.qkv == "c_attn" and gpt2.conv1d and not gpt2.rotary and gpt2.positions == "wpe"
    for name, fam in FAMILIES.items():
        if name != "gpt2":
            assert (fam.q, fam.k, fam.v, fam.o) == ("q_proj", "k_proj", "v_proj", "o_proj")
            assert fam.rotary and fam.qkv is None and fam.mlp_modules == ("gate_proj", "up_proj", "down_proj")
        heads = fam.tiny.get("num_attention_heads", fam.tiny.get("n_head"))
        kv = fam.tiny.get("num_key_value_heads", heads)
        assert heads % kv == 0, name
    assert FAMILIES["gemma"].norm_init == 0.0
    assert any(f.tiny.get("num_key_value_heads", 0) == 1 for f in FAMILIES.values())  # multi-query covered


class Toy(ArrayStageModel):
    def __init__(self) -> None:
        self.name = "toy"
        self.specs = [ArraySpec((1, 2, 3)), ArraySpec((1, 4), "int64")]
        self.stage_ops = [0, 6]
        self.stage_names = ["in", "out"]

    def make_input(self) -> Any:
        return np.zeros((1, 2, 3), np.float32)

    def run_stage(self, stage: int, x: Any) -> Any:
        return np.arange(4, dtype=np.int64).reshape(1, 4)


def test_array_encoding_roundtrip() -> None:
    m = Toy()
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    data = m.encode(x)
    assert len(data) == m.output_bytes(0) == 24
    assert np.array_equal(m.decode(data, 0), x)
    y = m.run_stage(1, x)
    assert np.array_equal(m.decode(m.encode(y), 1), y)
    with pytest.raises(ValueError, match="24 bytes"):
        m.decode(data[:-4], 0)
    with pytest.raises(ValueError, match="outside"):
        m.output_bytes(2)
    assert m.max_abs_diff(x, x + 0.5) == 0.5
    assert m.max_abs_diff(x, y) == float("inf")
    assert m.num_stages == 1 and m.ops(1) == 6


def test_synthetic_input_is_seeded() -> None:
    a = make_array_input({"seed": 4}, (2, 2))
    assert a.shape == (1, 2, 2) and a.dtype == np.float32
    assert np.array_equal(a, make_array_input({"seed": 4}, (2, 2)))
    assert not np.array_equal(a, make_array_input({"seed": 5}, (2, 2)))
    b = make_array_input({"seed": 5, "input": {"kind": "synthetic", "seed": 4}}, (2, 2))
    assert np.array_equal(a, b)


def test_npy_input(tmp_path: Path) -> None:
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    np.save(tmp_path / "x.npy", arr)
    got = make_array_input({"input": {"source": "npy", "path": str(tmp_path / "x.npy")}}, (4, 3))
    assert got.shape == (1, 4, 3) and got.dtype == np.float32
    with pytest.raises(ValueError, match="expects"):
        make_array_input({"input": {"source": "npy", "path": str(tmp_path / "x.npy")}}, (5, 3))


def test_image_directory_input(tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image")
    image.new("RGB", (10, 8), (255, 0, 0)).save(tmp_path / "a.png")
    got = make_array_input({"input": {"source": "images", "path": str(tmp_path)}}, (4, 4, 3))
    assert got.shape == (1, 4, 4, 3)
    assert np.allclose(got[0, :, :, 0], 1.0) and np.allclose(got[0, :, :, 1], 0.0)


def test_unknown_source() -> None:
    with pytest.raises(ValueError, match=r"input\.kind"):
        make_array_input({"input": {"source": "camera"}}, (2,))
