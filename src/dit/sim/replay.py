"""Replay a finished HeadSplit run in the simulator: the same model, placement, workers, links and token
count, calibrated from what the run measured, and the simulated latencies beside the measured ones.

Inputs, all from the run directory:

- ``raw/<controller>/<controller>_headsplit.json`` (HeadSplit's results, docs/headsplit.md): the model,
  the placement the run used (``placement.units``), each worker's ``flops_per_s`` and ``memory_bytes``
  as HeadSplit measured them at start, the median of its RTT samples to the controller (``rtt_ns``),
  the prompt and per-token timings;
- ``aggregate/links.csv`` when present: each worker's uplink rate (the row towards ``edge``) and, between
  two workers, the measured RTT and rate of that link.

Calibration. HeadSplit's ``flops_per_s`` is a matmul micro-benchmark; a call of a small unit also pays a
fixed cost (Python, the RPC handler) that FLOPs do not show. One ``call_overhead_s`` for every device is
fitted from the run's own ``ffn_ns`` (the FFN workers' compute, summed over layers): the mean, over the
decode tokens, of (measured - FLOPs / flops_per_s) per FFN call, at least 0. The per-token latencies the
simulation is then compared with include everything else (attention, links, gather) uncalibrated.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.sim._headsplit import PRESETS, ModelConfig, Unit, placement_from_json, unit_flops
from dit.sim.engine import CONTROLLER, Device, Link, SimConfig, SimError, SimResult, simulate

DEFAULT_BANDWIDTH_BYTES_PER_S = (
    125e6  # 1 Gbit/s: where links.csv gives no rate (local mode's loopback is faster)
)


@dataclass(frozen=True)
class Replay:
    config: SimConfig
    result: SimResult
    measured_token_s: list[float]
    measured_tokens_per_s: float
    decode_from: int  # the first decode token (1 when token 0 is the prefill)

    @property
    def simulated_tokens_per_s(self) -> float:
        return self.result.tokens_per_s

    @property
    def mape_percent(self) -> float:
        """Mean absolute percentage error of the simulated per-token latency, decode tokens only."""
        pairs = list(
            zip(
                self.result.token_s[self.decode_from :],
                self.measured_token_s[self.decode_from :],
                strict=False,
            )
        )
        pairs = [(s, m) for s, m in pairs if m > 0]
        if not pairs:
            raise SimError("the run has no decode token to compare with")
        return 100 * statistics.fmean(abs(s - m) / m for s, m in pairs)


def results_file(run_dir: Path) -> Path:
    found = sorted(run_dir.glob("raw/*/*_headsplit.json"))
    if not found:
        raise SimError(
            f"{run_dir}: no raw/<controller>/<controller>_headsplit.json: not a finished HeadSplit run directory"
        )
    return found[0]


def _model(doc: Mapping[str, Any], file: Path) -> ModelConfig:
    model = doc.get("model")
    if isinstance(model, Mapping) and "preset" in model:
        name = model["preset"]
        if name not in PRESETS:
            raise SimError(f"{file}: model.preset: {name!r} is not one of {', '.join(PRESETS)}")
        return PRESETS[name]
    try:
        return ModelConfig.from_json(dict(model))  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise SimError(f"{file}: model: not a HeadSplit model ({exc})") from None


def _links(run_dir: Path, host_of: Mapping[str, str]) -> tuple[dict[str, float], list[Link]]:
    """Each worker's uplink rate (bytes/s) and the measured worker-to-worker links, from links.csv."""
    path = run_dir / "aggregate" / "links.csv"
    rates: dict[str, float] = {}
    links: list[Link] = []
    if not path.is_file():
        return rates, links
    worker_of = {h: w for w, h in host_of.items()}
    with path.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            w, target = worker_of.get(row.get("device", "")), row.get("target", "")
            rate = float(row["rate_bps"]) / 8 if row.get("rate_bps") else 0.0
            if w is None:
                continue
            if target == "edge" and rate > 0:
                rates[w] = rate
            elif target in worker_of and row.get("rtt_ns_mean") and rate > 0:
                links.append(Link(w, worker_of[target], float(row["rtt_ns_mean"]) / 1e9, rate))
    return rates, links


