"""The resolved, frozen scenario and its parts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dit.runtime_api.registry import DEFAULT
from dit.scenario.frozen import FrozenDict, freeze, thaw
from dit.scenario.yamlio import dump_yaml

#: The runtime of a scenario without a ``runtime`` block (docs/runtimes.md).
DEFAULT_RUNTIME: Final = DEFAULT


def canonical_json(data: Any) -> str:
    """The text that is hashed: sorted keys, no spaces, UTF-8 (not \\u-escaped), no NaN."""
    return json.dumps(thaw(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_hash(data: Any) -> str:
    return hashlib.sha256(canonical_json(data).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class InputSpec:
    kind: str  # synthetic | npy | images
    path: str | None
    seed: int  # resolved: the scenario's seed unless given


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: FrozenDict
    input: InputSpec
    equivalence_enabled: bool
    equivalence_tolerance: float

    def adapter_spec(self, seed: int) -> dict[str, Any]:
        """The plain spec a model builder takes (``dit.device.adapter``): name, params, input, seed."""
        inp: dict[str, Any] = {"kind": self.input.kind, "seed": self.input.seed}
        if self.input.path is not None:
            inp["path"] = self.input.path
        return {"name": self.name, "params": thaw(self.params), "input": inp, "seed": seed}


@dataclass(frozen=True)
class EdgeSpec:
    policy: str  # RR | SJF
    nominal_frequency: bool
    profile_capacity: bool
    admission: str  # batch | immediate
    profile_min_s: float = 0.0


@dataclass(frozen=True)
class InferenceSpec:
    enabled: bool
    vectors: tuple[tuple[int, ...], ...]  # one partition vector per round, one point per device
    repetitions: int


@dataclass(frozen=True)
class OptimisationSpec:
    enabled: bool
    algorithm: str
    objective: str  # total_delay | variance | energy | edp
    policy: str  # RR | SJF, resolved (edge_server.policy unless given)


@dataclass(frozen=True)
class TimingSpec:
    start_lead_s: float
    max_clock_offset_ms: float
    settle_s: float
    settle: SettleSpec


@dataclass(frozen=True)
class SettleSpec:
    """``timing.settle``: wait until the load generators are at their CPU target (``dit.device.load``)."""

    steady: bool
    timeout_s: float
    tolerance_pct: float
    window_s: float


@dataclass(frozen=True)
class Scenario:
    """One fully resolved experiment (one variant of a sweep). Every value is deeply frozen."""

    name: str
    description: str
    devices: tuple[str, ...]
    seed: int
    repetitions: int
    warmup: int
    model: ModelSpec | None  # None: a runtime that brings its own model (no ``uses_testbed_model``)
    edge: EdgeSpec
    inference: InferenceSpec
    optimisation: OptimisationSpec
    timing: TimingSpec
    load: FrozenDict  # device -> {mode, ...}
    network: FrozenDict  # device -> {delay_ms, ..., variation: {kind, ...}}
    hardware: FrozenDict  # device -> {cpu_freq_mhz, ...}
    background_traffic: FrozenDict  # device -> {bitrate_mbit, protocol, target}
    sweep_point: tuple[tuple[str, Any], ...]  # ((path, value), ...) that produced this variant
    data: FrozenDict  # the whole resolved document (defaults and sweep applied, no sweep key)
    hash: str  # sha256 hex of canonical_json(data)

    @property
    def label(self) -> str:
        """``name`` plus the sweep point: ``ch4_validation[edge_server.policy=RR]``."""
        if not self.sweep_point:
            return self.name
        point = ",".join(f"{path}={_label_value(value)}" for path, value in self.sweep_point)
        return f"{self.name}[{point}]"

    def sweep_point_json(self) -> list[list[Any]]:
        """The sweep point as plain JSON ``[[path, value], ...]`` (a mapping value stays a mapping)."""
        return [[path, thaw(value)] for path, value in self.sweep_point]

    @property
    def runtime(self) -> dict[str, Any]:
        """The ``runtime`` block, ``name`` included (``{"name": "layers"}`` when the scenario has none)."""
        block = self.data.get("runtime")
        out: dict[str, Any] = thaw(block) if block is not None else {"name": DEFAULT_RUNTIME}
        return out

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-serialisable copy of :attr:`data`."""
        out: dict[str, Any] = thaw(self.data)
        return out

    def to_yaml(self) -> str:
        """The resolved scenario as YAML (the run's ``scenario.yaml``); loads back to the same hash."""
        header = f"# {self.label}\n# sha256 {self.hash}\n"
        return dump_yaml(self.to_dict(), header=header)


