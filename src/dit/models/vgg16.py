"""VGG-16 at the granularity of Keras layers (TensorFlow backend): 21 stages.

The convolutional base is ``keras.applications.VGG16(include_top=False, weights=None)`` (13
convolutions, 5 max-pools, Keras' layer names ``block1_conv1`` ... ``block5_pool``); the head is
``flatten`` + ``fc1`` + ``fc2`` + ``predictions`` as in the Keras application, with the width of
the two fully connected layers a parameter (``fc_units``: 4096 as in the paper for inputs of 64
pixels or more, 512 by default for the CIFAR-sized default input). One stage per layer; the
flatten (no arithmetic, same bytes as ``block5_pool``) goes with ``fc1``.

Params: ``input_shape`` ([32, 32, 3]), ``num_classes`` (10), ``fc_units``, ``weights_seed``,
``weights_dir``. Builder: ``dit.models.vgg16:build``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dit.models.common import int_tuple, positive_int
from dit.models.keras_staged import build_named_cuts


def make_model(keras: Any, params: dict[str, Any]) -> tuple[Any, list[str]]:
    shape = int_tuple(params.get("input_shape", [32, 32, 3]), "model.params.input_shape")
    classes = positive_int(params, "num_classes", 10)
    fc = positive_int(params, "fc_units", 4096 if min(shape[:2]) >= 64 else 512)
    base = keras.applications.VGG16(include_top=False, weights=None, input_shape=shape)
    L = keras.layers
    x = L.Flatten(name="flatten")(base.output)
    x = L.Dense(fc, activation="relu", name="fc1")(x)
    x = L.Dense(fc, activation="relu", name="fc2")(x)
    out = L.Dense(classes, activation="softmax", name="predictions")(x)
    model = keras.Model(base.input, out, name="vgg16")
    cuts = [layer.name for layer in base.layers[1:]] + ["fc1", "fc2", "predictions"]
    return model, cuts


def build(spec: Mapping[str, Any]) -> Any:
    return build_named_cuts(spec, "vgg16", make_model)
