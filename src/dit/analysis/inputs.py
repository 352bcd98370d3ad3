"""What the aggregate reads: the raw files' columns, the raw files themselves, scenario numbers.

The raw files' columns are the device writers' own (one definition each). The aggregate requires all
of them except those added after the first raw files were written, so a run directory assembled by
hand, or kept from an older version, still aggregates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pandas as pd

from dit.analysis.run import AggregateError, raw_file
from dit.device.client import INFERENCE_COLUMNS as RAW_INFERENCE_COLUMNS
from dit.device.edge import EDGE_REQUEST_COLUMNS as RAW_EDGE_REQUEST_COLUMNS
from dit.device.profiler import LAYERS_COLUMNS as RAW_LAYERS_COLUMNS

EDGE_HOST: Final = "edge"
OPTIONAL_INFERENCE_COLUMNS: Final = ("ack_overlap_ns",)
OPTIONAL_LAYERS_COLUMNS: Final = ("cpu_peak_pct",)  # absent from raw files of older agents
LAYERS_RAW_COLUMNS: Final = tuple(c for c in RAW_LAYERS_COLUMNS if c not in OPTIONAL_LAYERS_COLUMNS)
INFERENCE_COLUMNS: Final = tuple(c for c in RAW_INFERENCE_COLUMNS if c not in OPTIONAL_INFERENCE_COLUMNS)
EDGE_REQUEST_COLUMNS: Final = RAW_EDGE_REQUEST_COLUMNS


def scenario_block(scenario: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = scenario
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def optional_number(scenario: Mapping[str, Any], section: str, device: str, key: str) -> float | None:
    value = scenario_block(scenario, section, device).get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise AggregateError(f"{section}.{device}.{key}: {value!r} is not a non-negative number")
    return float(value)


def read_csv(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError as exc:
        raise AggregateError(f"{path} is empty (no header)") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise AggregateError(f"{path} lacks the columns {missing}")
    return frame


def read_raw_layers(run_dir: Path, host: str) -> pd.DataFrame | None:
    path = raw_file(run_dir, host, "layers.csv")
    return read_csv(path, LAYERS_RAW_COLUMNS) if path.is_file() else None


def read_raw_inference(run_dir: Path, host: str) -> pd.DataFrame | None:
    path = raw_file(run_dir, host, "inference.csv")
    return read_csv(path, INFERENCE_COLUMNS) if path.is_file() else None


def read_edge_requests(run_dir: Path) -> pd.DataFrame | None:
    path = raw_file(run_dir, EDGE_HOST, "edge_requests.csv")
    return read_csv(path, EDGE_REQUEST_COLUMNS) if path.is_file() else None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AggregateError(f"{path} is not valid JSON: {exc}") from exc
