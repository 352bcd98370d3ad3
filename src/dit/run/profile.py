"""The apply and profile stages' inputs and readings: the edge service's config, the runtime's launch
context, and how each host's processes met the start instant."""

from __future__ import annotations

import hashlib
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.conditions import HostContext
from dit.device.protocol import KEY_FILE, KEY_MIN_BYTES
from dit.models.resolve import ResolvedModel, resolve_model
from dit.runtime_api.interface import PORTS_PER_NODE
from dit.runtimes import LaunchContext, LaunchOutcome
from dit.runtimes import envs as runtime_envs
from dit.scenario import Scenario
from dit.trusted import write_file_nofollow


def scenario_model(
    scenario: Scenario, local: bool, allow_stand_in: bool, warn: Callable[[str], None]
) -> ResolvedModel | None:
    """The scenario's model resolved for the nodes (a stand-in said in ``warn``), or None for a scenario
    without one: a runtime that brings its own model (docs/runtimes.md) needs nothing of the testbed's."""
    if scenario.model is None:
        return None
    spec = scenario.model.adapter_spec(scenario.seed)
    model = resolve_model(
        scenario.model.name, spec["params"], spec["input"], scenario.seed, local, allow_stand_in
    )
    if model.stand_in_for:
        warn(
            f"model {model.stand_in_for}: its framework is not installed here; "
            "the fake model with the same stages stands in for it (recorded in metadata.json)"
        )
    return model


def model_spec(model: ResolvedModel | None) -> dict[str, Any]:
    """What the nodes build (``LaunchContext.model``, the edge service's config); empty without a model."""
    return {} if model is None else dict(model.spec)


def model_record(model: ResolvedModel | None) -> dict[str, Any] | None:
    """``metadata.json``'s ``model``: the spec and the real model a fake one stands in for; None without."""
    return None if model is None else {"spec": model.spec, "stand_in_for": model.stand_in_for}


def write_run_key(directory: Path) -> Path:
    """A new key for this run's edge channel, in ``directory`` as :data:`KEY_FILE` (hex, 0600 from its
    creation, never written through a planted link). The apply stage ships it to every node beside the
    device code; the edge service and the devices sign their frames with it (docs/protocol.md)."""
    path = directory / KEY_FILE
    write_file_nofollow(path, secrets.token_hex(KEY_MIN_BYTES).encode("ascii") + b"\n", mode=0o600)
    return path


def forget_run_key(path: Path | None) -> None:
    """The controller's copy of the run's key goes once the edge service has stopped: it is of no use."""
    if path is not None:
        path.unlink(missing_ok=True)


def edge_config(
    scenario: Scenario,
    run_id: str,
    model: Mapping[str, Any],
    start_at_file: str | None,
    edge_root: str,
) -> dict[str, Any]:
    """The edge inference service's config (``dit_edge_config``); ``start_at_file`` is where the profile
    stage announces the start instant when the service profiles its capacity again from it; the run's
    key is :data:`KEY_FILE` in the edge node's run directory ``edge_root``."""
    edge = scenario.edge
    return {
        "run_id": run_id,
        "key_file": f"{edge_root}/{KEY_FILE}",
        "policy": edge.policy,
        "admission": edge.admission,
        "devices": list(scenario.devices),
        "model": dict(model),
        "profile": (
            {
                "repetitions": scenario.repetitions,
                "warmup": scenario.warmup,
                "min_seconds": edge.profile_min_s,
            }
            if edge.profile_capacity
            else None
        ),
        "start_at_file": start_at_file,
    }


#: On a node of its own the runtime's ports are this fixed range: a node is leased to one run at a time.
NODE_PORT_BASE = 47200
#: Local mode picks among these, below Linux's ephemeral range (32768-60999) so that no client socket
#: of another process takes a port between the allocation and the runtime's listen.
LOCAL_PORTS = range(20000, 32000)


