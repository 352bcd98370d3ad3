"""The runtime interface: what an inference runtime gives the testbed, as typed data.

A runtime (the built-in ``layers`` or a third-party package registered under the entry-point group
``dit.runtimes``) is an object satisfying :class:`Runtime`. It never starts anything itself: it
*describes* processes (:class:`LaunchSpec`), readiness checks and maintenance actions (Ansible plays,
:class:`ReadinessPlan` / :class:`Action`), and reads its raw files back (:meth:`Runtime.parse_results`).
The testbed starts the processes with its own process module, runs the plays through ansible-runner,
journals, follows and reaps. docs/runtimes.md is the user-facing description of this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from dit.device.tags import START_AT_ENV

__all__ = ["START_AT_ENV"]  # re-exported for runtimes: the variable their main processes read

JSONSchema = Mapping[str, Any]
ValueType = Literal["int", "float", "str", "bool"]
NodeState = Literal["ok", "failed", "unreachable"]


#: Where a node keeps dit's directories (its runs' directories, its lease) unless the inventory sets
#: ``dit_remote_base``: a directory only root can write, never a world-writable one such as /var/tmp,
#: where another user could create it first and own what dit runs as root (issue 46).
NODE_DIT_DIR = "/var/lib/dit"
#: The same, as the Ansible expression a runtime's plays use to put files on a node.
NODE_BASE = "{{ dit_remote_base | default('" + NODE_DIT_DIR + "') }}"

#: How many TCP ports the testbed sets aside per node for a run's runtime (:meth:`LaunchContext.port`).
PORTS_PER_NODE = 4
#: The environment variable every launched process finds its node's ports in (comma-separated).
PORTS_ENV = "DIT_PORTS"


@dataclass(frozen=True)
class LaunchContext:
    """What a runtime may know when it describes its processes (one run, one scenario variant)."""

    run_id: str
    block: Mapping[str, Any]  # the scenario's ``runtime`` block (``name`` included)
    scenario: Mapping[str, Any]  # the whole resolved scenario document
    edge_host: str
    devices: tuple[str, ...]
    addresses: Mapping[str, str]  # host -> the address the inference traffic uses
    node_roots: Mapping[str, str]  # host -> the run's directory on that node
    pythons: Mapping[str, str]  # host -> the interpreter of that node (``dit_python``)
    local: bool
    # the model spec the testbed resolved from the scenario's ``model`` (a stand-in recorded, if any);
    # empty when the scenario has none (a runtime without ``uses_testbed_model`` may leave it out)
    model: Mapping[str, Any]
    edge_port: int | None  # the edge inference service the apply stage started
    # host -> the interpreter of the runtime's own venv on that node (<runtimes dir>/<name>-<pin12>/bin/python,
    # installed by ``dit runtimes install``), else that node's ``dit_python``; empty when built by hand
    runtime_pythons: Mapping[str, str] = field(default_factory=dict)
    # host -> the address its inference traffic leaves from, where the network condition must tell the
    # nodes apart (local mode: each device's own loopback address); absent: the kernel picks
    source_addresses: Mapping[str, str] = field(default_factory=dict)
    # host -> the TCP ports the testbed set aside for this run's runtime on that node (free when the run
    # started in local mode, where every node is 127.0.0.1; a fixed range on a leased node); recorded
    # in metadata.json (``runtime_ports``) and in every process's environment (``DIT_PORTS``)
    ports: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def runtime_python(self, host: str) -> str:
        """The interpreter the runtime's processes on ``host`` run with: its venv's, else ``dit_python``."""
        return self.runtime_pythons.get(host) or self.pythons[host]

    def port(self, host: str, index: int = 0) -> int:
        """The ``index``-th port set aside for the runtime on ``host`` (:data:`PORTS_PER_NODE` per node)."""
        ports = self.ports.get(host, ())
        if not 0 <= index < len(ports):
            raise LookupError(
                f"no port {index} on {host!r}: the testbed sets aside {len(ports)} per node "
                f"(hosts: {', '.join(sorted(self.ports)) or 'none'})"
            )
        return ports[index]


@dataclass(frozen=True)
class LaunchSpec:
    """One process a runtime wants started in the profile stage.

    ``name`` is the process tag (unique per host): its output goes to ``logs/<name>.out|.err`` under
    the node root, which ``run.log`` follows. ``files`` are written under the node root before the
    process starts (relative path -> text). Background processes (``main=False``) start first, each
    waited for until it writes ``ready_file`` (relative to the node root) when one is given; then the
    main processes start together, with ``DIT_START_AT_NS`` in their environment, and the stage waits
    for every main process to exit (status 0 and every ``result_files`` entry written, else the stage
    fails). ``result_files`` (JSON, relative to the node root) are returned to :meth:`Runtime.started`.

    ``prepared_file`` (main processes only, relative to the node root) asks for the two-phase start:
    the process is started before the instant is picked, with ``DIT_START_AT_FILE``,
    ``DIT_PREPARED_FILE`` (the absolute path of ``prepared_file``), ``DIT_START_AT_TIMEOUT_S`` and
    ``DIT_STATUS_FILE`` instead of ``DIT_START_AT_NS``. It prepares (imports, model, connections),
    writes ``prepared_file`` (JSON), waits for the start-at file (``{"start_at_ns": int}``, written
    once every node is prepared) and keeps its status record (running, then its exit code) in the
    status file, from which the stage takes its exit status. Without it the instant is picked before
    the process starts, ``timing.start_lead_s`` ahead, and whatever the process does before it
    waits must fit in that lead.
    """

    host: str
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None  # default: the node root
    files: Mapping[str, str] = field(default_factory=dict)
    main: bool = True
    ready_file: str | None = None
    result_files: tuple[str, ...] = ()
    prepared_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": list(self.argv),
            "env": {str(k): str(v) for k, v in self.env.items()},
            "cwd": self.cwd,
            "files": dict(self.files),
            "ready_file": self.ready_file,
            "result_files": list(self.result_files),
            "prepared_file": self.prepared_file,
        }


@dataclass(frozen=True)
class LaunchOutcome:
    """What the profile stage reports of one main process: exit status and its ``result_files``."""

    host: str
    name: str
    returncode: int
    results: Mapping[str, Any]  # result file -> its JSON content (None when unreadable)


@dataclass(frozen=True)
class SummaryValue:
    """One named, typed, unit-carrying result (``unit`` is ``""`` for a dimensionless value)."""

    name: str
    value: int | float | str | bool | None
    unit: str
    type: ValueType
    description: str = ""

    def __post_init__(self) -> None:
        expected: dict[str, tuple[type, ...]] = {
            "int": (int,),
            "float": (int, float),
            "str": (str,),
            "bool": (bool,),
        }
        value = self.value
        if value is None:
            return
        if isinstance(value, bool) and self.type != "bool":
            raise ValueError(f"summary value {self.name}: {value!r} is not of type {self.type}")
        if not isinstance(value, expected[self.type]):
            raise ValueError(f"summary value {self.name}: {value!r} is not of type {self.type}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"summary value {self.name}: {value!r} is not a finite number")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "type": self.type,
            "description": self.description,
        }


@dataclass(frozen=True)
class Results:
    """What a results parser wrote (tables under ``aggregate/``) and its summary values."""

    tables: tuple[Path, ...] = ()
    summary: tuple[SummaryValue, ...] = ()


SUMMARY_FILE = "summary.json"


def write_summary(aggregate_dir: Path, runtime: str, results: Results) -> Path:
    """``aggregate/summary.json``: the runtime's name, its tables and its summary values."""
    names = [v.name for v in results.summary]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"runtime {runtime}: summary values named twice: {', '.join(duplicates)}")
    path = aggregate_dir / SUMMARY_FILE
    aggregate_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "runtime": runtime,
        "tables": [p.name for p in results.tables],
        "values": [v.to_json() for v in results.summary],
    }
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


