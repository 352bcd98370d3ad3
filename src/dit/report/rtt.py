"""Tokens/s against the added RTT, one series per runtime variant, from a sweep's finished runs.

The figures of ``dit report``'s "Tokens/s against RTT" section (:mod:`dit.report.build`) and of
``benchmarks/bench_runtimes_compare.py``, read from each run directory alone (docs/report.md):

- the **runtime variant**: ``metadata.json``'s ``runtime.block`` (the block the run was launched
  with), labelled by its name and the fields that differ between the sweep's runs of that runtime
  (``headsplit (strategy=greedy, speculation)``, ``llamacpp-rpc (quant=Q8_0)``), plus any other
  swept path that is neither ``network`` nor ``runtime``;
- the **added RTT between workers** (ms): netem delays egress only, so a round trip between two
  workers gains both their delays (``network.<device>`` of the resolved scenario, the main profile;
  a varying delay counts with its mean), averaged over the pairs of the runtime's workers; with one
  worker, its delay (the controller's node, the edge server, is never shaped by a scenario);
- **whether that RTT was applied**: :func:`dit.conditions.netem.shaping` of each delayed worker
  from the run's recorded conditions: in local mode, or on a kernel without ``sch_netem`` and
  without the userspace backend, the tc commands are only recorded and the run measured without the
  delay; where the userspace link emulator applied it (this machine's emulated rack) the point
  says so (:data:`APPLIED_USERSPACE`);
- the summary values both LLM runtimes write: ``tokens_per_s`` (1/s) and ``token_latency_mean``
  (ns) from ``aggregate/summary.json``.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import yaml

from dit.conditions.netem import backend, shaping
from dit.conditions.netem.tc import intended_delay_ms
from dit.run.rundir import read_json_object

RECORDED: Final = "recorded, not applied"
APPLIED: Final = "applied"
APPLIED_USERSPACE: Final = "applied (userspace link emulator)"  # no sch_netem: NFQUEUE and the emulator
UNKNOWN: Final = "not in the metadata"
NO_DELAY: Final = ""
EDGE: Final = "edge"


@dataclass(frozen=True)
class RttRun:
    """One run of the sweep as a point of the plot (``tokens_per_s`` None: the run wrote none)."""

    run: str
    state: str
    runtime: str
    block: Mapping[str, Any]
    others: tuple[tuple[str, str], ...]  # swept paths besides network and runtime, as (path, value)
    rtt_ms: float
    rtt_uniform: bool  # every pair of workers has the same added RTT
    netem: str  # RECORDED, APPLIED, APPLIED_USERSPACE, UNKNOWN, or NO_DELAY when no worker is delayed
    tokens_per_s: float | None
    token_latency_ns: float | None
    variant: str = ""


@dataclass(frozen=True)
class RttPoint:
    """A variant at one RTT: the mean over its runs that report tokens/s."""

    variant: str
    rtt_ms: float
    netem: str
    runs: int
    measured: int  # runs with a tokens/s value
    tokens_per_s: float | None
    token_latency_ns: float | None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _document(run_dir: Path, meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """The resolved scenario: ``metadata.json``'s copy, else the run's ``scenario.yaml``."""
    document = (meta.get("scenario") or {}).get("document")
    if isinstance(document, Mapping):
        return document
    try:
        loaded = yaml.safe_load((run_dir / "scenario.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, Mapping) else {}


def runtime_block(meta: Mapping[str, Any], document: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime block the run was launched with (``name`` included; ``layers`` without one)."""
    for block in ((meta.get("runtime") or {}).get("block"), document.get("runtime")):
        if isinstance(block, Mapping) and block.get("name"):
            return dict(block)
    return {"name": str((meta.get("runtime") or {}).get("name") or "layers")}


def workers_of(block: Mapping[str, Any], devices: Sequence[str]) -> list[str]:
    """The runtime's worker devices: the block's ``workers``, else every device but the controller."""
    listed = block.get("workers")
    if isinstance(listed, list) and listed:
        return [str(w) for w in listed]
    controller = str(block.get("controller", EDGE))
    return [d for d in devices if d != controller]


def added_rtt_ms(network: Mapping[str, Any], workers: Sequence[str]) -> tuple[float, bool]:
    """(mean added RTT over the pairs of workers in ms, whether every pair has the same)."""
    delays = []
    for worker in workers:
        block = network.get(worker)
        delays.append(intended_delay_ms(block, None, {}) if isinstance(block, Mapping) else 0.0)
    if len(delays) < 2:
        return (delays[0] if delays else 0.0), True
    pairs = [a + b for a, b in itertools.combinations(delays, 2)]
    return sum(pairs) / len(pairs), max(pairs) - min(pairs) < 1e-9