def _label_value(value: Any) -> str:
    plain = thaw(value)
    if isinstance(plain, str):
        return plain
    return json.dumps(plain, ensure_ascii=False, separators=(",", ":"))


def _model_spec(model: FrozenDict) -> ModelSpec:
    inp = model["input"]
    eq = model["equivalence_check"]
    return ModelSpec(
        name=model["name"],
        params=model["params"],
        input=InputSpec(kind=inp["kind"], path=inp.get("path"), seed=inp["seed"]),
        equivalence_enabled=eq["enabled"],
        equivalence_tolerance=float(eq["tolerance"]),
    )


def build(resolved: Mapping[str, Any], sweep_point: tuple[tuple[str, Any], ...]) -> Scenario:
    """A :class:`Scenario` from a resolved, valid document."""
    data: FrozenDict = freeze(resolved)
    model = data.get("model")
    edge = data["edge_server"]
    inference = data["inference"]
    opt = data["optimisation"]
    timing = data["timing"]
    return Scenario(
        name=data["name"],
        description=data["description"],
        devices=tuple(data["devices"]),
        seed=data["seed"],
        repetitions=data["repetitions"],
        warmup=data["warmup"],
        model=None if model is None else _model_spec(model),
        edge=EdgeSpec(
            policy=edge["policy"],
            nominal_frequency=edge["nominal_frequency"],
            profile_capacity=edge["profile_capacity"],
            admission=edge["admission"],
            profile_min_s=float(edge["profile_min_s"]),
        ),
        inference=InferenceSpec(
            enabled=inference["enabled"],
            vectors=tuple(tuple(v) for v in inference.get("partition_points", ())),
            repetitions=inference["repetitions"],
        ),
        optimisation=OptimisationSpec(
            enabled=opt["enabled"],
            algorithm=opt["algorithm"],
            objective=opt["objective"],
            policy=opt["policy"],
        ),
        timing=TimingSpec(
            start_lead_s=float(timing["start_lead_s"]),
            max_clock_offset_ms=float(timing["max_clock_offset_ms"]),
            settle_s=float(timing["settle_s"]),
            settle=SettleSpec(
                steady=bool(timing["settle"]["steady"]),
                timeout_s=float(timing["settle"]["timeout_s"]),
                tolerance_pct=float(timing["settle"]["tolerance_pct"]),
                window_s=float(timing["settle"]["window_s"]),
            ),
        ),
        load=data["load"],
        network=data["network"],
        hardware=data["hardware"],
        background_traffic=data["background_traffic"],
        sweep_point=tuple((p, freeze(v)) for p, v in sweep_point),
        data=data,
        hash=content_hash(resolved),
    )


__all__ = [
    "DEFAULT_RUNTIME",
    "EdgeSpec",
    "InferenceSpec",
    "InputSpec",
    "ModelSpec",
    "OptimisationSpec",
    "Scenario",
    "TimingSpec",
    "build",
    "canonical_json",
    "content_hash",
]


def partition_vector(entry: Any, device_count: int) -> list[int] | None:
    """One ``inference.partition_points`` entry as an explicit vector, or None when it is neither form.

    An integer p is the same point on every device, ``[p] * device_count``; a list of
    ``device_count`` points is a vector in ``devices`` order already.
    """
    if isinstance(entry, int) and not isinstance(entry, bool):
        return [entry] * device_count
    if isinstance(entry, list) and len(entry) == device_count:
        return [int(p) for p in entry]
    return None
