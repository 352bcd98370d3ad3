"""A simulation described in YAML: the model, the devices, the links, the placement (what-if studies).

::

    model: tinyllama              # a HeadSplit preset (headsplit.config.PRESETS)
    tokens: 1000                  # tokens to generate
    prompt_tokens: 8              # 0: no prefill token
    placement: greedy             # layerwise | roundrobin | greedy (HeadSplit's own code places),
                                  # or galaxy (dit.sim.galaxy: tensor parallel over every device)
    plan_tokens: 1000             # context the placement plans for (default prompt_tokens + tokens)
    replacement: true             # re-place at threshold x memory (HeadSplit's replace)
    threshold: 0.85
    speculation: true             # cross-layer speculation (next layer's heads on Z during the FFN)
    acceptance: [1.0, 0.9, 0.8]   # per layer (cycled), or one probability; seed: 0 draws them
    devices:                      # each: name, flops_per_s, memory_mb, rtt_ms, bandwidth_mbps,
      - {name: pi, count: 5, flops_per_s: 2.0e9, memory_mb: 4096, rtt_ms: 10, bandwidth_mbps: 100}
    links:                        # optional, overrides the access links between two endpoints
      - {a: pi1, b: pi2, rtt_ms: 1, bandwidth_mbps: 1000}
    control: rpc                  # dataflow (default): each stage sends its output on; rpc: as
                                  # HeadSplit's controller runs it, a round trip per stage call and per
                                  # pulled input (docs/simulator.md); head-level placements only
    worker_rtt: sum               # between two workers without a link: mean (default) of their round
                                  # trips to the controller, or sum (the controller at the hub)

A device with ``count: n`` stands for ``n`` devices named ``<name>1`` .. ``<name>n``. ``call_overhead_ms``
(default 0) is a device's fixed cost per call. ``head_flops_per_s`` (default ``flops_per_s``) is the rate
of its attention heads and their KV copies in decode steps, where a head's time is mostly per-head
dispatch (the projection and the FFN run at ``flops_per_s``); HeadSplit's greedy places with it.
Units: ms, MB (10^6 bytes), Mbit/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml

from dit.sim.engine import CONTROLLER, CONTROLS, WORKER_RTTS, Device, Link, SimConfig, SimError
from dit.sim.placement_model import (
    PRESETS,
    STRATEGIES,
    PlacementError,
    Strategy,
    WorkerSpec,
    all_units,
    place,
    worker_spec,
)

_DEVICE_KEYS = {
    "name",
    "count",
    "flops_per_s",
    "memory_mb",
    "rtt_ms",
    "bandwidth_mbps",
    "call_overhead_ms",
    "head_flops_per_s",
}
_TOP_KEYS = {
    "model",
    "tokens",
    "prompt_tokens",
    "placement",
    "plan_tokens",
    "replacement",
    "threshold",
    "devices",
    "links",
    "speculation",
    "acceptance",
    "seed",
    "control",
    "worker_rtt",
    "name",
    "description",
}


def _number(doc: Mapping[str, Any], key: str, where: str, *, default: float | None = None) -> float:
    if key not in doc:
        if default is None:
            raise SimError(f"{where}.{key}: is missing")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise SimError(f"{where}.{key}: {value!r} is not a number >= 0")
    return float(value)


def _int(doc: Mapping[str, Any], key: str, default: int | None = None, minimum: int = 0) -> int:
    value = doc.get(key, default)
    if value is None:
        raise SimError(f"{key}: is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimError(f"{key}: {value!r} is not an integer >= {minimum}")
    return value


def _unknown(doc: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(doc) - allowed)
    if extra:
        raise SimError(f"{where}{extra[0]}: unknown key; valid: {', '.join(sorted(allowed))}")


def devices_from(doc: Any) -> list[Device]:
    if not isinstance(doc, list) or not doc:
        raise SimError("devices: must be a non-empty list of devices")
    out: list[Device] = []
    for i, d in enumerate(doc):
        where = f"devices[{i}]"
        if not isinstance(d, Mapping):
            raise SimError(f"{where}: {d!r} is not a mapping")
        _unknown(d, _DEVICE_KEYS, f"{where}.")
        name = d.get("name")
        if not isinstance(name, str) or not name or name == CONTROLLER:
            raise SimError(f"{where}.name: {name!r} is not a device name (a string, not {CONTROLLER!r})")
        count = d.get("count", 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SimError(f"{where}.count: {count!r} is not an integer >= 1")
        flops = _number(d, "flops_per_s", where)
        bandwidth = _number(d, "bandwidth_mbps", where) * 1e6 / 8
        if flops <= 0 or bandwidth <= 0:
            raise SimError(f"{where}: flops_per_s and bandwidth_mbps must be > 0")
        memory = round(_number(d, "memory_mb", where) * 1e6)
        if memory <= 0:
            raise SimError(f"{where}.memory_mb: must be > 0")
        rtt = _number(d, "rtt_ms", where) / 1e3
        overhead = _number(d, "call_overhead_ms", where, default=0.0) / 1e3
        head = _number(d, "head_flops_per_s", where, default=flops)
        if head <= 0:
            raise SimError(f"{where}.head_flops_per_s: must be > 0")
        rates = (head, flops, flops) if head != flops else None
        names = [f"{name}{k + 1}" for k in range(count)] if count else [name]
        out += [Device(n, flops, memory, rtt, bandwidth, overhead, rates) for n in names]
    seen: set[str] = set()
    for d in out:
        if d.name in seen:
            raise SimError(f"devices: the name {d.name!r} is used twice")
        seen.add(d.name)
    return out


def links_from(doc: Any, names: set[str]) -> list[Link]:
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise SimError("links: must be a list of {a, b, rtt_ms, bandwidth_mbps}")
    out: list[Link] = []
    for i, k in enumerate(doc):
        where = f"links[{i}]"
        if not isinstance(k, Mapping):
            raise SimError(f"{where}: {k!r} is not a mapping")
        _unknown(k, {"a", "b", "rtt_ms", "bandwidth_mbps"}, f"{where}.")
        for end in ("a", "b"):
            if k.get(end) not in names | {CONTROLLER}:
                raise SimError(f"{where}.{end}: {k.get(end)!r} is not a device name or {CONTROLLER!r}")
        bandwidth = _number(k, "bandwidth_mbps", where) * 1e6 / 8
        if bandwidth <= 0:
            raise SimError(f"{where}.bandwidth_mbps: must be > 0")
        out.append(Link(k["a"], k["b"], _number(k, "rtt_ms", where) / 1e3, bandwidth))
    return out


def worker_specs(devices: list[Device]) -> list[WorkerSpec]:
    """The devices as HeadSplit's placement sees them."""
    return [
        worker_spec(d.name, d.memory_bytes, d.flops_per_s, round(d.rtt_s * 1e9), d.unit_flops_per_s)
        for d in devices
    ]


