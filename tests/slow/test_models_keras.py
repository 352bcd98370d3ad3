"""Real Keras models: build, profile with the stdlib profiler, partition equivalence at every point."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dit.device.adapter import StageModel
from dit.device.common import build_model
from dit.device.profiler import LAYERS_COLUMNS, profile_model, write_layers_csv
from dit.models.catalogue import entry, stage_count
from dit.models.equivalence import check_partition_equivalence

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.slow

SMALL = {"input_shape": [48, 48, 3], "num_classes": 10, "num_stages": 6}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("alexnet", {}),
    ("vgg16", {}),
    ("resnet50", {}),
    ("gru_vqp", {}),
    ("mobilenetv2", SMALL),
    ("densenet121", SMALL),
    ("efficientnetb0", {**SMALL, "balance": "latency"}),
]


def build(name: str, params: dict[str, Any]) -> Any:
    return build_model({"name": name, "builder": entry(name).builder, "params": params, "seed": 11})


@pytest.mark.parametrize(("name", "params"), CASES, ids=[c[0] for c in CASES])
def test_build_profile_and_equivalence(name: str, params: dict[str, Any], tmp_path: Path) -> None:
    m = build(name, params)
    assert isinstance(m, StageModel)
    assert m.num_stages == stage_count(name, params)
    if not params:  # catalogue defaults: the weights were checked against the catalogue's SHA-256
        assert m.weights.source == "catalogue"
        assert m.weights.sha256 == entry(name).sha256
    # shapes, sizes, operation counts
    x = m.make_input()
    assert len(m.encode(x)) == m.output_bytes(0)
    y = x
    for s in range(1, m.num_stages + 1):
        y = m.run_stage(s, y)
        assert len(m.encode(y)) == m.output_bytes(s), s
        assert m.ops(s) >= 0
    assert sum(m.ops(s) for s in range(1, m.num_stages + 1)) > 0
    # the stdlib profiler runs it and writes the standard CSV
    result = profile_model(m, repetitions=1, warmup=1)
    assert result.warmup == 1
    assert len(result.records) == m.num_stages + 1
    write_layers_csv(tmp_path / "layers.csv", result)
    with open(tmp_path / "layers.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == LAYERS_COLUMNS and len(rows) == m.num_stages + 1
    # partition equivalence at every point
    results = check_partition_equivalence(m, x, tolerance=1e-5)
    assert [r.point for r in results] == list(range(m.num_stages + 1))


def test_alexnet_matches_the_fake_profile_cut_sizes() -> None:
    from dit.device.fakemodel import PROFILE_INPUT_BYTES, PROFILES

    m = build("alexnet", {})
    assert m.output_bytes(0) == PROFILE_INPUT_BYTES["alexnet"]
    assert [m.output_bytes(s) for s in range(1, 12)] == [p["output_bytes"] for p in PROFILES["alexnet"]]
    assert m.stage_names[1:] == [
        "conv1",
        "pool1",
        "conv2",
        "pool2",
        "conv3",
        "conv4",
        "conv5",
        "pool3",
        "fc1",
        "fc2",
        "fc3",
    ]


def test_alexnet_imagenet_input() -> None:
    m = build("alexnet", {"input_shape": [224, 224, 3], "num_classes": 1000, "fc_units": 256})
    assert m.num_stages == 11 and m.specs[1].shape == (1, 56, 56, 96)
    assert m.weights.source == "sidecar"


def test_resnet_stage_is_a_residual_block() -> None:
    m = build("resnet50", {})
    names = m.stage_names[1:]
    assert names[:3] == ["conv1_relu", "pool1_pool", "conv2_block1_out"] and names[-2:] == [
        "avg_pool",
        "predictions",
    ]
    assert sum(1 for n in names if n.endswith("_out")) == 16
    graph = m.graph
    inside = [op.index for op in graph.ops if op.layer.name == "conv2_block1_1_relu"]
    assert inside and inside[0] not in graph.cut_after  # no cut inside a skip connection


@pytest.mark.parametrize("name", ["mobilenetv2", "densenet121", "efficientnetb0"])
def test_catalogue_weights_reproduce(name: str) -> None:
    """The checksum recorded in the catalogue is reproduced from the seed (default 224x224 input)."""
    m = build(name, {"num_stages": 2})
    assert m.weights.source == "catalogue" and m.weights.sha256 == entry(name).sha256


def test_generic_thinning_is_balanced() -> None:
    m = build("mobilenetv2", {**SMALL, "num_stages": 4})
    ops = np.array([m.ops(s) for s in range(1, 5)], dtype=float)
    assert ops.max() < 0.5 * ops.sum()


def test_corrupt_weights_refuse_to_load(weights_dir: Path) -> None:
    from dit.models.weights import ChecksumMismatch

    m = build("gru_vqp", {"units": 8})
    path = m.weights.path
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    try:
        with pytest.raises(ChecksumMismatch, match=path.name):
            build("gru_vqp", {"units": 8})
    finally:
        path.unlink()
        path.with_name(path.name + ".sha256").unlink()