@dataclass(frozen=True)
class CheckResult:
    """One readiness check on one node."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class NodeReadiness:
    """A node's readiness for one runtime: ``ok`` only when every check ran and passed."""

    host: str
    state: NodeState
    reason: str  # why not ok ("" when ok)
    checks: tuple[CheckResult, ...] = ()

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "state": self.state,
            "reason": self.reason,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


CHECK_PREFIX = "check: "  # a readiness task named "check: <name>" is the check <name>


@dataclass(frozen=True)
class ReadinessPlan:
    """A readiness check as Ansible plays: every task named ``check: <name>`` is one check.

    A check task should set ``ignore_errors: true`` so that the other checks still run; its last line
    of stdout (on success) or stderr/msg (on failure) is the detail shown. ``checks`` lists every check
    that must pass: a node on which one of them did not run is not ready. ``prepare`` runs on the
    controller before the plays (e.g. builds a file a task copies).
    """

    plays: Sequence[Mapping[str, Any]]
    checks: tuple[str, ...]
    extravars: Mapping[str, Any] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None


@dataclass(frozen=True)
class ActionPlan:
    """A maintenance action, ready to run: plays (or a playbook file), extra vars and tags."""

    plays: Sequence[Mapping[str, Any]] | Path
    extravars: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Action:
    """A named maintenance action with its own inputs (a JSON Schema of an object)."""

    name: str
    title: str
    description: str
    inputs: JSONSchema
    plan: Callable[[Mapping[str, Any]], ActionPlan]  # validated inputs (defaults applied) -> plan


