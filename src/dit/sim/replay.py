"""Replay a finished HeadSplit run in the simulator: the same model, placement, workers, links and token
count, calibrated from what the run measured, and the simulated latencies beside the measured ones.

Inputs, all from the run directory:

- ``raw/<controller>/<controller>_headsplit.json`` (HeadSplit's results, docs/headsplit.md): the model,
  the placement the run used (``placement.units``), each worker's ``flops_per_s`` and ``memory_bytes``
  as HeadSplit measured them at start, the median of its RTT samples to the controller (``rtt_ns``),
  the prompt and per-token timings;
- ``aggregate/links.csv`` when present: each worker's uplink rate (the row towards ``edge``) and, between
  two workers, the measured RTT and rate of that link.

The run is simulated as HeadSplit drove it: ``SimConfig.control`` is the results' ``control``
(``dataflow``: each stage sends its output on; a file without the field is rpc's). Under ``rpc``: one RPC round
trip per stage call (heads per worker, projection, FFN) at the worker's measured RTT, and one per input a
callee pulls from another endpoint; between two workers the sum of their round trips to the controller
(``worker_rtt = "sum"``: the controller at the hub, each worker behind its own access link, as the
emulated rack's link emulator delays them: device-to-device pings read the sum of the two
device-to-edge ones, ``aggregate/netem_check.csv``).

Calibration. Compute is a unit's FLOPs over a rate: per unit kind (head, projection, FFN) when the rates
of a profile run are known (``profile``: a layers-runtime run directory read by HeadSplit's own
``headsplit.profile_costs.read_profile``; or the replayed run's ``placement_flops_per_s`` when its
placement was costed by a profile), else HeadSplit's start-up ``flops_per_s`` for every kind. What
neither the round trips nor the FLOPs show (Python, pickling, the worker's dispatch; on a loaded machine
milliseconds) is one ``call_overhead_s`` per call, the same for every device, fitted so that the mean
simulated decode latency equals the measured one (:func:`fit_call_s`), on the replayed run itself or,
with ``calibration``, on another run. Fitted on the run itself, the MAPE measures how well the simulation
follows the token-to-token latency, not an independent prediction; fitted on another run (another
strategy or network condition), it is a prediction: the round trips are the replayed run's own
(measured), the per-call cost the other run's.

A local run under CPU quotas (``cpu_share``: ``metadata.json`` records each device's CFS quota and
period, :func:`cpu_quotas`) replayed with its own compute times: the rates are **CPU time**, one per
kind for every device, and so is the per-call cost; each device's wall time follows from its quota in
the simulation (:meth:`dit.sim.engine._Run.busy`). They are fitted together (:func:`fit_cpu_rates`)
so that the simulated stage times and mean decode latency are the run's. HeadSplit records one time
per stage, summed over layers and workers, so a rate per (device, kind) cannot be told apart within
one run: the devices differ by their quotas. A worker's round trip is then the minimum of its samples
(the others include quota waits, which the simulation adds itself).
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dit.sim.engine import CONTROLLER, Device, Link, SimConfig, SimError, SimResult, simulate, token_work
from dit.sim.placement_model import (
    PRESETS,
    ModelConfig,
    Placement,
    ProfileCosts,
    ProfileError,
    model_from_json,
    placement_from_json,
    read_profile,
    unit,
)

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
    rates: str = "micro-benchmark"  # where the compute rates came from
    rates_by_host: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)  # (head, proj, ffn)
    # the rates and the per-call cost are CPU time, each device's wall time through its CPU quota (a
    # local run's cpu_share, :func:`cpu_quotas`); False: wall-time rates, no quota simulated
    cpu_time: bool = False
    # the controller's compute per decode token the simulation charged (s; a dataflow run's mean)
    controller_s: float = 0.0

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
        return model_from_json(dict(model))  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise SimError(f"{file}: model: not a HeadSplit model ({exc})") from None


def _links(run_dir: Path, host_of: Mapping[str, str]) -> tuple[dict[str, float], dict[frozenset[str], float]]:
    """Each worker's uplink rate and the measured rate between two workers (bytes/s), from links.csv
    (its round trips are pings; a call's round trip is the RPC's, measured by HeadSplit)."""
    path = run_dir / "aggregate" / "links.csv"
    rates: dict[str, float] = {}
    pairs: dict[frozenset[str], float] = {}
    if not path.is_file():
        return rates, pairs
    worker_of = {h: w for w, h in host_of.items()}
    with path.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            w, target = worker_of.get(row.get("device", "")), row.get("target", "")
            rate = float(row["rate_bps"]) / 8 if row.get("rate_bps") else 0.0
            if w is None or rate <= 0:
                continue
            if target == "edge":
                rates[w] = rate
            elif target in worker_of:
                pairs[frozenset((w, worker_of[target]))] = rate
    return rates, pairs


def _unit_rates(
    doc: Mapping[str, Any], file: Path, profile: ProfileCosts | None
) -> tuple[dict[str, tuple[float, float, float]], str]:
    """(head, proj, ffn) FLOP/s per worker and where they came from: the profile run ``profile`` (by the
    worker's host), else the run's own placement rates when a profile costed its placement, else none."""
    workers = doc.get("workers") or []
    if profile is not None:
        out = {}
        for i, w in enumerate(workers):
            host = str(w.get("host", w["name"]))
            if host not in profile.devices:
                raise SimError(
                    f"--profile: {profile.path} has no rates of workers[{i}].host {host!r} "
                    f"(profiled: {', '.join(profile.devices)})"
                )
            out[str(w["name"])] = profile.rates(host)
        return out, f"profile {profile.path}"
    costs = (doc.get("placement") or {}).get("costs") or {}
    if costs.get("source") != "profile":
        return {}, "micro-benchmark"
    out = {}
    for i, w in enumerate(workers):
        rates = w.get("placement_flops_per_s")
        try:
            out[str(w["name"])] = (float(rates["head"]), float(rates["proj"]), float(rates["ffn"]))
        except (KeyError, TypeError, ValueError):
            raise SimError(
                f"{file}: workers[{i}].placement_flops_per_s: expected head, proj, ffn rates"
            ) from None
    return out, f"profile {costs.get('path') or 'of the run placement_profile'}"


def _stage_work(
    doc: Mapping[str, Any], model: ModelConfig, placement: Placement
) -> list[tuple[int, tuple[float, float, float], tuple[int, int, int]]] | None:
    """Per decode token: its position in ``tokens``, the FLOPs of the units HeadSplit timed per stage
    kind (heads, projections, FFNs: :func:`stage_rates`) and the compute time it recorded for them (ns).
    None when the run recorded no compute times."""
    prompt = int(doc.get("prompt_tokens") or 0)
    stage_groups = []
    for layer in range(model.n_layers):
        count: dict[str, list[int]] = {}
        for h in range(model.n_heads):
            count.setdefault(placement[unit(layer, "head", h)], []).append(h)
        stage_groups.append([(len(hs), len({model.kv_head_of(h) for h in hs})) for hs in count.values()])
    first = 1 if prompt > 0 else 0
    out = []
    for i, t in enumerate((doc.get("tokens") or [])[first:], start=first):
        try:
            ns = [
                int(t[k]) for k in ("attention_ns", "reexec_ns", "speculative_ns", "projection_ns", "ffn_ns")
            ]
        except (KeyError, TypeError, ValueError):
            return None
        context = prompt + int(t.get("index", 0)) if prompt > 0 else int(t.get("index", 0)) + 1
        work = token_work(model, context, 1)
        # every heads stage: each layer's, and the early one of each speculated transition l -> l + 1
        stages = list(range(model.n_layers)) + [int(layer) + 1 for layer in t.get("speculated") or []]
        heads_f = sum(
            max(n * work.head_flops + g * work.kv_flops for n, g in stage_groups[layer]) for layer in stages
        )
        flops = (heads_f, model.n_layers * work.proj_flops, model.n_layers * work.ffn_flops)
        out.append((i, flops, (sum(ns[:3]), ns[3], ns[4])))
    return out


def token_rates(
    doc: Mapping[str, Any], model: ModelConfig, placement: Placement
) -> list[tuple[float, float, float] | None] | None:
    """Per token (index as ``tokens``; None for the prefill and where a stage recorded no time) the
    (head, proj, ffn) FLOP/s of that token's own compute times (:func:`stage_rates` over one token):
    a replay with ``--rates trace`` runs each decode step at the speed the run computed it. None when
    the run recorded no compute times."""
    work = _stage_work(doc, model, placement)
    if work is None:
        return None
    out: list[tuple[float, float, float] | None] = [None] * len(doc.get("tokens") or [])
    for i, flops, ns in work:
        if min(ns) > 0:
            out[i] = (flops[0] / ns[0] * 1e9, flops[1] / ns[1] * 1e9, flops[2] / ns[2] * 1e9)
    return out


def stage_rates(
    doc: Mapping[str, Any], model: ModelConfig, placement: Placement
) -> tuple[float, float, float] | None:
    """(head, proj, ffn) FLOP/s the run itself measured: over its decode tokens, the FLOPs of the units
    HeadSplit timed over the compute time it recorded (``attention_ns`` + ``reexec_ns`` +
    ``speculative_ns``: per heads stage the slowest worker's compute, so the FLOPs of the worker with the
    most; ``projection_ns``, ``ffn_ns``). HeadSplit records one time per stage, not per worker: the rates
    are the same on every worker. None when the run recorded no compute times."""
    work = _stage_work(doc, model, placement)
    if work is None:
        return None
    flops = [sum(f[k] for _, f, _ in work) for k in range(3)]
    ns = [sum(n[k] for _, _, n in work) for k in range(3)]
    if min(ns) <= 0:
        return None
    return flops[0] / ns[0] * 1e9, flops[1] / ns[1] * 1e9, flops[2] / ns[2] * 1e9


def cpu_quotas(run_dir: Path, host_of: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """Each worker's CFS CPU quota and period (s) as the run applied them (a ``cpu_share`` condition,
    ``metadata.json`` ``conditions.<host>.cpu_share.cgroup_cpu_quota_us`` / ``cgroup_cpu_period_us``);
    empty when the run recorded none (the emulated rack's quotas are the rack's, not the run's)."""
    path = run_dir / "metadata.json"
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SimError(f"{path}: cannot be read as JSON ({exc})") from None
    conditions = doc.get("conditions") if isinstance(doc, Mapping) else None
    out: dict[str, tuple[float, float]] = {}
    for worker, host in host_of.items():
        entry = conditions.get(host) if isinstance(conditions, Mapping) else None
        share = entry.get("cpu_share") if isinstance(entry, Mapping) else None
        if not isinstance(share, Mapping):
            continue
        field_ = f"conditions.{host}.cpu_share"
        try:
            quota, period = float(share["cgroup_cpu_quota_us"]), float(share["cgroup_cpu_period_us"])
        except (KeyError, TypeError, ValueError):
            raise SimError(
                f"{path}: {field_}: expected numbers cgroup_cpu_quota_us and cgroup_cpu_period_us"
            ) from None
        if not 0 < quota <= period:
            raise SimError(f"{path}: {field_}.cgroup_cpu_quota_us: {quota} is not in (0, period {period}]")
        out[worker] = (quota / 1e6, period / 1e6)
    return out


def stage_times(doc: Mapping[str, Any]) -> list[tuple[float, float, float]]:
    """Per decode token the compute time HeadSplit recorded per stage kind (s): heads (``attention_ns``
    + ``reexec_ns`` + ``speculative_ns``), ``projection_ns``, ``ffn_ns``; empty when it recorded none."""
    prompt = int(doc.get("prompt_tokens") or 0)
    out = []
    for t in (doc.get("tokens") or [])[1 if prompt > 0 else 0 :]:
        try:
            ns = [
                int(t[k]) for k in ("attention_ns", "reexec_ns", "speculative_ns", "projection_ns", "ffn_ns")
            ]
        except (KeyError, TypeError, ValueError):
            return []
        out.append((sum(ns[:3]) / 1e9, ns[3] / 1e9, ns[4] / 1e9))
    return out


def _with(config: SimConfig, rates: tuple[float, float, float], call_s: float) -> SimConfig:
    return replace(
        config, devices=[replace(d, unit_flops_per_s=rates, call_overhead_s=call_s) for d in config.devices]
    )


def fit_cpu_rates(
    config: SimConfig,
    measured_s: list[float],
    decode_from: int,
    stages: list[tuple[float, float, float]],
    start: tuple[float, float, float],
    rounds: int = 30,
) -> tuple[tuple[float, float, float], float]:
    """The CPU-time rates per kind (head, proj, ffn; the same on every device) and the per-call CPU
    cost with which the simulation, each device through its quota (``config``'s devices), reproduces
    the run's mean compute time per stage kind (``stages``, :func:`stage_times`) and its mean decode
    latency. Alternates: the call cost for the latency (:func:`fit_call_s`), then each rate scaled by
    simulated over measured stage time, until the rates move by less than 0.01 %."""
    target = [statistics.fmean(s[k] for s in stages) for k in range(3)]
    rates, call_s = start, 0.0
    for _ in range(rounds):
        call_s = fit_call_s(_with(config, rates, 0.0), measured_s, decode_from)
        run = simulate(_with(config, rates, call_s))
        simulated = [statistics.fmean(s[k] for s in run.stage_s[decode_from:]) for k in range(3)]
        ratio = [sim / meas if meas > 0 else 1.0 for sim, meas in zip(simulated, target, strict=True)]
        rates = (rates[0] * ratio[0], rates[1] * ratio[1], rates[2] * ratio[2])
        if max(abs(r - 1) for r in ratio) < 1e-4:
            break
    return rates, fit_call_s(_with(config, rates, 0.0), measured_s, decode_from)


def load_profile(path: Path) -> ProfileCosts:
    """The per-kind rates of a layers-runtime profile run (HeadSplit's reader); SimError if unusable."""
    try:
        return read_profile(path)
    except ProfileError as exc:
        raise SimError(f"--profile: {exc}") from None


RATES = ("auto", "profile", "compute", "benchmark", "trace")


def send_delays(run_dir: Path, host_of: Mapping[str, str]) -> dict[str, float] | None:
    """Each worker's one-way delay on what it sends (s), as the run measured its links: the ping from
    the device to the edge (``aggregate/netem_check.csv``, ``measured_rtt_ms`` less the unshaped
    ``baseline_rtt_ms``; the edge's own replies are not delayed, so the round trip is the device's
    egress delay); 0 for a device without such a row (no delay applied). None when the run has no
    ``netem_check.csv`` (a run of before it, or a file the simulator wrote)."""
    path = run_dir / "aggregate" / "netem_check.csv"
    if not path.is_file():
        return None
    worker_of = {h: w for w, h in host_of.items()}
    out = dict.fromkeys(host_of, 0.0)
    with path.open(encoding="utf-8") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            w = worker_of.get(row.get("device", ""))
            if w is None or row.get("target") != "edge":
                continue
            try:
                rtt, base = float(row["measured_rtt_ms"]), float(row.get("baseline_rtt_ms") or 0.0)
            except (KeyError, TypeError, ValueError):
                raise SimError(
                    f"{path}: row {i + 1} (device {row.get('device')!r}): measured_rtt_ms and "
                    "baseline_rtt_ms must be numbers"
                ) from None
            out[w] = max(rtt - base, 0.0) / 1e3
    return out


def controller_times(doc: Mapping[str, Any]) -> list[float]:
    """Per token the controller's own compute (s): HeadSplit's ``controller_ns`` (embedding and LM
    head), 0 where the token does not record it."""
    out = []
    for t in doc.get("tokens") or []:
        try:
            out.append(int(t.get("controller_ns") or 0) / 1e9)
        except (TypeError, ValueError):
            out.append(0.0)
    return out


def replay(
    run_dir: Path, calibration: Path | None = None, profile: Path | None = None, rates: str = "auto"
) -> Replay:
    """Simulate the HeadSplit run in ``run_dir`` as it ran; :class:`SimError` says what is missing.

    The per-call cost is fitted on ``run_dir`` itself, or on the run ``calibration`` when given (then the
    MAPE is a prediction: nothing of ``run_dir``'s timings went into the simulation). ``profile``: a
    profile run whose per-kind rates cost the units (of both runs). ``rates``: where the compute rates
    come from (:func:`_own_rates`): ``auto`` a profile's when there is one, else the run's compute times;
    or only ``profile``, ``compute`` or ``benchmark`` (HeadSplit's start-up ``flops_per_s``); or
    ``trace``: each decode step at the speed the replayed run computed that token (:func:`token_rates`,
    with a calibration run too: then only the per-call cost is the other run's).

    A dataflow run is simulated as its messages travelled: each push costs its sender's measured
    one-way delay (:func:`send_delays`; the controller's 0) where the run measured its links, and the
    controller's own compute (``controller_ns``) is on every token's path: each token's under
    ``trace``, else the decode tokens' mean (the calibration run's for a prediction)."""
    if rates not in RATES:
        raise SimError(f"--rates: one of {', '.join(RATES)}, got {rates!r}")
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
    try:
        placement = placement_from_json(model, doc["placement"]["units"], list(host_of))
    except (KeyError, TypeError, ValueError) as exc:
        raise SimError(f"{file}: placement.units: {exc}") from None
    cal = replay(calibration, profile=profile, rates=rates) if calibration is not None else None
    quotas = cpu_quotas(run_dir, host_of)
    control = str(doc.get("control") or "rpc")  # a results file of before dataflow control was rpc's
    prompt = int(doc.get("prompt_tokens") or 0)
    decode_from = 1 if prompt > 0 else 0
    traced: list[tuple[float, float, float] | None] = []
    if rates == "trace":
        # the run's own compute, token by token: its wall times, CPU quota waits included (no quota
        # simulated); a calibration run gives only the per-call cost
        per_token = token_rates(doc, model, placement)
        mean = stage_rates(doc, model, placement)
        if per_token is None or mean is None:
            raise SimError(f"--rates trace: {file} has no compute times (tokens[].attention_ns ...)")
        traced = per_token
        by_host = dict.fromkeys(host_of.values(), mean)
        rates_from, cpu_time = f"each token's own compute times of {run_dir.name}", False
    elif cal is not None:
        # a prediction: the calibration run's rates and per-call cost, nothing of this run's timings
        missing = [h for h in host_of.values() if h not in cal.rates_by_host]
        if missing and cal.rates_by_host:
            raise SimError(f"--calibration: {calibration} has no rates of {', '.join(missing)}")
        by_host, rates_from = dict(cal.rates_by_host), f"{cal.rates}, the calibration run's"
        cpu_time = cal.cpu_time
        if cpu_time and not quotas:
            rates_from += " (this run records no CPU quota: its devices run them as wall time)"
    else:
        by_host, rates_from = _own_rates(doc, file, model, placement, host_of, profile, rates)
        # the run's own compute times under CPU quotas: fitted as CPU time, through each quota
        cpu_time = bool(quotas) and rates_from.startswith("the compute times of ")
    if not cpu_time:
        quotas = {}
    # dataflow: each push at its sender's measured delay, the controller's compute on the token's path
    delays = send_delays(run_dir, host_of) if control == "dataflow" else None
    controller_s: list[float] = []
    if control == "dataflow":
        own = controller_times(doc)
        if rates == "trace":
            controller_s = own
        else:
            decode = own[decode_from:] if cal is None else [cal.controller_s]
            controller_s = [statistics.fmean(decode) if decode else 0.0] * len(tokens)
    uplink, pair_rates = _links(run_dir, host_of)
    devices = [
        Device(
            name=str(w["name"]),
            flops_per_s=float(w["flops_per_s"]),
            memory_bytes=int(w.get("memory_bytes") or w.get("memory_limit_bytes") or 1 << 40),
            rtt_s=_rtt_s(w.get("rtt_ns"), str(w["name"]) in quotas),
            bandwidth_bytes_per_s=uplink.get(str(w["name"]), DEFAULT_BANDWIDTH_BYTES_PER_S),
            unit_flops_per_s=by_host.get(host_of[str(w["name"])]),
            cpu_quota_s=quotas[str(w["name"])][0] if str(w["name"]) in quotas else None,
            cpu_period_s=quotas[str(w["name"])][1] if str(w["name"]) in quotas else 0.0,
            send_s=delays.get(str(w["name"]), 0.0) if delays is not None else None,
        )
        for w in workers
    ]
    # a pull between two workers: the two access links' round trips; links.csv's rate where measured
    links = [
        Link(a.name, b.name, a.rtt_s + b.rtt_s, pair_rates[frozenset((a.name, b.name))])
        for i, a in enumerate(devices)
        for b in devices[i + 1 :]
        if frozenset((a.name, b.name)) in pair_rates
    ]
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
        control=control,
        worker_rtt="sum",
        controller_send_s=0.0 if delays is not None else None,
        controller_s=controller_s,
        token_rates=traced,
    )
    first = simulate(base)
    if first.oom and len(first.token_s) <= decode_from < len(tokens):
        pressure = (doc.get("memory_pressure") or {}) if isinstance(doc.get("memory_pressure"), dict) else {}
        raise SimError(
            f"{run_dir}: the simulation runs out of memory before the first decoded token ({first.oom}) while "
            f"the run generated {len(tokens)} tokens"
            + (
                ": its memory limits are the runtime's emulated pressure (runtime.memory_pressure), which "
                "the replay does not model"
                if pressure
                else ""
            )
        )
    if cal is not None:
        overhead = fitted_call_s(cal.config)
    elif cpu_time:
        start = next(iter(by_host.values()))
        stages = stage_times(doc)
        rates_cpu, overhead = fit_cpu_rates(base, measured, decode_from, stages, start)
        by_host = dict.fromkeys(host_of.values(), rates_cpu)
        base = replace(base, devices=[replace(d, unit_flops_per_s=rates_cpu) for d in devices])
        rates_from += " as CPU time, each device through its CPU quota"
    else:
        overhead = fit_call_s(base, measured, decode_from)
    config = replace(base, devices=[replace(d, call_overhead_s=overhead) for d in base.devices])
    result = simulate(config)
    wall = (
        (int(doc["end_ns"]) - int(doc["start_ns"])) / 1e9
        if "end_ns" in doc and "start_ns" in doc
        else sum(measured)
    )
    return Replay(
        config,
        result,
        measured,
        len(tokens) / wall if wall > 0 else 0.0,
        decode_from,
        speculation,
        rates_from,
        by_host,
        cpu_time,
        statistics.fmean(controller_s[decode_from:]) if controller_s[decode_from:] else 0.0,
    )


