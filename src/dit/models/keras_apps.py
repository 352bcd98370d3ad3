"""Any classifier of the Keras applications collection, cut automatically (TensorFlow backend).

``keras.applications.<application>(weights=None, input_shape=..., classes=...)``: the single-
tensor cut points of the functional graph are found automatically (see
:mod:`dit.models.keras_staged`) and thinned to ``num_stages`` stages of comparable work, by
analytic operation count (``balance: ops``, default) or by per-layer latency measured once at
build time (``balance: latency``; the cut positions then depend on the machine, the weights do
not). Each stage is named after its last layer.

Params: ``application`` (e.g. ``MobileNetV2``, ``DenseNet121``, ``EfficientNetB0``, ``ResNet50V2``,
``InceptionV3``), ``input_shape`` ([224, 224, 3]), ``num_classes`` (1000), ``num_stages`` (8),
``balance`` (``ops``), ``weights_seed``, ``weights_dir``. Builder: ``dit.models.keras_apps:build``.
The catalogue names ``mobilenetv2``, ``densenet121`` and ``efficientnetb0`` are presets of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dit.models.catalogue import entry
from dit.models.common import int_tuple, make_array_input, positive_int
from dit.models.keras_staged import (
    KerasStagedModel,
    analyse,
    import_keras,
    load_catalogue_weights,
    op_latencies,
    thin_cuts,
)

PRESETS = {"mobilenetv2": "MobileNetV2", "densenet121": "DenseNet121", "efficientnetb0": "EfficientNetB0"}


def make_model(keras: Any, params: Mapping[str, Any]) -> Any:
    app_name = str(params.get("application", ""))
    app = getattr(keras.applications, app_name, None)
    if not app_name or not callable(app):
        raise ValueError(f"model.params.application: {app_name!r} is not a Keras application")
    shape = int_tuple(params.get("input_shape", [224, 224, 3]), "model.params.input_shape")
    classes = positive_int(params, "num_classes", 1000)
    return app(weights=None, input_shape=shape, classes=classes)


def build(spec: Mapping[str, Any]) -> Any:
    name = str(spec.get("name", "keras_app"))
    cat_name = name if name in PRESETS else "keras_app"
    cat = entry(cat_name)
    params = cat.defaults(dict(spec.get("params") or {}))
    stages = positive_int(params, "num_stages", 8)
    balance = str(params.get("balance", "ops"))
    if balance not in ("ops", "latency"):
        raise ValueError(f"model.params.balance: {balance!r} is not one of ops, latency")
    keras = import_keras()
    keras.utils.set_random_seed(int(params.get("weights_seed", 0)))
    model = make_model(keras, params)
    record = load_catalogue_weights(model, cat_name, cat.weight_identity(params), params)
    graph = analyse(model)
    if balance == "ops":
        work = [float(op.ops) for op in graph.ops]
    else:
        x = make_array_input(spec, tuple(int(d) for d in model.inputs[0].shape[1:]))
        work = op_latencies(model, graph, np.asarray(x))
    cuts = thin_cuts(work, sorted(graph.cut_after), stages)
    return KerasStagedModel(name, model, cuts, spec, graph=graph, weights=record)
