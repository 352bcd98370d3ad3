"""What ``dit simulate`` needs from a runtime that places model units on workers: its placement model.

A runtime offers one through the optional method ``placement_model()`` (docs/runtimes.md); the simulator
asks the registry for it (:func:`placement_model_of`) and places every unit with the functions the runtime
itself runs, never a copy of them, so a simulated placement is the one a run would make. The types here
are structural: the runtime's own model shapes, units and workers satisfy them, and the core imports none
of its code. HeadSplit provides the one the simulator uses (``headsplit.plugin.placement_model``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dit.runtime_api.interface import Runtime


class ModelShape(Protocol):
    """A decoder's shape as the placement model costs it."""

    @property
    def name(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def ffn_hidden(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def max_positions(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def group_size(self) -> int: ...
    def kv_head_of(self, head: int) -> int: ...
    def to_json(self) -> dict[str, Any]: ...


class PlacedUnit(Hashable, Protocol):
    """One unit a worker holds: a query head of a layer (``head`` its index), its projection or its FFN."""

    @property
    def layer(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def head(self) -> int: ...
    def key(self) -> str: ...


class Worker(Protocol):
    """A worker as the placement sees it: its memory limit, rates and round trip to the controller."""

    @property
    def name(self) -> str: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def flops_per_s(self) -> float: ...
    @property
    def rtt_ns(self) -> int: ...
    @property
    def unit_flops_per_s(self) -> tuple[float, float, float] | None: ...


class MeasuredCosts(Protocol):
    """Per-kind rates a profile run measured on each device."""

    @property
    def path(self) -> str: ...
    @property
    def devices(self) -> Mapping[str, Any]: ...
    def rates(self, device: str) -> tuple[float, float, float]: ...
    def source(self) -> dict[str, Any]: ...


Placement = dict[PlacedUnit, str]  # unit -> the worker holding it


class PlacementModel(Protocol):
    """A runtime's placement and cost model (HeadSplit's: ``headsplit.placement`` and its neighbours)."""

    @property
    def presets(self) -> Mapping[str, ModelShape]: ...
    @property
    def strategies(self) -> tuple[str, ...]: ...
    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight or cache element."""
        ...

    @property
    def rtt_margin(self) -> float:
        """What the placement multiplies a measured round trip by."""
        ...

    @property
    def placement_error(self) -> type[ValueError]:
        """Raised when no placement fits (its ``worker`` names the worker)."""
        ...

    @property
    def profile_error(self) -> type[ValueError]:
        """Raised when a profile run cannot be read."""
        ...

    def preset(self, name: str) -> ModelShape: ...
    def model_from_json(self, doc: dict[str, Any]) -> ModelShape: ...
    def unit(self, layer: int, kind: str, head: int = -1) -> PlacedUnit: ...
    def worker(
        self,
        name: str,
        memory_bytes: int,
        flops_per_s: float,
        rtt_ns: int,
        unit_flops_per_s: tuple[float, float, float] | None = None,
    ) -> Worker: ...
    def all_units(self, cfg: ModelShape) -> list[PlacedUnit]: ...
    def unit_flops(self, cfg: ModelShape, unit: PlacedUnit, context_tokens: int) -> float: ...
    def kv_flops(self, cfg: ModelShape) -> float: ...
    def weight_bytes(self, cfg: ModelShape, unit: PlacedUnit) -> int: ...
    def kv_weight_bytes(self, cfg: ModelShape) -> int: ...
    def kv_cache_bytes_per_token(self, cfg: ModelShape) -> int: ...
    def bytes_by_worker(
        self, cfg: ModelShape, placement: Mapping[PlacedUnit, str], tokens: int
    ) -> dict[str, int]: ...
    def place(
        self,
        cfg: ModelShape,
        workers: Sequence[Worker],
        strategy: str,
        *,
        context_tokens: int,
        bandwidth_bytes_per_s: float = ...,
        trace: list[PlacedUnit] | None = None,
    ) -> Placement: ...
    def replace(
        self,
        cfg: ModelShape,
        workers: Sequence[Worker],
        current: Mapping[PlacedUnit, str],
        *,
        tokens_so_far: int,
        tokens_ahead: int,
    ) -> Placement: ...
    def moves(
        self, old: Mapping[PlacedUnit, str], new: Mapping[PlacedUnit, str]
    ) -> list[tuple[PlacedUnit, str, str]]: ...
    def migration_bytes(
        self,
        cfg: ModelShape,
        old: Mapping[PlacedUnit, str],
        new: Mapping[PlacedUnit, str],
        tokens_so_far: int,
    ) -> int: ...
    def estimate_token_s(
        self,
        cfg: ModelShape,
        workers: Sequence[Worker],
        placement: Mapping[PlacedUnit, str],
        *,
        context_tokens: int,
        bandwidth_bytes_per_s: float = ...,
    ) -> float: ...
    def no_fit(self, message: str, *, worker: str, needed_bytes: int, limit_bytes: int) -> ValueError:
        """The :attr:`placement_error` a placement made elsewhere (the simulator's exact solver) raises."""
        ...

    def placement_from_json(
        self, cfg: ModelShape, doc: Mapping[str, str], workers: Sequence[str]
    ) -> Placement: ...
    def read_profile(self, run_dir: str | Path) -> MeasuredCosts: ...


def placement_model_of(runtime: Runtime) -> PlacementModel | None:
    """The runtime's placement model (optional ``placement_model``; None without one)."""
    hook = getattr(runtime, "placement_model", None)
    return hook() if callable(hook) else None