def netem_state(meta: Mapping[str, Any], network: Mapping[str, Any], workers: Sequence[str]) -> str:
    """Whether the workers' delays were applied (:data:`RECORDED` if any was only recorded)."""
    delayed = [
        w
        for w in workers
        if isinstance(network.get(w), Mapping) and intended_delay_ms(network[w], None, {}) > 0
    ]
    if not delayed:
        return NO_DELAY
    states = {shaping(meta, w) for w in delayed}
    if "recorded" in states:
        return RECORDED
    if states != {"applied"}:
        return UNKNOWN
    return APPLIED_USERSPACE if "userspace" in {backend(meta, w) for w in delayed} else APPLIED


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)


def load_run(run_dir: Path) -> RttRun:
    """One run directory as an :class:`RttRun` (its ``variant`` is set by :func:`load_runs`)."""
    meta = read_json_object(run_dir / "metadata.json")
    status = read_json_object(run_dir / "status.json")
    document = _document(run_dir, meta)
    block = runtime_block(meta, document)
    devices = [str(d) for d in document.get("devices") or []]
    network = document.get("network") or {}
    network = network if isinstance(network, Mapping) else {}
    workers = workers_of(block, devices)
    rtt, uniform = added_rtt_ms(network, workers)
    point = (meta.get("scenario") or {}).get("sweep_point") or []
    others = tuple(
        (str(entry[0]), _plain(entry[1]))
        for entry in point
        if isinstance(entry, list)
        and len(entry) == 2
        and str(entry[0]).split(".")[0] not in ("network", "runtime")
    )
    values = {
        v.get("name"): v.get("value")
        for v in read_json_object(run_dir / "aggregate" / "summary.json").get("values") or []
        if isinstance(v, Mapping)
    }
    return RttRun(
        run=run_dir.name,
        state=str(status.get("state") or "unknown"),
        runtime=str(block["name"]),
        block=block,
        others=others,
        rtt_ms=rtt,
        rtt_uniform=uniform,
        netem=netem_state(meta, network, workers),
        tokens_per_s=_number(values.get("tokens_per_s")),
        token_latency_ns=_number(values.get("token_latency_mean")),
    )


def _flag(key: str, value: Any) -> str:
    if value is True:
        return key
    if value is False:
        return f"no {key}"
    return f"{key}={_plain(value)}"


def label_variants(runs: Sequence[RttRun]) -> list[RttRun]:
    """Every run with its variant label: the runtime's name and the block fields that differ
    between the runs of that runtime (a field a block leaves out counts as its own value), valued
    fields first, then flags (``speculation`` / ``no speculation``)."""
    labelled = []
    for run in runs:
        same = [r.block for r in runs if r.runtime == run.runtime]
        keys = list(dict.fromkeys(k for b in same for k in b if k != "name"))
        differing = [k for k in keys if len({_plain(b[k]) if k in b else None for b in same}) > 1]
        # choices before on/off flags ("strategy=greedy, speculation"), else the block's order
        # (which metadata.json sorts)
        differing.sort(key=lambda k: any(isinstance(b.get(k), bool) for b in same))
        flags = [_flag(k, run.block[k]) for k in differing if k in run.block]
        flags += [f"{path}={value}" for path, value in run.others]
        label = run.runtime + (f" ({', '.join(flags)})" if flags else "")
        labelled.append(replace(run, variant=label))
    return labelled


def load_runs(run_dirs: Sequence[Path]) -> list[RttRun]:
    """Every run directory of a sweep, labelled by variant, in the order given."""
    return label_variants([load_run(Path(d)) for d in run_dirs])


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def points(runs: Sequence[RttRun]) -> list[RttPoint]:
    """One point per (variant, added RTT), variants in order of first appearance, RTT ascending."""
    groups: dict[tuple[str, float], list[RttRun]] = {}
    for run in runs:
        groups.setdefault((run.variant, round(run.rtt_ms, 6)), []).append(run)
    order = list(dict.fromkeys(r.variant for r in runs))
    out = []
    for (variant, rtt), members in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        states = {m.netem for m in members}
        netem = RECORDED if RECORDED in states else next(iter(sorted(states)))
        out.append(
            RttPoint(
                variant=variant,
                rtt_ms=rtt,
                netem=netem,
                runs=len(members),
                measured=sum(m.tokens_per_s is not None for m in members),
                tokens_per_s=_mean([m.tokens_per_s for m in members]),
                token_latency_ns=_mean([m.token_latency_ns for m in members if m.tokens_per_s is not None]),
            )
        )
    return out


def series(rows: Sequence[RttPoint]) -> dict[str, list[tuple[float, float]]]:
    """The plot's data: variant -> [(added RTT ms, tokens/s)], points without tokens/s left out."""
    out: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.tokens_per_s is not None:
            out.setdefault(row.variant, []).append((row.rtt_ms, row.tokens_per_s))
    return out
