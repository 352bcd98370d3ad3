"""What a figure is, said next to it: a fake sensor's power, a prediction the run did not measure.

One place for these labels so the report, the run page, ``dit show`` and NNPM's optimiser read alike
(issue 36: NNPM must never present a modelled number as a measured one).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dit.analysis.delay import ENERGY_OBJECTIVES
from dit.run.console import STAGES

__all__ = ["ENERGY_OBJECTIVES", "MODELLED", "POWER_UNITS", "fake_power_nodes", "fake_sensor_note", "kept_files",
           "kept_text", "measured_policy", "modelled_tag", "node_label", "power_sensors", "prediction_reason",
           "run_outcome", "skipped_stages", "skipped_text"]  # fmt: skip

FAKE_SENSORS: Final = frozenset({"fake"})
"""``power.json``'s ``sensor`` values that model power instead of measuring it (dit.device.power)."""

MODELLED: Final = "modelled: fake sensor"
"""Said next to every figure a fake sensor gave (issue 49, item 3): it reads as measured otherwise."""

POWER_UNITS: Final = frozenset({"W", "J", "J*s"})
"""Units of the runtime summary values a power sensor gives: power, energy, energy-delay product."""


def modelled_tag(unit: str, fake: Sequence[str]) -> str:
    """`` (modelled: fake sensor)`` after a figure in ``unit`` of a run with a fake sensor on ``fake``
    ("" for a measured one, or for a unit no power sensor gives)."""
    return f" ({MODELLED})" if fake and unit in POWER_UNITS else ""


def node_label(node: object, fake: Sequence[str]) -> str:
    """A node as a power or energy table row or plot legend names it: a fake sensor's node says so."""
    return f"{node} ({MODELLED})" if str(node) in fake else str(node)


def power_sensors(agg: Path) -> dict[str, str]:
    """node -> sensor, from ``aggregate/power_summary.csv`` (empty without the file or its column)."""
    path = agg / "power_summary.csv"
    if not path.is_file():
        return {}
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error):
        return {}
    return {str(r.get("node") or ""): str(r.get("sensor") or "") for r in rows if r.get("node")}


def fake_power_nodes(agg: Path) -> list[str]:
    """The nodes whose power and energy come from a fake sensor, sorted."""
    return sorted(node for node, sensor in power_sensors(agg).items() if sensor in FAKE_SENSORS)


def fake_sensor_note(nodes: list[str]) -> str:
    """One sentence saying which nodes' power is modelled, not measured ("" when none)."""
    if not nodes:
        return ""
    which = ", ".join(nodes)
    return (
        f"Fake power sensor on {which} (local mode): power and energy there are modelled from the node's "
        "CPU activity, not measured."
    )


def measured_policy(scenario: Mapping[str, Any]) -> str | None:
    """The edge server's scheduling policy during inference, upper case; None when no inference ran."""
    inference = scenario.get("inference")
    ran = bool(inference.get("enabled", True)) if isinstance(inference, Mapping) else True
    edge = scenario.get("edge_server")
    policy = edge.get("policy") if isinstance(edge, Mapping) else None
    return str(policy).upper() if ran and policy else None


def prediction_reason(policy: str, measured: str | None) -> str | None:
    """Why an optimiser result under ``policy`` is a prediction, or None when the run measured it."""
    policy = policy.upper()
    if measured is None:
        return "the run measured no inference: nothing confirms these delays"
    if policy != measured:
        return f"the edge server ran {measured} during the run, not {policy}: these delays are predicted, not measured"
    return None


LEASE_REFUSALS: Final = ("is leased by", "is not a lease dit can read")
"""Phrases of :func:`dit.run.lease.decide`'s refusals, as they reach a failed run's error."""


def _stage_reached(status: Mapping[str, Any]) -> str | None:
    """The stage a run ended in: recorded by the driver (``ended_stage``), else the stage after the last
    one with a wall time (runs written before the driver recorded it)."""
    recorded = status.get("ended_stage")
    if isinstance(recorded, str) and recorded:
        return recorded
    stage_ns = status.get("stage_ns")
    done = [s for s in STAGES if isinstance(stage_ns, Mapping) and s in stage_ns and s != "teardown"]
    if not done:
        return STAGES[0] if STAGES else None
    after = STAGES.index(done[-1]) + 1
    return STAGES[after] if after < len(STAGES) and STAGES[after] != "teardown" else None


