"""A simulation's result directory (``dit simulate ... --out DIR``), which ``dit report DIR`` renders.

::

    DIR/simulation.json   what was simulated (kind, source, model, devices) and one entry per placement
                          (tokens/s, simulated time, migrations, out of memory, events); for a replay also
                          the measured figures, the MAPE and where the per-call cost was fitted
    DIR/tokens.csv        placement, token, simulated_s (and measured_s for a replay): latency per token
    DIR/memory.csv        placement, token, device, bytes: each device's memory after each token

Only the standard library writes it, and :mod:`dit.report.sim` reads it without the ``sim`` extra.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dit.report.sim import MEMORY_FILE, RESULT_FILE, TOKENS_FILE
from dit.sim.engine import SimConfig, SimResult
from dit.sim.replay import Replay, fitted_call_s

REPLAY_PLACEMENT: Final = "as run"  # a replay's one placement: the run's own


@dataclass(frozen=True)
class Simulated:
    """One placement's simulation: its name, the configuration and the result, and the wall time (s)."""

    placement: str
    config: SimConfig
    result: SimResult
    wall_s: float | None  # None for a replay (timed as a whole)


def _devices(config: SimConfig) -> list[dict[str, Any]]:
    return [
        {
            "name": d.name,
            "flops_per_s": d.flops_per_s,
            "memory_bytes": d.memory_bytes,
            "rtt_s": d.rtt_s,
            "bandwidth_bytes_per_s": d.bandwidth_bytes_per_s,
            "call_overhead_s": d.call_overhead_s,
            "unit_flops_per_s": list(d.unit_flops_per_s) if d.unit_flops_per_s is not None else None,
            "cpu_quota_s": d.cpu_quota_s,
            "cpu_period_s": d.cpu_period_s if d.cpu_quota_s is not None else None,
        }
        for d in config.devices
    ]


def _placement(s: Simulated) -> dict[str, Any]:
    r = s.result
    return {
        "placement": s.placement,
        "tokens": len(r.token_s),
        "simulated_s": r.total_s,
        "tokens_per_s": r.tokens_per_s,
        "token_latency_mean_s": statistics.fmean(r.token_s) if r.token_s else None,
        "migrations": [
            {"token": m.token, "moved_units": m.moved_units, "bytes": m.bytes, "seconds": m.seconds}
            for m in r.migrations
        ],
        "oom": r.oom,
        "events": r.events,
        "wall_s": s.wall_s,
        "speculated": r.speculated,
        "reexecuted": r.reexecuted,
        "control": s.config.control,
        "calls": r.calls,
        "pulls": r.pulls,
    }


def write(
    out: Path,
    runs: Sequence[Simulated],
    *,
    source: Path,
    replay: Replay | None = None,
    calibration: Path | None = None,
) -> Path:
    """Write the result directory ``out`` (created; files in it replaced) and return it."""
    if not runs:
        raise ValueError("nothing simulated")
    out.mkdir(parents=True, exist_ok=True)
    first = runs[0].config
    doc: dict[str, Any] = {
        "kind": "replay" if replay is not None else "simulation",
        "source": str(source),
        "model": first.model.name,
        "tokens": first.tokens,
        "prompt_tokens": first.prompt_tokens,
        "speculation": first.speculation,
        "replacement": first.replacement,
        "devices": _devices(first),
        "placements": [_placement(s) for s in runs],
    }
    if replay is not None:
        doc["replay"] = {
            "measured_tokens_per_s": replay.measured_tokens_per_s,
            "simulated_tokens_per_s": replay.simulated_tokens_per_s,
            "mape_percent": replay.mape_percent,
            "decode_from": replay.decode_from,
            "call_overhead_s": fitted_call_s(replay.config),
            "rates": replay.rates,
            "cpu_time": replay.cpu_time,
            "calibration": str(calibration) if calibration is not None else None,
            "speculation": replay.speculation,
            "acceptance": replay.config.acceptance[0] if replay.speculation else None,
        }
    (out / RESULT_FILE).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    measured = replay.measured_token_s if replay is not None else None
    with (out / TOKENS_FILE).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["placement", "token", "simulated_s", *(["measured_s"] if measured else [])])
        for s in runs:
            for t, seconds in enumerate(s.result.token_s):
                extra = [measured[t] if t < len(measured) else ""] if measured else []
                writer.writerow([s.placement, t, seconds, *extra])
    with (out / MEMORY_FILE).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["placement", "token", "device", "bytes"])
        for s in runs:
            for t, used in enumerate(s.result.memory):
                for device, n_bytes in used.items():
                    writer.writerow([s.placement, t, device, n_bytes])
    return out


def write_replay(out: Path, r: Replay, run_dir: Path, calibration: Path | None = None) -> Path:
    """The result directory of a replay: the run's placement, simulated beside measured."""
    return write(
        out,
        [Simulated(REPLAY_PLACEMENT, r.config, r.result, None)],
        source=run_dir,
        replay=r,
        calibration=calibration,
    )
