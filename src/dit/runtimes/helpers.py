"""Pieces every runtime's launch and results parser needs, written once (docs/runtimes.md).

Which node is the controller and which are the workers (from the scenario's ``runtime`` block), the
devices' memory limits, a CSV table under ``aggregate/``, the controller's one results file under
``raw/``, the energy over a time span and its summary values. Errors name the offending field of the ``runtime`` block;
each function takes the exception class to raise, so a runtime's own error type (the one its users
and tests catch) is what comes out.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.analysis.run import AggregateError, LoadedRun, raw_file
from dit.runtime_api.interface import BlockProblem, SummaryValue

EDGE = "edge"  # the scenario's name for the edge server (a controller's usual node)
MIB = 1024 * 1024

ErrorType = Callable[[str], Exception]


class RuntimeBlockError(ValueError):
    """The ``runtime`` block names nodes the launch cannot use; the message names the field."""


def _controller(
    block: Mapping[str, Any], edge_host: str, devices: Sequence[str], default: str
) -> str | BlockProblem:
    name = str(block.get("controller", default))
    if name in (EDGE, edge_host):
        return edge_host
    if name not in devices:
        return BlockProblem(
            ("controller",),
            f"{name!r} is neither the edge server nor a device of the scenario (devices: {', '.join(devices)})",
        )
    return name


def _workers(
    block: Mapping[str, Any], devices: Sequence[str], controller: str, default_excludes_controller: bool
) -> list[str] | BlockProblem:
    listed = block.get("workers")
    if isinstance(listed, list):
        workers = [str(w) for w in listed]
    else:
        workers = [d for d in devices if not (default_excludes_controller and d == controller)]
        if controller in workers:
            return BlockProblem(
                ("workers",),
                f"absent, so every device works, and {controller!r} is the controller's node; "
                "list the workers without it",
            )
    if not workers:
        return BlockProblem(("workers",), "needs at least 1 worker")
    for index, worker in enumerate(workers):
        if worker not in devices:
            return BlockProblem(
                ("workers", index),
                f"{worker!r} is not a device of the scenario (devices: {', '.join(devices)})",
            )
        if worker == controller:
            return BlockProblem(
                ("workers", index), f"{worker!r} is the controller's node; it cannot also run a worker"
            )
        if worker in workers[:index]:
            return BlockProblem(("workers", index), f"{worker!r} is listed twice")
    return workers


def controller_host(
    block: Mapping[str, Any],
    edge_host: str,
    devices: Sequence[str],
    *,
    default: str = EDGE,
    error: ErrorType = RuntimeBlockError,
) -> str:
    """The controller's node: ``runtime.controller`` (``edge`` or the edge host's name: the edge server;
    else a device of the scenario), ``default`` when absent."""
    found = _controller(block, edge_host, devices, default)
    if isinstance(found, BlockProblem):
        raise error(str(found))
    return found


def worker_hosts(
    block: Mapping[str, Any],
    devices: Sequence[str],
    controller: str,
    *,
    default_excludes_controller: bool,
    error: ErrorType = RuntimeBlockError,
) -> list[str]:
    """The workers, in order: ``runtime.workers``, else every device (without the controller's node
    when ``default_excludes_controller``). Each must be a device, listed once, and not the controller."""
    found = _workers(block, devices, controller, default_excludes_controller)
    if isinstance(found, BlockProblem):
        raise error(str(found))
    return found


def node_problems(
    block: Mapping[str, Any],
    scenario: Mapping[str, Any],
    *,
    default_excludes_controller: bool,
    default: str = EDGE,
) -> list[BlockProblem]:
    """:func:`controller_host` and :func:`worker_hosts` at validate time, as a runtime's ``check_block``
    returns them: the controller and the workers against the scenario's devices (the edge server is
    ``edge`` there: the inventory, and so the edge host's name, is not known yet)."""
    raw = scenario.get("devices")
    devices = [str(d) for d in raw] if isinstance(raw, list) else []
    controller = _controller(block, EDGE, devices, default)
    if isinstance(controller, BlockProblem):
        return [controller]
    workers = _workers(block, devices, controller, default_excludes_controller)
    return [workers] if isinstance(workers, BlockProblem) else []


def memory_limit_bytes(scenario: Mapping[str, Any], device: str) -> int:
    """The device's cgroup limit (``hardware.<device>.memory_limit_mb``, MiB) in bytes; 0 = none (its RAM)."""
    hardware = scenario.get("hardware")
    conf = hardware.get(device) if isinstance(hardware, Mapping) else None
    limit = conf.get("memory_limit_mb") if isinstance(conf, Mapping) else None
    return int(limit) * MIB if isinstance(limit, int) and not isinstance(limit, bool) else 0


def memory_limits(scenario: Mapping[str, Any], devices: Iterable[str]) -> dict[str, int]:
    """The limits in bytes of the devices that have one (``hardware.<device>.memory_limit_mb``)."""
    found = {device: memory_limit_bytes(scenario, device) for device in devices}
    return {device: limit for device, limit in found.items() if limit > 0}


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    """A table under ``aggregate/``: the header row, then the rows; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def find_results(run: LoadedRun, result_name: str, *, error: ErrorType = AggregateError) -> tuple[str, Path]:
    """The controller's host and its results file ``raw/<host>/<host>_<result_name>``, found once."""
    raw = run.path / "raw"
    found = [
        (d.name, raw_file(run.path, d.name, result_name))
        for d in (sorted(raw.iterdir()) if raw.is_dir() else [])
        if raw_file(run.path, d.name, result_name).is_file()
    ]
    if len(found) != 1:
        where = ", ".join(str(p) for _, p in found) or f"no raw/<host>/<host>_{result_name}"
        raise error(f"{run.path}: expected the controller's results file once, found {where}")
    return found[0]


def energy_of(run: LoadedRun, hosts: Sequence[str], start_ns: int, end_ns: int) -> float | None:
    """Energy (J) of every host with a power trace between two wall-clock instants; None without any
    trace, or when the span is not inside one of them (no honest total)."""
    from dit.analysis.monitors import energy_between_wall

    if end_ns <= start_ns:
        return None
    total = 0.0
    traced = 0
    for host in hosts:
        joules = energy_between_wall(run.path, host, start_ns, end_ns)
        if joules is None:
            continue
        if not math.isfinite(joules):
            return None
        total += joules
        traced += 1
    return total if traced else None


def energy_summary(
    run: LoadedRun, hosts: Sequence[str], start_ns: int, end_ns: int, tokens: int, span: str
) -> list[SummaryValue]:
    """``energy``, ``energy_per_token`` and ``edp`` of ``hosts`` over ``span`` (e.g. "the generation"),
    the columns every runtime's summary shares; none without a power trace covering it."""
    energy = energy_of(run, list(dict.fromkeys(hosts)), start_ns, end_ns)
    if energy is None:
        return []
    seconds = (end_ns - start_ns) / 1e9
    return [
        SummaryValue("energy", energy, "J", "float", "energy of the controller and workers with a power trace"),
        SummaryValue("energy_per_token", energy / tokens if tokens else None, "J", "float",
                     "energy / tokens generated"),
        SummaryValue("edp", energy * seconds, "J*s", "float", f"energy-delay product of {span}"),
    ]  # fmt: skip