def run_outcome(status: Mapping[str, Any]) -> str | None:
    """Why a finished run has no results, in one sentence; None for a run that ran to its end.

    A stopped run says at which stage it stopped, a run a node's lease refused says so with the
    holder; neither reads as "no inference ran (a benchmark)", which would misstate the experiment.
    """
    state = str(status.get("state") or "")
    error = str(status.get("error") or "")
    stage = _stage_reached(status)
    where = f"during the {stage} stage" if stage else "before its first stage"
    if state == "stopped":
        at = f"at the {stage} stage" if stage else "before its first stage"
        return f"Stopped {_stopped_by(error)} {at}: the stages after it did not run."
    if state == "failed" and any(p in error for p in LEASE_REFUSALS):
        return f"Refused by a node's lease {where}: {error}."
    if state == "failed":
        return f"Failed {where}" + (f": {error}" if error else "") + "."
    return None


STOPPED_BY: Final = {"dit stop": "by the user (dit stop or NNPM's Stop)", "SIGINT": "by the user (Ctrl-C)"}
"""Who stopped a run, by the reason the driver recorded (``stopped by <reason>``, dit.run.stop)."""


def _stopped_by(error: str) -> str:
    reason = error.removeprefix("stopped by ").strip()
    return STOPPED_BY.get(reason, f"by {reason}" if reason else "by a stop request")


def kept_files(run_dir: Path) -> dict[str, list[str]]:
    """node -> the files fetched into ``raw/<node>/`` (sorted): what a stopped run kept of its nodes'
    results and logs; empty without raw/."""
    raw = run_dir / "raw"
    if not raw.is_dir():
        return {}
    kept: dict[str, list[str]] = {}
    for node in sorted(p for p in raw.iterdir() if p.is_dir() and not p.is_symlink()):
        files = sorted(
            str(f.relative_to(node)) for f in node.rglob("*") if f.is_file() and not f.is_symlink()
        )
        if files:
            kept[node.name] = files
    return kept


def kept_text(run_dir: Path, status: Mapping[str, Any]) -> str | None:
    """What a stopped run kept and what the run page and report show of it, in one or two sentences;
    None for a run that was not stopped (issue 49, item 4: a stop reads as an error otherwise)."""
    if status.get("state") != "stopped":
        return None
    files = kept_files(run_dir)
    if not files:
        return "Nothing was fetched from the nodes before the stop: no results were kept."
    count = sum(len(names) for names in files.values())
    per_node = ", ".join(f"{node}: {len(names)}" for node, names in files.items())
    text = f"Kept from before the stop: {count} file(s) fetched into raw/ ({per_node})"
    kept = status.get("kept")
    if not isinstance(kept, Mapping):
        return text + "."
    done = [str(s) for s in kept.get("aggregated") or []]
    missing = kept.get("not_aggregated")
    missing = missing if isinstance(missing, Mapping) else {}
    if done:
        text += f"; aggregated from them: {', '.join(done)} (shown below)"
    if missing:
        text += "; not aggregated: " + "; ".join(f"{step} ({why})" for step, why in missing.items())
    return text + "."


def skipped_stages(status: Mapping[str, Any]) -> dict[str, str]:
    """stage -> why the driver skipped it, from ``status.json``'s ``skipped`` (the optimise stage of a
    runtime without an optimiser, or of a scenario that turned optimisation off), in run order."""
    recorded = status.get("skipped")
    if not isinstance(recorded, Mapping):
        return {}
    reasons = {str(stage): str(why) for stage, why in recorded.items()}
    return {
        s: reasons[s] for s in [*(s for s in STAGES if s in reasons), *sorted(set(reasons) - set(STAGES))]
    }


def skipped_text(stage: str, reason: str) -> str:
    """A skipped stage as ``dit show``, the report and the run page write it."""
    return f"{stage}: skipped ({reason})"