@dataclass(frozen=True)
class RuntimePreflight:
    """What a runtime's preflight gate sees: the scenario and, per host, the node facts it asked for.

    ``nodes`` maps each host to ``{fact name: fact}`` for the files :meth:`RuntimeBase.node_facts`
    named: ``{"path": ..., "content": <the file's JSON>}``, or ``{"path": ..., "error": "..."}`` when
    the file is missing or unreadable on that node.
    """

    block: Mapping[str, Any]  # the scenario's ``runtime`` block
    scenario: Mapping[str, Any]
    edge_host: str
    devices: tuple[str, ...]
    nodes: Mapping[str, Mapping[str, Mapping[str, Any]]]


@dataclass(frozen=True)
class BlockProblem:
    """What a runtime's :meth:`RuntimeBase.check_block` finds wrong with its block at ``dit validate``.

    ``path`` is inside the ``runtime`` block (``("workers", 1)`` is ``runtime.workers[1]``); ``message``
    says what is wrong and what would be valid, e.g. ``'device9' is not a device of this scenario
    (devices: device1, device2)``.
    """

    path: tuple[str | int, ...]
    message: str

    @property
    def where(self) -> str:
        """The field as ``dit validate`` names it: ``runtime.workers[1]``."""
        text = "runtime"
        for part in self.path:
            text += f"[{part}]" if isinstance(part, int) else f".{part}"
        return text

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class CollectedRun(Protocol):
    """A collected run directory as :meth:`Runtime.parse_results` reads it. The testbed passes a
    :class:`dit.analysis.run.LoadedRun`; this interface sits below the analysis (the scenario schema asks
    the registry for runtime blocks), so it names the members instead of importing the class."""

    path: Path

    @property
    def scenario(self) -> dict[str, Any]:
        """``scenario.yaml`` of the run, read once."""
        ...

    @property
    def devices(self) -> tuple[str, ...]:
        """The scenario's devices, in order."""
        ...

    @property
    def aggregate_dir(self) -> Path:
        """``aggregate/`` of the run, where a runtime writes its tables."""
        ...

    def raw_file(self, host: str, name: str) -> Path:
        """``raw/<host>/<host>_<name>`` of the run."""
        ...


@runtime_checkable
class Runtime(Protocol):
    """An inference runtime, as the testbed uses it (see docs/runtimes.md)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def title(self) -> str: ...

    def block_schema(self) -> JSONSchema:
        """The JSON Schema (an object, self-contained: no ``$ref``) of the scenario's ``runtime`` block.

        ``name`` is added by the testbed; defaults declared here are applied to the scenario.
        """
        ...

    def readiness(self, scenario: Mapping[str, Any] | None, workdir: Path) -> ReadinessPlan:
        """The readiness plays (for one scenario, or in general when ``scenario`` is None).

        ``workdir`` is a private directory on the controller for files the plays need.
        """
        ...

    def actions(self) -> Sequence[Action]:
        """The runtime's maintenance actions."""
        ...

    def launch(self, ctx: LaunchContext) -> Sequence[LaunchSpec]:
        """The processes of one run's profile stage."""
        ...

    def started(self, outcomes: Sequence[LaunchOutcome]) -> Mapping[str, int]:
        """Per host, how late the main process started after the common instant (ns); may be empty."""
        ...

    def parse_results(self, run: CollectedRun) -> Results:
        """Raw files (``raw/<host>/<host>_*``) -> tables under ``aggregate/`` and summary values."""
        ...


