"""AlexNet with the eleven partition stages of the DNN chapter (Keras, TensorFlow backend).

Stages: ``conv1 pool1 conv2 pool2 conv3 conv4 conv5 pool3 fc1 fc2 fc3`` (the flatten goes with
``fc1``; no dropout, this is an inference model). The input shape is a parameter:

* ``[32, 32, 3]`` (default, CIFAR-10 sized): the CIFAR variant, 5x5 / 5x5 / 3x3 convolutions at
  stride 1, 3x3 max pooling at stride 2 ("same" padding), so activations are 96x32x32, 96x16x16,
  256x16x16, 256x8x8, 384x8x8, 384x8x8, 256x8x8, 256x4x4, 4096, 4096, 10 (the cut sizes of the
  fake model's ``alexnet`` profile);
* 64 pixels or more (e.g. ``[224, 224, 3]``, ImageNet sized): the original 11x11 stride-4 first
  convolution.

Params: ``input_shape``, ``num_classes`` (10), ``fc_units`` (4096), ``weights_seed`` (0),
``weights_dir``. Builder: ``dit.models.alexnet:build``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dit.models.common import int_tuple, positive_int
from dit.models.keras_staged import build_named_cuts

STAGES = ("conv1", "pool1", "conv2", "pool2", "conv3", "conv4", "conv5", "pool3", "fc1", "fc2", "fc3")


def make_model(keras: Any, params: dict[str, Any]) -> tuple[Any, list[str]]:
    shape = int_tuple(params.get("input_shape", [32, 32, 3]), "model.params.input_shape")
    if len(shape) != 3:
        raise ValueError(f"model.params.input_shape: {list(shape)} is not [height, width, channels]")
    classes = positive_int(params, "num_classes", 10)
    fc = positive_int(params, "fc_units", 4096)
    L = keras.layers
    imagenet = min(shape[0], shape[1]) >= 64
    inp = keras.Input(shape=shape, name="image")
    if imagenet:
        x = L.Conv2D(96, 11, strides=4, padding="same", activation="relu", name="conv1")(inp)
    else:
        x = L.Conv2D(96, 5, padding="same", activation="relu", name="conv1")(inp)
    x = L.MaxPooling2D(3, 2, padding="same", name="pool1")(x)
    x = L.Conv2D(256, 5, padding="same", activation="relu", name="conv2")(x)
    x = L.MaxPooling2D(3, 2, padding="same", name="pool2")(x)
    x = L.Conv2D(384, 3, padding="same", activation="relu", name="conv3")(x)
    x = L.Conv2D(384, 3, padding="same", activation="relu", name="conv4")(x)
    x = L.Conv2D(256, 3, padding="same", activation="relu", name="conv5")(x)
    x = L.MaxPooling2D(3, 2, padding="same", name="pool3")(x)
    x = L.Flatten(name="flatten")(x)
    x = L.Dense(fc, activation="relu", name="fc1")(x)
    x = L.Dense(fc, activation="relu", name="fc2")(x)
    out = L.Dense(classes, activation="softmax", name="fc3")(x)
    return keras.Model(inp, out, name="alexnet"), list(STAGES)


def build(spec: Mapping[str, Any]) -> Any:
    return build_named_cuts(spec, "alexnet", make_model)