def _bindable(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def allocate_ports(
    run_id: str, hosts: Sequence[str], *, local: bool, count: int = PORTS_PER_NODE
) -> dict[str, tuple[int, ...]]:
    """Per host, ``count`` TCP ports for the run's runtime. In local mode every node is this machine's
    127.0.0.1, so the ports are distinct across the nodes and free now (each bound once, all together,
    then released); they start at an offset of the run id's, so that two local runs rarely probe the same."""
    if not local:
        return {host: tuple(range(NODE_PORT_BASE, NODE_PORT_BASE + count)) for host in hosts}
    wanted = len(hosts) * count
    start = int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % len(LOCAL_PORTS)
    held: list[socket.socket] = []
    found: list[int] = []
    try:
        for step in range(len(LOCAL_PORTS)):
            if len(found) == wanted:
                break
            port = LOCAL_PORTS[(start + step) % len(LOCAL_PORTS)]
            sock = _bindable(port)
            if sock is not None:
                held.append(sock)
                found.append(port)
    finally:
        for sock in held:
            sock.close()
    if len(found) < wanted:
        raise OSError(f"only {len(found)} of the {wanted} local TCP ports the runtime needs are free")
    return {host: tuple(found[i * count : (i + 1) * count]) for i, host in enumerate(hosts)}


def launch_context(
    scenario: Scenario,
    run_id: str,
    contexts: Mapping[str, HostContext],
    *,
    edge_host: str,
    local: bool,
    model: Mapping[str, Any],
    edge_port: int | None,
    runtime_pythons: Mapping[str, str],
    ports: Mapping[str, tuple[int, ...]],
) -> LaunchContext:
    """What the scenario's runtime may know when it describes its processes."""
    return LaunchContext(
        run_id=run_id,
        block=scenario.runtime,
        scenario=scenario.to_dict(),
        edge_host=edge_host,
        devices=scenario.devices,
        addresses={host: ctx.addresses[host] for host, ctx in contexts.items()},
        node_roots={host: ctx.node_root for host, ctx in contexts.items()},
        pythons=runtime_envs.pythons_of(list(contexts), {h: c.hostvars for h, c in contexts.items()}),
        local=local,
        model=model,
        edge_port=edge_port,
        runtime_pythons=dict(runtime_pythons),
        source_addresses={
            host: str(ctx.hostvars["dit_source_address"])
            for host, ctx in contexts.items()
            if ctx.hostvars.get("dit_source_address")
        },
        ports=dict(ports),
    )


def start_waits(outcomes: Iterable[LaunchOutcome]) -> dict[str, dict[str, Any]]:
    """How each host's main process waited for the start instant: the ``start_sched`` record of a
    result file (the layers runtime's ``origin.json``: policy, absolute-clock sleep, final spin)."""
    out: dict[str, dict[str, Any]] = {}
    for outcome in outcomes:
        for doc in outcome.results.values():
            sched = doc.get("start_sched") if isinstance(doc, Mapping) else None
            if isinstance(sched, Mapping):
                out[outcome.host] = dict(sched)
    return out


def late_start(margins_ns: Mapping[str, int]) -> str | None:
    """The warning for hosts whose start task ran after the start instant (a negative margin), or None."""
    late = {h: -m for h, m in margins_ns.items() if m < 0}
    if not late:
        return None
    return (
        "the start task reached "
        + ", ".join(f"{h} {ns / 1e6:.0f} ms" for h, ns in late.items())
        + " after the start instant, so their processes started late: raise timing.start_lead_s"
    )


def lateness_line(lateness_ns: Mapping[str, int]) -> str | None:
    """Each device's start lateness in ms and the worst, or None when none was measured."""
    if not lateness_ns:
        return None
    worst = max(lateness_ns.items(), key=lambda item: item[1])
    return (
        "start lateness: "
        + ", ".join(f"{d} {ns / 1e6:.3f} ms" for d, ns in lateness_ns.items())
        + f" (worst {worst[0]})"
    )