def _own_rates(
    doc: Mapping[str, Any],
    file: Path,
    model: ModelConfig,
    placement: Placement,
    host_of: Mapping[str, str],
    profile: Path | None,
    which: str = "auto",
) -> tuple[dict[str, tuple[float, float, float]], str]:
    """Per host (head, proj, ffn) FLOP/s for replaying the run itself, and where they came from. ``auto``:
    a profile run's (``profile``, or the one that costed the run's placement), else the compute times
    the run recorded (:func:`stage_rates`), else none (the micro-benchmark's ``flops_per_s``); the
    other choices take only that source (``profile`` fails without one)."""
    if which in ("auto", "profile"):
        by_worker, source = _unit_rates(doc, file, load_profile(profile) if profile is not None else None)
        if by_worker:
            return {host_of[w]: r for w, r in by_worker.items()}, source
        if which == "profile":
            raise SimError(
                f"--rates profile: give --profile RUN_DIR ({file} was not costed by a profile run)"
            )
    if which in ("auto", "compute"):
        measured = stage_rates(doc, model, placement)
        if measured is not None:
            source = f"the compute times of {file.parent.parent.parent.name}"
            return dict.fromkeys(host_of.values(), measured), source
        if which == "compute":
            raise SimError(f"--rates compute: {file} has no compute times (tokens[].attention_ns ...)")
    return {}, "micro-benchmark"


