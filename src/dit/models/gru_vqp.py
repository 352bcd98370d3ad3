"""The GRU predictor of video quality (Keras, TensorFlow backend): 5 stages.

A small recurrent regressor over a window of per-segment features of an adaptive video stream
(default 10 segments x 8 features: bitrate, resolution, quantisation parameter, frame rate,
stall time, buffer level, throughput, quality switch), predicting one quality score (a MOS-like
regression output, linear). Stages: ``embed`` (a per-segment dense projection), ``gru1`` (returns
the sequence), ``gru2`` (returns its last state), ``fc``, ``quality``.

Params: ``window`` (10), ``features`` (8), ``units`` (64), ``weights_seed``, ``weights_dir``.
Builder: ``dit.models.gru_vqp:build``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dit.models.common import positive_int
from dit.models.keras_staged import build_named_cuts

STAGES = ("embed", "gru1", "gru2", "fc", "quality")


def make_model(keras: Any, params: dict[str, Any]) -> tuple[Any, list[str]]:
    window = positive_int(params, "window", 10)
    features = positive_int(params, "features", 8)
    units = positive_int(params, "units", 64)
    L = keras.layers
    inp = keras.Input(shape=(window, features), name="segments")
    x = L.Dense(units, activation="relu", name="embed")(inp)
    x = L.GRU(units, return_sequences=True, name="gru1")(x)
    x = L.GRU(units // 2, name="gru2")(x)
    x = L.Dense(16, activation="relu", name="fc")(x)
    out = L.Dense(1, name="quality")(x)
    return keras.Model(inp, out, name="gru_vqp"), list(STAGES)


def build(spec: Mapping[str, Any]) -> Any:
    return build_named_cuts(spec, "gru_vqp", make_model)