def config_from(doc: Any, strategy: str | None = None) -> SimConfig:
    """A :class:`SimConfig` from a parsed YAML document; :class:`SimError` names the offending field."""
    if not isinstance(doc, Mapping):
        raise SimError("the simulation file must be a mapping (model, tokens, placement, devices, ...)")
    _unknown(doc, _TOP_KEYS, "")
    model_name = doc.get("model")
    if model_name not in PRESETS:
        raise SimError(f"model: {model_name!r} is not one of {', '.join(PRESETS)}")
    model = PRESETS[str(model_name)]
    tokens = _int(doc, "tokens", minimum=1)
    prompt = _int(doc, "prompt_tokens", default=0)
    strategy = strategy or doc.get("placement", "greedy")
    if strategy not in (*STRATEGIES, "galaxy"):
        raise SimError(f"placement: {strategy!r} is not one of {', '.join(STRATEGIES)}, galaxy")
    plan = _int(doc, "plan_tokens", default=prompt + tokens, minimum=1)
    replacement = doc.get("replacement", False)
    if not isinstance(replacement, bool):
        raise SimError(f"replacement: {replacement!r} is not true or false")
    threshold = _number(doc, "threshold", "", default=0.85)
    if not 0 < threshold <= 1:
        raise SimError(f"threshold: {threshold} is not in (0, 1]")
    speculation = doc.get("speculation", False)
    if not isinstance(speculation, bool):
        raise SimError(f"speculation: {speculation!r} is not true or false")
    acceptance = doc.get("acceptance", 1.0)
    acceptance = acceptance if isinstance(acceptance, list) else [acceptance]
    if not acceptance or any(
        isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1 for a in acceptance
    ):
        raise SimError(
            f"acceptance: {doc.get('acceptance')!r} is not a probability or a list of them (per layer)"
        )
    seed = _int(doc, "seed", default=0)
    control, worker_rtt = doc.get("control", "dataflow"), doc.get("worker_rtt", "mean")
    if control not in CONTROLS:
        raise SimError(f"control: {control!r} is not one of {', '.join(CONTROLS)}")
    if worker_rtt not in WORKER_RTTS:
        raise SimError(f"worker_rtt: {worker_rtt!r} is not one of {', '.join(WORKER_RTTS)}")
    devices = devices_from(doc.get("devices"))
    links = links_from(doc.get("links"), {d.name for d in devices})
    bandwidth = min(d.bandwidth_bytes_per_s for d in devices)
    if strategy == "galaxy":  # every device in every layer (dit.sim.galaxy); no unit placement
        return SimConfig(
            model,
            devices,
            dict.fromkeys(all_units(model), devices[0].name),
            tokens,
            prompt,
            links,
            partitioning="galaxy",
            worker_rtt=worker_rtt,
        )
    try:
        placement = place(
            model,
            worker_specs(devices),
            cast("Strategy", strategy),  # checked against STRATEGIES above
            context_tokens=plan,
            bandwidth_bytes_per_s=bandwidth,
        )
    except PlacementError as exc:
        raise SimError(f"placement: {strategy} finds no placement that fits: {exc}") from None
    return SimConfig(
        model,
        devices,
        placement,
        tokens,
        prompt,
        links,
        replacement,
        threshold,
        speculation=speculation,
        acceptance=tuple(float(a) for a in acceptance),
        seed=seed,
        control=control,
        worker_rtt=worker_rtt,
    )


def load(path: Path, strategy: str | None = None) -> SimConfig:
    """The simulation file ``path``; ``strategy`` overrides its ``placement``."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SimError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SimError(f"{path}: not YAML ({exc})") from None
    try:
        return config_from(doc, strategy)
    except SimError as exc:
        raise SimError(f"{path}: {exc}") from None