def _rtt_s(samples: Any, quota: bool) -> float:
    """A worker's round trip to the controller (s) from HeadSplit's samples: their median; under a
    simulated CPU quota their minimum (a sample that waited for the quota would count the wait twice:
    the simulation adds it; local runs' loopback round trips are otherwise steady)."""
    if not samples:
        return 0.0
    return float(min(samples) if quota else statistics.median(samples)) / 1e9


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

    The simulated latency grows with the cost (every call on the critical path pays it once), linearly
    while the critical path stays the same: a line through two simulations, then regula falsi (Illinois)
    between a cost too low and one too high where calls in parallel change the path."""
    decode = measured_s[decode_from:]
    if not decode:
        return 0.0
    target = statistics.fmean(decode)

    def error(cost: float) -> float:
        run = simulate(replace(config, devices=[replace(d, call_overhead_s=cost) for d in config.devices]))
        return statistics.fmean(run.token_s[decode_from:]) - target

    lo, e_lo = 0.0, error(0.0)
    if e_lo >= 0:
        return 0.0
    probe = 1e-3
    slope = (error(probe) - e_lo) / probe
    if slope <= 0:
        return 0.0
    hi = -e_lo / slope
    e_hi = error(hi)
    while e_hi < 0:  # the path changed: a slower growth than the first probe's
        lo, e_lo, hi = hi, e_hi, 2 * hi
        e_hi = error(hi)
    tolerance, side = 1e-9 * target, 0
    if e_hi <= tolerance:
        return hi
    for _ in range(60):
        cost = (lo * e_hi - hi * e_lo) / (e_hi - e_lo)
        e = error(cost)
        if abs(e) <= tolerance:
            return cost
        if e > 0:
            hi, e_hi = cost, e
            if side == 1:
                e_lo /= 2
            side = 1
        else:
            lo, e_lo = cost, e
            if side == -1:
                e_hi /= 2
            side = -1
    return (lo + hi) / 2


def per_device_lines(r: Replay) -> list[str]:
    """Each device's CPU quota and, over the simulated decode steps, its rate per kind and cost per
    call (wall time, through the quota), and how they were derived."""
    cpu = next((d.unit_flops_per_s for d in r.config.devices if d.unit_flops_per_s), None)
    rates = ", ".join(f"{x / 1e9:.3f}" for x in cpu) if cpu else "-"
    out = [
        f"CPU-time rates (head, proj, ffn) {rates} GFLOP/s and per-call cost {fitted_call_s(r.config) * 1e3:.3f} ms, "
        "the same on every device (the run records one compute time per stage, summed over layers and "
        "workers, not one per device); each device's wall time through its CPU quota (metadata.json "
        "conditions.<host>.cpu_share), per device over the simulated decode steps (wall):"
    ]
    for d in r.config.devices:
        quota = (
            f"quota {d.cpu_quota_s * 1e3:.2f} ms / {d.cpu_period_s * 1e3:.2f} ms"
            if d.cpu_quota_s is not None
            else "no quota"
        )
        per_kind = []
        for kind in ("head", "proj", "ffn"):
            flops, seconds = r.result.work.get((d.name, kind), (0.0, 0.0))
            per_kind.append(f"{flops / seconds / 1e9:.3f}" if seconds > 0 else "-")
        calls, seconds = r.result.work.get((d.name, "call"), (0.0, 0.0))
        call = f"{1e3 * seconds / calls:.2f} ms a call" if calls else "no call"
        out.append(f"  {d.name:<10} {quota}: {', '.join(per_kind)} GFLOP/s, {call}")
    out.append(
        "  (-: no unit of that kind on the device here; it would run at the kind's CPU rate through the quota)"
    )
    return out


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
    if r.config.control == "dataflow":
        crit = r.result.critical_messages[r.decode_from :]
        sends = sorted({d.send_s for d in r.config.devices if d.send_s is not None})
        lines.append(
            f"messages {r.result.messages}, {statistics.fmean(crit) if crit else 0:.1f} a decode token on its "
            f"critical path (each one way: "
            + (
                f"its sender's measured delay, {', '.join(f'{1e3 * x:.2f}' for x in sends)} ms from the workers, "
                "0 from the controller"
                if sends
                else "half the round trip"
            )
            + f"); the controller's own compute {1e3 * r.controller_s:.2f} ms a decode token; compute rates: {r.rates}"
        )
    else:
        lines.append(
            f"calls {r.result.calls}, pulls {r.result.pulls} (each an RPC round trip); compute rates: {r.rates}"
        )
    if r.cpu_time:
        lines += per_device_lines(r)
    if r.speculation:
        lines.append(
            f"speculation: every layer speculated, kept with the run's acceptance {r.config.acceptance[0]:.2f}"
            " (the run may speculate fewer layers)"
        )
    if r.result.oom:
        lines.append(f"simulated out of memory: {r.result.oom}")
    return "\n".join(lines)


__all__ = ["CONTROLLER", "Replay", "format_replay", "replay", "results_file"]
