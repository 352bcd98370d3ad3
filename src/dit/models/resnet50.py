"""ResNet-50 at the granularity of Keras blocks (TensorFlow backend): 20 stages.

``keras.applications.ResNet50(weights=None)``; stages end at ``conv1_relu`` (stem convolution),
``pool1_pool``, each of the 16 residual blocks' ``convK_blockB_out`` (a residual block is one
stage: no cut inside a skip connection, which the single-tensor check enforces), ``avg_pool`` and
``predictions``.

Params: ``input_shape`` ([32, 32, 3]), ``num_classes`` (10), ``weights_seed``, ``weights_dir``.
Builder: ``dit.models.resnet50:build``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dit.models.common import int_tuple, positive_int
from dit.models.keras_staged import build_named_cuts

BLOCKS = {2: 3, 3: 4, 4: 6, 5: 3}
STAGES = (
    "conv1_relu",
    "pool1_pool",
    *(f"conv{s}_block{b}_out" for s, n in BLOCKS.items() for b in range(1, n + 1)),
    "avg_pool",
    "predictions",
)


def make_model(keras: Any, params: dict[str, Any]) -> tuple[Any, list[str]]:
    shape = int_tuple(params.get("input_shape", [32, 32, 3]), "model.params.input_shape")
    classes = positive_int(params, "num_classes", 10)
    model = keras.applications.ResNet50(weights=None, input_shape=shape, classes=classes)
    return model, list(STAGES)


def build(spec: Mapping[str, Any]) -> Any:
    return build_named_cuts(spec, "resnet50", make_model)
