"""Run directories for the report tests, assembled from tests/fixtures/run_small (no driver needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dit.analysis.model_validation import validate_run
from dit.optimise.api import optimise_run

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def report_run(target: Path, sweep_point: list[list[Any]] | None = None, tokens_per_s: float = 3.5) -> Path:
    """run_small as a finished run: status, metadata, aggregate, an optimiser result and a runtime summary."""
    shutil.copytree(FIXTURES / "run_small", target)
    label = "small" + (f"[{sweep_point[0][0]}={sweep_point[0][1]}]" if sweep_point else "")
    (target / "status.json").write_text(
        json.dumps(
            {
                "state": "completed",
                "label": label,
                "error": None,
                "stage_ns": {"teardown": 2_100_000_000, "preflight": 1_960_000_000, "profile": 5_490_000_000},
                "lateness_ns": {"device1": 16_000, "device2": 1_300_000},
            }
        )
    )
    (target / "metadata.json").write_text(
        json.dumps(
            {
                "mode": "local",
                "scenario": {
                    "label": label,
                    "name": "small",
                    "hash": "ab" * 32,
                    "sweep_point": sweep_point or [],
                },
                "dit": {"version": "0.1.0", "git": {"commit": "0123456789abcdef", "dirty": False}},
                "nodes": {"device1": {"cpu_model": "Cortex-A72", "cpu_count": 4, "mem_total_bytes": 4e9}},
                "versions": {"dit": "0.1.0", "torch": None},
            }
        )
    )
    optimise_run(target, "exhaustive", "total_delay", None, None)  # aggregates first
    validate_run(target)
    (target / "aggregate" / "summary.json").write_text(
        json.dumps(
            {
                "runtime": "layers",
                "tables": [],
                "values": [
                    {"name": "tokens_per_s", "value": tokens_per_s, "unit": "1/s", "type": "float"},
                    {"name": "token_p99", "value": 123_456_789, "unit": "ns", "type": "int"},
                ],
            }
        )
    )
    return target
