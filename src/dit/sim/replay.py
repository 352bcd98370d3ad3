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
fixed cost (Python, torch RPC, on a loaded machine several milliseconds) that FLOPs do not show. One
``call_overhead_s`` for every device is fitted so that the mean simulated decode latency equals the
measured one (:func:`fit_call_s`), on the replayed run itself or, with ``calibration``, on another run.
Fitted on the run itself, the MAPE measures how well the simulation follows the token-to-token latency
(context growth, links), not an independent prediction; fitted on another run (another strategy or
network condition), it is a prediction.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dit.sim._headsplit import PRESETS, ModelConfig, placement_from_json
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
    speculation: bool = False  # the run speculated

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


def replay(run_dir: Path, calibration: Path | None = None) -> Replay:
    """Simulate the HeadSplit run in ``run_dir`` as it ran; :class:`SimError` says what is missing.

    The per-call cost is fitted on ``run_dir`` itself, or on the run ``calibration`` when given (then the
    MAPE is a prediction: nothing of ``run_dir``'s timings went into the simulation)."""
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
    speculation = bool(doc.get("speculation"))
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
    base = SimConfig(
        model,
        devices,
        placement,
        len(tokens),
        prompt,
        links,
        speculation=speculation,
        acceptance=(_acceptance(tokens),),
    )
    overhead = (
        fitted_call_s(replay(calibration).config)
        if calibration is not None
        else fit_call_s(base, measured, decode_from)
    )
    config = replace(base, devices=[replace(d, call_overhead_s=overhead) for d in devices])
    result = simulate(config)
    wall = (
        (int(doc["end_ns"]) - int(doc["start_ns"])) / 1e9
        if "end_ns" in doc and "start_ns" in doc
        else sum(measured)
    )
    return Replay(config, result, measured, len(tokens) / wall if wall > 0 else 0.0, decode_from, speculation)


def _acceptance(tokens: list[Any]) -> float:
    """The run's share of speculated layers that were kept (1 when it never speculated)."""
    speculated = sum(len(t.get("speculated") or []) for t in tokens)
    accepted = sum(len(t.get("accepted") or []) for t in tokens)
    return accepted / speculated if speculated else 1.0


def fitted_call_s(config: SimConfig) -> float:
    """The per-call cost a replay fitted (the same on every device)."""
    return config.devices[0].call_overhead_s if config.devices else 0.0


def fit_call_s(config: SimConfig, measured_s: list[float], decode_from: int) -> float:
    """The per-call cost that makes the mean simulated decode latency the measured one (at least 0).

    The simulated latency is linear in the cost (every call on the critical path pays it once): two
    simulations give its intercept and slope."""
    decode = measured_s[decode_from:]
    if not decode:
        return 0.0
    probe = 1e-3
    runs = [
        simulate(replace(config, devices=[replace(d, call_overhead_s=c) for d in config.devices]))
        for c in (0.0, probe)
    ]
    s0, s1 = (statistics.fmean(r.token_s[decode_from:]) for r in runs)
    slope = (s1 - s0) / probe
    return max((statistics.fmean(decode) - s0) / slope, 0.0) if slope > 0 else 0.0


def format_replay(r: Replay) -> str:
    """What ``dit simulate --replay`` prints: per-token latency and tokens/s, simulated beside measured."""
    dec_sim = r.result.token_s[r.decode_from :]
    dec_meas = r.measured_token_s[r.decode_from :]
    overhead_ms = fitted_call_s(r.config) * 1e3
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
    if r.speculation:
        lines.append(
            f"speculation: every layer speculated, kept with the run's acceptance {r.config.acceptance[0]:.2f}"
            " (the run may speculate fewer layers)"
        )
    if r.result.oom:
        lines.append(f"simulated out of memory: {r.result.oom}")
    return "\n".join(lines)


__all__ = ["CONTROLLER", "Replay", "format_replay", "replay", "results_file"]
