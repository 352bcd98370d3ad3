"""The one place the simulator reaches HeadSplit's code: its model shapes, units and placement.

The simulator places units with the functions HeadSplit runs (``headsplit.placement``), never a copy of
them, so a simulated placement is the one a run would make. HeadSplit is its own distribution
(``runtimes/headsplit``); a source checkout whose venv lacks it imports it from the checkout, as the
HeadSplit benchmarks do.
"""

from __future__ import annotations

import importlib.util
import sys

from dit.paths import content_root


class HeadSplitMissing(ImportError):
    """HeadSplit's package is neither installed nor in this checkout."""


def ensure_headsplit() -> None:
    """Make ``import headsplit`` work, or raise :class:`HeadSplitMissing` saying how to install it."""
    if importlib.util.find_spec("headsplit") is not None:
        return
    src = content_root() / "runtimes" / "headsplit" / "src"
    if (src / "headsplit" / "placement.py").is_file():
        sys.path.insert(0, str(src))
        return
    raise HeadSplitMissing(
        "the simulator uses HeadSplit's placement code: install the runtime (pip install runtimes/headsplit "
        "from a dit checkout) or run dit from a checkout"
    )


ensure_headsplit()

from headsplit.config import PRESETS, ModelConfig, preset  # noqa: E402
from headsplit.placement import (  # noqa: E402
    STRATEGIES,
    Placement,
    PlacementError,
    Strategy,
    WorkerSpec,
    bytes_by_worker,
    kv_flops,
    migration_bytes,
    moves,
    place,
    placement_from_json,
    replace,
    unit_flops,
)
from headsplit.profile_costs import ProfileCosts, ProfileError, read_profile  # noqa: E402
from headsplit.units import DTYPE_BYTES, Unit, all_units  # noqa: E402

__all__ = [
    "DTYPE_BYTES",
    "PRESETS",
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
    "kv_flops",
    "migration_bytes",
    "moves",
    "place",
    "placement_from_json",
    "preset",
    "read_profile",
    "replace",
    "unit_flops",
]
