"""Built-in model names, their stage counts and how to build them.

The stage count is known without importing any framework, so a scenario can be validated
(partition points within 0..N) on a laptop that has neither TensorFlow nor PyTorch.
``stand_in`` is the fake-model profile that replaces the real network in local mode when the
framework is not installed (the article: "a fake model with configurable stages stands in for a
real network").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    framework: str  # "none" | "tensorflow" | "torch"
    builder: str  # "module:function"
    stages: int
    stand_in: str | None  # a fake-model profile name, or None when the model has no stand-in


BUILTIN: dict[str, CatalogueEntry] = {
    "fake": CatalogueEntry("fake", "none", "dit.device.fakemodel:build", 11, None),
    "alexnet": CatalogueEntry("alexnet", "tensorflow", "dit.models.alexnet:build", 11, "alexnet"),
}


def stage_count(name: str, params: Mapping[str, Any]) -> int | None:
    """N for a model name and its params, or None when the name is unknown here."""
    if name == "fake":
        stages = params.get("stages")
        if isinstance(stages, list):
            return len(stages)
        from dit.device.fakemodel import PROFILES

        profile = str(params.get("profile", "alexnet"))
        return len(PROFILES[profile]) if profile in PROFILES else None
    entry = BUILTIN.get(name)
    if entry is None:
        return None
    if "num_stages" in params and isinstance(params["num_stages"], int):
        return int(params["num_stages"])
    return entry.stages