def replay(run_dir: Path) -> Replay:
    """Simulate the HeadSplit run in ``run_dir`` as it ran; :class:`SimError` says what is missing."""
    file = results_file(run_dir)
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SimError(f"{file}: cannot be read as JSON ({exc})") from None
    model = _model(doc, file)
    workers = doc.get("workers") or []
    tokens = doc.get("tokens") or []
    if not workers or not tokens:
        raise SimError(f"{file}: workers and tokens must be non-empty (the run generated nothing)")
    if doc.get("speculation"):
        raise SimError(
            f"{file}: speculation: the simulator does not model speculation yet; replay a run without it"
        )
    host_of = {str(w["name"]): str(w.get("host", w["name"])) for w in workers}
    rates, links = _links(run_dir, host_of)
    devices = [
        Device(
            name=str(w["name"]),
            flops_per_s=float(w["flops_per_s"]),
            memory_bytes=int(w.get("memory_bytes") or w.get("memory_limit_bytes") or 1 << 40),
            rtt_s=statistics.median(w["rtt_ns"]) / 1e9 if w.get("rtt_ns") else 0.0,
            bandwidth_bytes_per_s=rates.get(str(w["name"]), DEFAULT_BANDWIDTH_BYTES_PER_S),
        )
        for w in workers
    ]
    try:
        placement = placement_from_json(model, doc["placement"]["units"], [d.name for d in devices])
    except (KeyError, TypeError, ValueError) as exc:
        raise SimError(f"{file}: placement.units: {exc}") from None
    prompt = int(doc.get("prompt_tokens") or 0)
    decode_from = 1 if prompt > 0 else 0
    measured = [int(t["total_ns"]) / 1e9 for t in tokens]
    overhead = _ffn_overhead_s(model, devices, placement, tokens[decode_from:], prompt)
    devices = [
        Device(d.name, d.flops_per_s, d.memory_bytes, d.rtt_s, d.bandwidth_bytes_per_s, overhead)
        for d in devices
    ]
    config = SimConfig(model, devices, placement, len(tokens), prompt, links)
    result = simulate(config)
    wall = (
        (int(doc["end_ns"]) - int(doc["start_ns"])) / 1e9
        if "end_ns" in doc and "start_ns" in doc
        else sum(measured)
    )
    return Replay(config, result, measured, len(tokens) / wall if wall > 0 else 0.0, decode_from)


def _ffn_overhead_s(
    model: ModelConfig, devices: list[Device], placement: Mapping[Unit, str], tokens: list[Any], prompt: int
) -> float:
    speed = {d.name: d.flops_per_s for d in devices}
    per_token_flops_s = sum(
        unit_flops(model, Unit(layer, "ffn"), 1) / speed[placement[Unit(layer, "ffn")]]
        for layer in range(model.n_layers)
    )
    excess = [
        (int(t["ffn_ns"]) / 1e9 - per_token_flops_s) / model.n_layers
        for t in tokens
        if t.get("ffn_ns") is not None
    ]
    return max(statistics.fmean(excess), 0.0) if excess else 0.0


def format_replay(r: Replay) -> str:
    """What ``dit simulate --replay`` prints: per-token latency and tokens/s, simulated beside measured."""
    dec_sim = r.result.token_s[r.decode_from :]
    dec_meas = r.measured_token_s[r.decode_from :]
    overhead_ms = r.config.devices[0].call_overhead_s * 1e3
    lines = [
        f"model {r.config.model.name}, {len(r.config.devices)} workers, {len(r.result.token_s)} tokens "
        f"(prompt {r.config.prompt_tokens}), fitted call overhead {overhead_ms:.3f} ms",
        f"{'':24}{'simulated':>12}{'measured':>12}",
        f"{'tokens/s':24}{r.simulated_tokens_per_s:12.2f}{r.measured_tokens_per_s:12.2f}",
        f"{'decode latency mean ms':24}{1e3 * statistics.fmean(dec_sim):12.2f}{1e3 * statistics.fmean(dec_meas):12.2f}"
        if dec_sim and dec_meas
        else "no decode token",
        f"MAPE {r.mape_percent:.1f} %",
    ]
    if r.result.oom:
        lines.append(f"simulated out of memory: {r.result.oom}")
    return "\n".join(lines)


__all__ = ["CONTROLLER", "Replay", "format_replay", "replay", "results_file"]
