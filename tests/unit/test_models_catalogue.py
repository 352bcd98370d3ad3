"""The model catalogue: entries, stage counts and checksum lookup, without any framework."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dit.models import catalogue
from dit.models.catalogue import BUILTIN, entry, expected_sha256, stage_count
from dit.models.weights import params_key

REAL = [n for n, e in BUILTIN.items() if e.framework != "none"]


def test_every_thesis_model_is_listed() -> None:
    for name in ("alexnet", "vgg16", "resnet50", "gru_vqp", "keras_app", "gpt2", "tinyllama", "hf_decoder"):
        assert name in BUILTIN, name


@pytest.mark.parametrize("name", REAL)
def test_builder_module_imports_without_framework(name: str) -> None:
    e = BUILTIN[name]
    module, _, attr = e.builder.partition(":")
    mod = importlib.import_module(module)
    assert callable(getattr(mod, attr))
    assert e.framework in ("tensorflow", "torch")


def test_importing_every_adapter_imports_no_framework() -> None:
    modules = sorted({BUILTIN[n].builder.partition(":")[0] for n in REAL} | {"dit.models.decoder_profile"})
    code = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        "print(sorted(f for f in ('tensorflow', 'keras', 'torch', 'transformers') if f in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_stage_counts() -> None:
    assert stage_count("alexnet", {}) == 11
    assert stage_count("vgg16", {}) == 21
    assert stage_count("resnet50", {}) == 20
    assert stage_count("gru_vqp", {}) == 5
    assert stage_count("gpt2", {}) == 14
    assert stage_count("tinyllama", {}) == 24
    assert stage_count("tinyllama", {"num_layers": 3}) == 5
    assert stage_count("hf_decoder", {"family": "qwen2", "num_layers": 6}) == 8
    assert stage_count("keras_app", {"application": "MobileNetV2", "num_stages": 5}) == 5
    assert stage_count("mobilenetv2", {}) == 8
    assert stage_count("nope", {}) is None


def test_tinyllama_is_the_real_architecture() -> None:
    cfg = BUILTIN["tinyllama"].params["config"]
    assert BUILTIN["tinyllama"].params["num_layers"] == 22
    assert cfg["hidden_size"] == 2048
    assert cfg["num_attention_heads"] == 32
    assert cfg["num_key_value_heads"] == 4
    assert cfg["intermediate_size"] == 5632


@pytest.mark.parametrize("name", [n for n in REAL if BUILTIN[n].sha256])
def test_checksum_entries_are_well_formed(name: str) -> None:
    e = BUILTIN[name]
    assert e.sha256 is not None and re.fullmatch(r"[0-9a-f]{64}", e.sha256)
    assert e.weights_bytes and e.weights_bytes > 0
    key = params_key(name, e.weight_identity({}), e.weights_seed)
    assert e.weights_file == f"{name}-{key}.safetensors"


def test_fixed_models_have_checksums() -> None:
    for name in (
        "alexnet",
        "vgg16",
        "resnet50",
        "gru_vqp",
        "mobilenetv2",
        "densenet121",
        "efficientnetb0",
        "gpt2",
    ):
        assert BUILTIN[name].sha256, name


def test_expected_sha256_only_for_catalogue_defaults() -> None:
    e = entry("alexnet")
    ident = e.weight_identity({})
    assert expected_sha256("alexnet", ident, e.weights_seed) == e.sha256
    assert expected_sha256("alexnet", ident, e.weights_seed + 1) is None
    assert expected_sha256("alexnet", e.weight_identity({"input_shape": [64, 64, 3]}), 0) is None
    assert expected_sha256("keras_app", {}, 0) is None
    # runtime-only parameters do not change the identity of the weights
    assert e.weight_identity({"weights_dir": "/x"}) == ident


def test_entry_names_unknown_model() -> None:
    with pytest.raises(KeyError, match="not in the catalogue"):
        entry("alexnet2")


def test_catalogue_file_is_valid_json_with_builders() -> None:
    raw = json.loads(Path(catalogue.__file__).with_name(catalogue.CATALOGUE_FILE).read_text())
    assert raw["format"] == 1
    for name, m in raw["models"].items():
        assert ":" in m["builder"], name
        assert isinstance(m["stages"], int) and m["stages"] > 0, name
