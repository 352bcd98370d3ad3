"""One run directory as every analysis step sees it: ``scenario.yaml`` read once, raw files by name.

The driver makes one :class:`LoadedRun` for the aggregate stage and passes it to every step
(the aggregate, each condition's ``aggregate()`` hook, the monitor traces, the model validation, the
optimiser), so the scenario is read once per run. Each step also accepts a plain path, for a run
directory analysed on its own (``dit optimise RUN_DIR``, a notebook).

The document is read with the scenario loader's strict YAML reader (:func:`dit.scenario.load_yaml`:
size and depth limits, duplicate keys refused) but not validated against the schema: a run directory
assembled by hand (docs/interchange.md) needs only ``devices`` and the blocks the step reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

# The scenario's leaf modules, not the package: dit.scenario's schema asks the runtimes' registry for their
# blocks, and a runtime's parser takes a LoadedRun.
from dit.scenario.errors import ScenarioError
from dit.scenario.spec import partition_vector
from dit.scenario.yamlio import load_yaml

SCENARIO_FILE = "scenario.yaml"
#: Every node's process list (``dit_collect`` writes it into the node's results/): ``raw/<host>/<host>_processes.json``.
PROCESSES_FILE = "processes.json"


class AggregateError(Exception):
    """The run directory lacks what aggregation (or reading the aggregate back) needs."""


def raw_file(run_dir: Path, host: str, name: str) -> Path:
    """``raw/<host>/<host>_<name>``."""
    return run_dir / "raw" / host / f"{host}_{name}"


def scenario_devices(scenario: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(d) for d in scenario["devices"])


def round_vectors(scenario: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """The partition vector of every inference round: ``inference.partition_points`` expanded.

    The expansion is the scenario loader's (:func:`dit.scenario.core.partition_vector`).
    """
    devices = scenario_devices(scenario)
    inference = scenario.get("inference")
    points = (inference.get("partition_points") if isinstance(inference, Mapping) else None) or []
    vectors: list[tuple[int, ...]] = []
    for k, entry in enumerate(points):
        vector = partition_vector(entry, len(devices))
        if vector is None:
            raise AggregateError(
                f"inference.partition_points[{k}]: {entry!r} is neither a partition point nor a vector "
                f"of {len(devices)} points"
            )
        vectors.append(tuple(vector))
    return vectors


class LoadedRun:
    """A run directory; its scenario is read on first use and kept."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, run: LoadedRun | Path | str) -> LoadedRun:
        """``run`` itself when it is loaded already, else a new one for the directory."""
        return run if isinstance(run, LoadedRun) else cls(run)

    def __repr__(self) -> str:
        return f"LoadedRun({str(self.path)!r})"

    @cached_property
    def scenario(self) -> dict[str, Any]:
        """``scenario.yaml`` of the run; a mapping with a non-empty ``devices`` list of unique names."""
        path = self.path / SCENARIO_FILE
        if not path.is_file():
            raise AggregateError(f"{path} does not exist")
        try:
            data = load_yaml(path)
        except ScenarioError as exc:
            raise AggregateError(f"{path}: {exc}") from exc
        devices = data.get("devices")
        if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
            raise AggregateError(f"{path}: devices must be a non-empty list of device names")
        if len(set(devices)) != len(devices):
            raise AggregateError(f"{path}: devices has duplicates: {devices}")
        return data

    @property
    def devices(self) -> tuple[str, ...]:
        return scenario_devices(self.scenario)

    @property
    def aggregate_dir(self) -> Path:
        return self.path / "aggregate"

    def raw_file(self, host: str, name: str) -> Path:
        """``raw/<host>/<host>_<name>`` of this run."""
        return raw_file(self.path, host, name)

    def round_vectors(self) -> list[tuple[int, ...]]:
        return round_vectors(self.scenario)
