"""The one place the simulator reaches a runtime's placement model: HeadSplit's, through the registry.

The simulator places units with the functions HeadSplit runs, never a copy of them, so a simulated
placement is the one a run would make. HeadSplit is its own distribution (``runtimes/headsplit``) and a
plug-in: its ``placement_model()`` (``dit.runtime_api.placement``, docs/runtimes.md) hands them over, and
dit imports none of its modules. The names below are the model's, under the names the simulator has
always used for them.
"""

from __future__ import annotations

from typing import Final

from dit.runtime_api import registry
from dit.runtime_api.placement import (
    MeasuredCosts,
    ModelShape,
    PlacedUnit,
    Placement,
    PlacementModel,
    Worker,
    placement_model_of,
)

#: The runtime whose placement model the simulator runs (``partitioning: headsplit``).
RUNTIME: Final = "headsplit"


class HeadSplitMissing(ImportError):
    """HeadSplit's plug-in is not installed, or gives no placement model."""


def load_model(name: str = RUNTIME) -> PlacementModel:
    """Runtime ``name``'s placement model, or :class:`HeadSplitMissing` saying how to install it."""
    try:
        runtime = registry.get(name)
    except registry.UnknownRuntime as exc:
        raise HeadSplitMissing(f"the simulator uses {name}'s placement code: {exc}") from None
    model = placement_model_of(runtime)
    if model is None:
        raise HeadSplitMissing(f"the simulator uses {name}'s placement code, and runtime {name!r} gives none")
    return model


MODEL: Final = load_model()

# the types, as the simulator names them
ModelConfig = ModelShape
Unit = PlacedUnit
WorkerSpec = Worker
ProfileCosts = MeasuredCosts
Strategy = str

PRESETS: Final = MODEL.presets
STRATEGIES: Final = MODEL.strategies
DTYPE_BYTES: Final = MODEL.dtype_bytes
RTT_MARGIN: Final = MODEL.rtt_margin
PlacementError: Final = MODEL.placement_error
ProfileError: Final = MODEL.profile_error

unit = MODEL.unit
worker_spec = MODEL.worker
preset = MODEL.preset
all_units = MODEL.all_units
unit_flops = MODEL.unit_flops
kv_flops = MODEL.kv_flops
weight_bytes = MODEL.weight_bytes
kv_weight_bytes = MODEL.kv_weight_bytes
kv_cache_bytes_per_token = MODEL.kv_cache_bytes_per_token
bytes_by_worker = MODEL.bytes_by_worker
place = MODEL.place
replace = MODEL.replace
moves = MODEL.moves
migration_bytes = MODEL.migration_bytes
estimate_token_s = MODEL.estimate_token_s
no_fit = MODEL.no_fit
placement_from_json = MODEL.placement_from_json
model_from_json = MODEL.model_from_json
read_profile = MODEL.read_profile

__all__ = [
    "DTYPE_BYTES",
    "MODEL",
    "PRESETS",
    "RTT_MARGIN",
    "STRATEGIES",
    "HeadSplitMissing",
    "ModelConfig",
    "Placement",
    "PlacementError",
    "ProfileCosts",
    "ProfileError",
    "Strategy",
    "Unit",
    "WorkerSpec",
    "all_units",
    "bytes_by_worker",
    "estimate_token_s",
    "kv_cache_bytes_per_token",
    "kv_flops",
    "kv_weight_bytes",
    "migration_bytes",
    "model_from_json",
    "moves",
    "no_fit",
    "place",
    "placement_from_json",
    "preset",
    "read_profile",
    "replace",
    "unit",
    "unit_flops",
    "weight_bytes",
    "worker_spec",
]
