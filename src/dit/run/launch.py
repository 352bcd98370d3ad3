"""A runtime's launch in the profile stage: its specs checked, as playbook variables, outcomes back.

The runtime only describes processes (:class:`~dit.runtime_api.interface.LaunchSpec`); ``playbooks/profile.yml.j2``
starts them with the testbed's ``dit_launch`` module (own session, ``DIT_RUN_ID``, the node's cgroup,
CPUs and environment, journaled before the start, reaped at teardown and by ``dit cleanup``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dit.run.ansible_exec import StageOutcome
from dit.runtime_api.interface import PORTS_ENV, LaunchContext, LaunchOutcome, LaunchSpec, Runtime

LAUNCH_MODULE = "dit_launch"
MAIN_TASK = "Run the runtime's main processes from the start instant"  # its name in profile.yml.j2
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}\Z")
RESERVED_TAGS = ("edge", "follow", "monitor", "load", "netem-vary", "background", "power")


class LaunchError(ValueError):
    """A runtime described a process the testbed will not start; the message says which and why."""


def _relative(path: str) -> bool:
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")


def check_specs(runtime: str, specs: Sequence[LaunchSpec], hosts: Sequence[str]) -> None:
    """Refuse specs on unknown hosts, bad or duplicate names, empty argv, paths outside the node root."""
    seen: set[tuple[str, str]] = set()
    if not any(spec.main for spec in specs):
        raise LaunchError(
            f"runtime {runtime}: launch describes no main process (the stage would wait for none)"
        )
    for spec in specs:
        where = f"runtime {runtime}: process {spec.name!r} on {spec.host!r}"
        if spec.host not in hosts:
            raise LaunchError(f"{where}: no such node (nodes: {', '.join(hosts)})")
        if not _NAME.match(spec.name) or spec.name in RESERVED_TAGS:
            raise LaunchError(
                f"{where}: the name must be a tag (letters, digits, '_', '-') not used by the testbed"
            )
        if (spec.host, spec.name) in seen:
            raise LaunchError(f"{where}: named twice on the same node")
        seen.add((spec.host, spec.name))
        if not spec.argv or not all(isinstance(a, str) for a in spec.argv):
            raise LaunchError(f"{where}: argv must be a non-empty list of strings")
        optional = [p for p in (spec.ready_file, spec.prepared_file) if p is not None]
        for path in [*spec.files, *spec.result_files, *optional]:
            if not _relative(path):
                raise LaunchError(f"{where}: {path!r} is not a path relative to the node root")
        if spec.prepared_file is not None and not spec.main:
            raise LaunchError(
                f"{where}: prepared_file is for main processes (a background one has ready_file)"
            )
        if spec.prepared_file is not None and spec.prepared_file in (*spec.result_files, spec.ready_file):
            raise LaunchError(f"{where}: prepared_file {spec.prepared_file!r} is also a ready or result file")


def launch_vars(runtime: Runtime, ctx: LaunchContext, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``dit_launch_specs`` for the profile playbook: per host, its background and main processes."""
    specs = list(runtime.launch(ctx))
    check_specs(runtime.name, specs, hosts)
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        node = out.setdefault(spec.host, {"background": [], "main": []})
        doc = spec.to_json()
        if ctx.ports.get(spec.host):  # the testbed's value: a spec cannot claim other ports as the node's
            doc["env"][PORTS_ENV] = ",".join(str(p) for p in ctx.ports[spec.host])
        node["main" if spec.main else "background"].append(doc)
    return out


def _main_results(
    outcome: StageOutcome, launched: Mapping[str, Mapping[str, Any]]
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each host that had main processes, with the result of the profile stage's start task ({} if none)."""
    for host, node in launched.items():
        if node.get("main"):
            yield host, outcome.result_of(host, LAUNCH_MODULE, task=MAIN_TASK) or {}


def outcomes(outcome: StageOutcome, launched: Mapping[str, Mapping[str, Any]]) -> list[LaunchOutcome]:
    """The main processes' exit statuses and result files, from the profile stage's events."""
    found: list[LaunchOutcome] = []
    for host, res in _main_results(outcome, launched):
        for name, info in dict(res.get("processes") or {}).items():
            code = info.get("returncode")
            found.append(
                LaunchOutcome(
                    host, str(name), int(code) if code is not None else -1, dict(info.get("results") or {})
                )
            )
    return found


def start_margins(outcome: StageOutcome, launched: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Per host, how far ahead of the common instant the start task reached it (ns; negative: after).

    The start task writes the instant into the start-at file of the prepared processes as it begins: a
    negative margin means they started late by at least that much, because the task itself (SSH, module
    transfer, the interpreter inside the node's CPU share) took longer than the start lead.
    """
    out: dict[str, int] = {}
    for host, res in _main_results(outcome, launched):
        at, entered = res.get("start_at_ns"), res.get("entered_ns")
        if isinstance(at, int) and isinstance(entered, int):
            out[host] = at - entered
    return out
