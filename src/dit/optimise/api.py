"""``dit optimise``: search (or evaluate) a partition vector on a finished run directory.

Works from ``aggregate/{layers,links,feasibility}.csv`` plus ``scenario.yaml`` alone (running the aggregate
stage first when those files are missing but ``raw/`` exists), so it can be rerun on any finished run or on
a directory assembled by hand, with no hardware.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from dit.analysis.aggregate import aggregate_run, read_model_inputs
from dit.analysis.delay import (
    OBJECTIVE_UNITS,
    DelayBreakdown,
    DelayModel,
    DelayModelError,
    Objective,
    Policy,
    check_objective,
    check_policy,
    energy_j,
    evaluate,
    objective_of,
)
from dit.analysis.run import LoadedRun
from dit.optimise import DEFAULT_MAX_VECTORS, OptimiseError, Problem, SearchResult, registry
from dit.run.rundir import write_text

DEFAULT_ALGORITHM: Final = "greedy"
DEFAULT_OBJECTIVE: Final = "total_delay"
DEFAULT_POLICY: Final = "RR"
VECTOR_ALGORITHM: Final = "vector"
"""The ``algorithm`` recorded when a given vector is evaluated instead of searched."""


@dataclass(frozen=True)
class OptimiseResult:
    """One search (or evaluation) on a run; ``to_json()`` is what ``optimise/<A>-<O>-<P>.json`` holds."""

    run_dir: Path
    algorithm: str
    objective: Objective
    policy: Policy
    devices: tuple[str, ...]
    vector: tuple[int, ...]
    local_ns: tuple[int, ...]
    transmission_ns: tuple[int, ...]
    remote_ns: tuple[int, ...]
    delay_ns: tuple[int, ...]
    energy_j: tuple[float, ...] | None  # per device, when the run has a power model
    objective_value: float
    vectors_evaluated: int
    search_wall_ns: int
    max_partition_points: tuple[int, ...]
    feasible: bool
    output_path: Path

    @property
    def objective_unit(self) -> str:
        return OBJECTIVE_UNITS[self.objective]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "algorithm": self.algorithm,
            "objective": self.objective,
            "objective_value": self.objective_value,
            "objective_unit": self.objective_unit,
            "policy": self.policy,
            "model": "all requests present at the edge at time 0",
            "devices": list(self.devices),
            "vector": list(self.vector),
            "per_device": [
                {
                    "device": d,
                    "partition_point": p,
                    "L_ns": loc,
                    "T_ns": tx,
                    "R_ns": rem,
                    "D_ns": delay,
                    "max_partition_point": bound,
                    **({} if self.energy_j is None else {"E_j": self.energy_j[index]}),
                }
                for index, (d, p, loc, tx, rem, delay, bound) in enumerate(self._per_device())
            ],
            "vectors_evaluated": self.vectors_evaluated,
            "search_wall_ns": self.search_wall_ns,
            "feasible": self.feasible,
        }

    def _per_device(self) -> list[tuple[str, int, int, int, int, int, int]]:
        """(device, p, L, T, R, D, max p) per device, in device order."""
        return list(
            zip(
                self.devices,
                self.vector,
                self.local_ns,
                self.transmission_ns,
                self.remote_ns,
                self.delay_ns,
                self.max_partition_points,
                strict=True,
            )
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def render_table(self) -> Table:
        """Per-device terms in milliseconds, the objective in the caption."""
        table = Table(
            title=f"{self.algorithm} · {self.objective} · {self.policy} — {self.run_dir.name}",
            caption=(
                f"{self.objective} = {_format_objective(self.objective, self.objective_value)} · "
                f"{self.vectors_evaluated:,} vectors evaluated in {self.search_wall_ns / 1e6:.3f} ms"
                + ("" if self.feasible else " · VECTOR IS OUTSIDE THE FEASIBLE RANGES")
            ),
        )
        table.add_column("device")
        headers = ["p", "max p", "L (ms)", "T (ms)", "R (ms)", "D (ms)"]
        if self.energy_j is not None:
            headers.append("E (mJ)")
        for header in headers:
            table.add_column(header, justify="right")
        for index, (d, p, loc, tx, rem, delay, bound) in enumerate(self._per_device()):
            cells = [f"{v / 1e6:.3f}" for v in (loc, tx, rem, delay)]
            if self.energy_j is not None:
                cells.append(f"{self.energy_j[index] * 1e3:.3f}")
            table.add_row(d, str(p), str(bound), *cells)
        return table


def _format_objective(objective: str, value: float) -> str:
    if objective == "total_delay":
        return f"{value / 1e6:.3f} ms"
    if objective == "energy":
        return f"{value * 1e3:.3f} mJ"
    if objective == "edp":
        return f"{value * 1e3:.4g} mJ·s"
    return f"{value / 1e12:.3f} ms²"


def resolve_settings(
    scenario: Mapping[str, Any], algorithm: str | None, objective: str | None, policy: str | None
) -> tuple[str, Objective, Policy]:
    """Explicit arguments, else the scenario's ``optimisation`` block, else the defaults.

    The policy falls back to ``optimisation.policy``, then ``edge_server.policy``, then RR.
    """
    block = scenario.get("optimisation")
    opt: Mapping[str, Any] = block if isinstance(block, Mapping) else {}
    edge = scenario.get("edge_server")
    edge_block: Mapping[str, Any] = edge if isinstance(edge, Mapping) else {}
    chosen_algorithm = algorithm or opt.get("algorithm") or DEFAULT_ALGORITHM
    chosen_objective = objective or opt.get("objective") or DEFAULT_OBJECTIVE
    chosen_policy = policy or opt.get("policy") or edge_block.get("policy") or DEFAULT_POLICY
    try:
        return (
            str(chosen_algorithm),
            check_objective(str(chosen_objective)),
            check_policy(str(chosen_policy).upper()),
        )
    except ValueError as exc:
        raise OptimiseError(str(exc)) from exc


def load_run_model(run: LoadedRun | Path) -> tuple[dict[str, Any], DelayModel]:
    """The scenario and the delay model of a run, aggregating first when ``aggregate/`` is incomplete."""
    loaded = LoadedRun.of(run)
    agg = loaded.aggregate_dir
    if (
        not ((agg / "layers.csv").is_file() and (agg / "links.csv").is_file())
        and (loaded.path / "raw").is_dir()
    ):
        aggregate_run(loaded)
    return loaded.scenario, read_model_inputs(loaded)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", name)


def _check_result(model: DelayModel, name: str, result: object) -> SearchResult:
    if not isinstance(result, SearchResult):
        raise OptimiseError(f"optimiser {name!r} returned {type(result).__name__}, not a SearchResult")
    try:
        vector = model.check_vector(result.vector)
    except ValueError as exc:
        raise OptimiseError(f"optimiser {name!r} returned an invalid vector: {exc}") from exc
    if not model.is_feasible(vector):
        raise OptimiseError(
            f"optimiser {name!r} returned {list(vector)}, outside the feasible ranges 0..{list(model.bounds)}"
        )
    return result


def optimise_run(
    run: LoadedRun | Path,
    algorithm: str | None,
    objective: str | None,
    policy: str | None,
    vector: Sequence[int] | None,
    max_vectors: int = DEFAULT_MAX_VECTORS,
) -> OptimiseResult:
    """Search with ``algorithm`` (or evaluate ``vector``) and write ``optimise/<A>-<O>-<P>.json``.

    ``None`` settings come from the scenario's ``optimisation`` block (see :func:`resolve_settings`). With
    ``vector`` the algorithm is recorded as ``vector``, one vector is evaluated and the vector may lie
    outside the feasible ranges (``feasible: false``). Raises :class:`OptimiseError` (including
    :class:`dit.optimise.TooManyVectorsError`) and :class:`dit.analysis.run.AggregateError` with messages
    meant for the user.
    """
    loaded = LoadedRun.of(run)
    run_dir = loaded.path
    scenario, model = load_run_model(loaded)
    name, chosen_objective, chosen_policy = resolve_settings(scenario, algorithm, objective, policy)
    if vector is not None:
        name = VECTOR_ALGORITHM
        start = time.monotonic_ns()
        try:
            chosen = model.check_vector(vector)
        except ValueError as exc:
            raise OptimiseError(str(exc)) from exc
        breakdown = evaluate(model, chosen, chosen_policy)
        wall = time.monotonic_ns() - start
        evaluated = 1
    else:
        optimiser = registry.load(name)
        problem = Problem(model, chosen_policy, chosen_objective, max_vectors=max_vectors)
        start = time.monotonic_ns()
        result = _check_result(model, name, optimiser(problem))
        wall = time.monotonic_ns() - start
        chosen = tuple(result.vector)
        breakdown = evaluate(model, chosen, chosen_policy)
        evaluated = result.vectors_evaluated
    path = run_dir / "optimise" / f"{_safe(name)}-{chosen_objective}-{chosen_policy}.json"
    outcome = OptimiseResult(
        run_dir=run_dir,
        algorithm=name,
        objective=chosen_objective,
        policy=chosen_policy,
        devices=model.devices,
        vector=chosen,
        local_ns=tuple(round(v) for v in breakdown.local_ns),
        transmission_ns=tuple(round(v) for v in breakdown.transmission_ns),
        remote_ns=tuple(round(v) for v in breakdown.remote_ns),
        delay_ns=tuple(round(v) for v in breakdown.delay_ns),
        energy_j=None if model.power is None else energy_j(model, breakdown),
        objective_value=_objective(model, breakdown, chosen_objective),
        vectors_evaluated=evaluated,
        search_wall_ns=wall,
        max_partition_points=model.bounds,
        feasible=model.is_feasible(chosen),
        output_path=path,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, outcome.to_json())
    return outcome


def _objective(model: DelayModel, breakdown: DelayBreakdown, objective: Objective) -> float:
    try:
        return objective_of(model, breakdown, objective)
    except DelayModelError as exc:
        raise OptimiseError(f"objective {objective}: {exc}") from exc


def parse_vector(text: str) -> list[int]:
    """``"2,4,8,11"`` -> ``[2, 4, 8, 11]`` (for the CLI's ``--vector``)."""
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError as exc:
        raise OptimiseError(f"--vector {text!r} is not a comma-separated list of integers") from exc