class RuntimeBase:
    """Defaults for the optional parts of :class:`Runtime`: no block, no checks, no actions."""

    name: str = ""
    version: str = "0"
    title: str = ""

    def block_schema(self) -> JSONSchema:
        return {"type": "object", "additionalProperties": False, "properties": {}}

    def readiness(self, scenario: Mapping[str, Any] | None, workdir: Path) -> ReadinessPlan:
        return ReadinessPlan(plays=(), checks=())

    def actions(self) -> Sequence[Action]:
        return ()

    def started(self, outcomes: Sequence[LaunchOutcome]) -> Mapping[str, int]:
        return {}

    def check_block(self, block: Mapping[str, Any], scenario: Mapping[str, Any]) -> Sequence[BlockProblem]:
        """What is wrong with the block against the rest of the scenario (``dit validate`` and every
        load call it after the schema passed, once per sweep variant). ``block`` is the ``runtime``
        block with its schema's defaults; ``scenario`` the whole resolved document. Nothing by default."""
        return ()

    def node_facts(self, block: Mapping[str, Any]) -> Mapping[str, str]:
        """Custom node facts: fact name -> the absolute path of a JSON file that preflight reads on
        every node (``dit_facts``) and records per node in metadata.json's ``runtime.nodes``."""
        return {}

    def preflight(self, facts: RuntimePreflight) -> str | None:
        """Why the run must not start (one sentence naming the nodes and the fix), or None."""
        return None


def check_block_of(
    runtime: Runtime, block: Mapping[str, Any], scenario: Mapping[str, Any]
) -> list[BlockProblem]:
    """The runtime's validate-time problems with its block (optional: none without ``check_block``)."""
    hook = getattr(runtime, "check_block", None)
    found = hook(block, scenario) if callable(hook) else ()
    return list(found or ())


def node_facts_of(runtime: Runtime, block: Mapping[str, Any]) -> dict[str, str]:
    """The runtime's custom node facts (optional: a runtime that is no :class:`RuntimeBase` has none)."""
    hook = getattr(runtime, "node_facts", None)
    found = hook(block) if callable(hook) else {}
    return {str(name): str(path) for name, path in dict(found or {}).items()}


def uses_edge_service(runtime: Runtime) -> bool:
    """The runtime's devices send their requests to dit's edge service (optional ``uses_edge_service``,
    False when absent: a plug-in brings its own). Only then does the service profile its capacity again
    from the start instant; beside another runtime's inference it would only take the edge's CPU."""
    return bool(getattr(runtime, "uses_edge_service", False))


def uses_testbed_model(runtime: Runtime) -> bool:
    """The runtime runs the scenario's ``model`` (optional ``uses_testbed_model``, False when absent: a
    plug-in names its own model in its block). Only then does the scenario need ``model``; without one
    the driver resolves none (``LaunchContext.model`` is empty). The edge service serves the scenario's
    model, so a runtime that uses it uses the model too."""
    return bool(getattr(runtime, "uses_testbed_model", False)) or uses_edge_service(runtime)


def sends_from_source_address(runtime: Runtime) -> bool:
    """The runtime's processes send from their device's own source address (optional
    ``sends_from_source_address``, False when absent): every connection a device's process accepts
    is on ``LaunchContext.source_addresses[device]``, and every one it opens is bound there first where
    its libraries let it (the runtime's page says which do not). Only then can local mode's userspace
    link emulator, whose iptables chain selects a device's packets by that address, delay the runtime's
    traffic; for any other runtime it would delay the device's pings and not its traffic
    (docs/network.md)."""
    return bool(getattr(runtime, "sends_from_source_address", False))


def preflight_of(runtime: Runtime, facts: RuntimePreflight) -> str | None:
    """The runtime's preflight refusal, if it has a gate and refuses."""
    hook = getattr(runtime, "preflight", None)
    refusal = hook(facts) if callable(hook) else None
    return str(refusal) if refusal else None
