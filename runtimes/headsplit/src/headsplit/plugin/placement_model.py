"""HeadSplit's placement and cost model as the simulator asks for it (``dit.runtime_api.placement``).

``dit simulate`` places units with HeadSplit's own code (:mod:`headsplit.placement`, :mod:`headsplit.units`,
:mod:`headsplit.config`, :mod:`headsplit.profile_costs`, all torch-free); this adapter hands it over
through the runtime interface, so the core imports no HeadSplit module. The simulator passes back only
what this model made (its presets, units and workers), which is why the casts below hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

from dit.runtime_api.placement import MeasuredCosts, ModelShape, PlacedUnit, Placement, Worker
from headsplit import placement, units
from headsplit.config import PRESETS, ModelConfig, preset
from headsplit.placement import (
    DEFAULT_BANDWIDTH_BYTES_PER_S,
    STRATEGIES,
    PlacementError,
    Strategy,
    WorkerSpec,
)
from headsplit.profile_costs import ProfileError, read_profile
from headsplit.units import Unit, UnitKind


def _cfg(cfg: ModelShape) -> ModelConfig:
    return cast(ModelConfig, cfg)


def _map(placed: Mapping[PlacedUnit, str]) -> Mapping[Unit, str]:
    return cast(Mapping[Unit, str], placed)


def _workers(workers: Sequence[Worker]) -> Sequence[WorkerSpec]:
    return cast(Sequence[WorkerSpec], workers)


def _out(placed: placement.Placement) -> Placement:
    return cast(Placement, placed)


class HeadSplitPlacementModel:
    """:class:`dit.runtime_api.placement.PlacementModel` of HeadSplit."""

    presets: Final[Mapping[str, ModelShape]] = PRESETS
    strategies: Final[tuple[str, ...]] = STRATEGIES
    dtype_bytes: Final = units.DTYPE_BYTES
    rtt_margin: Final = placement.RTT_MARGIN
    placement_error: Final[type[ValueError]] = PlacementError
    profile_error: Final[type[ValueError]] = ProfileError

    def preset(self, name: str) -> ModelShape:
        return preset(name)

    def model_from_json(self, doc: dict[str, Any]) -> ModelShape:
        return ModelConfig.from_json(doc)

    def unit(self, layer: int, kind: str, head: int = -1) -> PlacedUnit:
        return Unit(layer, cast(UnitKind, kind), head)

    def worker(
        self,
        name: str,
        memory_bytes: int,
        flops_per_s: float,
        rtt_ns: int,
        unit_flops_per_s: tuple[float, float, float] | None = None,
    ) -> Worker:
        return WorkerSpec(name, memory_bytes, flops_per_s, rtt_ns, unit_flops_per_s)

    def all_units(self, cfg: ModelShape) -> list[PlacedUnit]:
        return list(units.all_units(_cfg(cfg)))

    def unit_flops(self, cfg: ModelShape, unit: PlacedUnit, context_tokens: int) -> float:
        return placement.unit_flops(_cfg(cfg), cast(Unit, unit), context_tokens)

    def kv_flops(self, cfg: ModelShape) -> float:
        return placement.kv_flops(_cfg(cfg))

    def weight_bytes(self, cfg: ModelShape, unit: PlacedUnit) -> int:
        return units.weight_bytes(_cfg(cfg), cast(Unit, unit))

    def kv_weight_bytes(self, cfg: ModelShape) -> int:
        return units.kv_weight_bytes(_cfg(cfg))

    def kv_cache_bytes_per_token(self, cfg: ModelShape) -> int:
        return units.kv_cache_bytes_per_token(_cfg(cfg))

    def bytes_by_worker(
        self, cfg: ModelShape, placement_: Mapping[PlacedUnit, str], tokens: int
    ) -> dict[str, int]:
        return placement.bytes_by_worker(_cfg(cfg), _map(placement_), tokens)

    def place(
        self,
        cfg: ModelShape,
        workers: Sequence[Worker],
        strategy: str,
        *,
        context_tokens: int,
        bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S,
        trace: list[PlacedUnit] | None = None,
    ) -> Placement:
        return _out(
            placement.place(
                _cfg(cfg),
                _workers(workers),
                cast(Strategy, strategy),
                context_tokens=context_tokens,
                bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                trace=cast("list[Unit] | None", trace),
            )
        )

    def replace(
        self,
        cfg: ModelShape,
        workers: Sequence[Worker],
        current: Mapping[PlacedUnit, str],
        *,
        tokens_so_far: int,
        tokens_ahead: int,
    ) -> Placement:
        return _out(
            placement.replace(
                _cfg(cfg),
                _workers(workers),
                _map(current),
                tokens_so_far=tokens_so_far,
                tokens_ahead=tokens_ahead,
            )
        )

    def moves(
        self, old: Mapping[PlacedUnit, str], new: Mapping[PlacedUnit, str]
    ) -> list[tuple[PlacedUnit, str, str]]:
        return list(placement.moves(_map(old), _map(new)))

    def migration_bytes(
        self,
        cfg: ModelShape,
        old: Mapping[PlacedUnit, str],
        new: Mapping[PlacedUnit, str],
        tokens_so_far: int,
    ) -> int:
        return placement.migration_bytes(_cfg(cfg), _map(old), _map(new), tokens_so_far)

    def estimate_token_s(
        self,
        cfg: ModelShape,
        workers: Sequence[Worker],
        placement_: Mapping[PlacedUnit, str],
        *,
        context_tokens: int,
        bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S,
    ) -> float:
        return placement.estimate_token_s(
            _cfg(cfg),
            _workers(workers),
            _map(placement_),
            context_tokens=context_tokens,
            bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        )

    def no_fit(self, message: str, *, worker: str, needed_bytes: int, limit_bytes: int) -> ValueError:
        return PlacementError(message, worker=worker, needed_bytes=needed_bytes, limit_bytes=limit_bytes)

    def placement_from_json(
        self, cfg: ModelShape, doc: Mapping[str, str], workers: Sequence[str]
    ) -> Placement:
        return _out(placement.placement_from_json(_cfg(cfg), doc, workers))

    def read_profile(self, run_dir: str | Path) -> MeasuredCosts:
        return read_profile(run_dir)


MODEL: Final = HeadSplitPlacementModel()
