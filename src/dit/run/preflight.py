"""The preflight stage's reading and its gates: what the nodes reported, and why a run must not start.

Every gate raises :class:`~dit.run.errors.StageFailed` with one line naming the nodes, before anything is
applied; what the run will not do as asked but may go on without is said (``warn``), not refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.conditions import PreflightFacts, preflight_notes, preflight_refusals
from dit.run.ansible_exec import StageOutcome
from dit.run.errors import StageFailed
from dit.run.rundir import write_json
from dit.runtime_api.interface import preflight_of
from dit.runtimes import Runtime, RuntimePreflight
from dit.scenario import Scenario


def node_facts(
    outcome: StageOutcome, hosts: Sequence[str], raw_dir: Path, warn: Callable[[str], None]
) -> dict[str, Any]:
    """``{host: dit_facts}``; a broken stale lease is said, and each node's unshaped ping baseline kept
    in ``raw/<host>/`` (nothing is applied yet: the links as they are)."""
    nodes: dict[str, Any] = {}
    for host in hosts:
        broken = (outcome.result_of(host, "dit_lease") or {}).get("lease_broken")
        if broken:
            warn(str(broken))
        res = outcome.result_of(host, "dit_facts")
        baseline = (res or {}).get("pings")
        if isinstance(baseline, list):
            target = raw_dir / host / f"{host}_ping_baseline.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            write_json(target, baseline)
        nodes[host] = dict(res.get("dit_facts", {})) if res else {}
    return nodes


def ntp_gate(scenario: Scenario, nodes: Mapping[str, Any]) -> None:
    """Refuse a node whose clock is further than ``timing.max_clock_offset_ms`` from its NTP source."""
    limit = float(scenario.timing.max_clock_offset_ms)
    problems: list[str] = []
    for host, facts in nodes.items():
        ntp = facts.get("ntp", {})
        if ntp.get("source") in ("local", "shared"):
            continue
        offset = ntp.get("offset_ms")
        if offset is None:
            problems.append(f"{host}: clock offset unknown ({ntp.get('error', 'no NTP source')})")
        elif abs(float(offset)) > limit:
            problems.append(
                f"{host}: clock offset {float(offset):.3f} ms exceeds {limit} ms (timing.max_clock_offset_ms)"
            )
    if problems:
        raise StageFailed("preflight: NTP gate refused to start: " + "; ".join(problems))


def condition_gates(facts: PreflightFacts, warn: Callable[[str], None]) -> None:
    """Every condition's ``preflight`` hook (:mod:`dit.conditions`); the first refusal stops the run."""
    refusals = preflight_refusals(facts)
    if refusals:
        raise StageFailed(f"preflight: {refusals[0]}")
    for note in preflight_notes(facts):
        warn(f"preflight: {note}")


def runtime_gate(
    runtime: Runtime,
    scenario: Scenario,
    edge_host: str,
    nodes: Mapping[str, Any],
    *,
    check: bool,
    warn: Callable[[str], None],
) -> None:
    """The runtime's own preflight gate over its custom node facts (e.g. llamacpp-rpc's build record)."""
    custom = {host: dict(facts.get("runtime_facts") or {}) for host, facts in nodes.items()}
    view = RuntimePreflight(scenario.runtime, scenario.to_dict(), edge_host, scenario.devices, custom)
    refusal = preflight_of(runtime, view)
    if refusal and check:
        # A dry run starts no runtime process: what is missing for one is said, not a failure of
        # the dry run (whose subject is what apply would change); the real run stops here.
        warn(f"preflight: runtime {runtime.name} (a real run stops here): {refusal}")
    elif refusal:
        raise StageFailed(f"preflight: runtime {runtime.name}: {refusal}")
