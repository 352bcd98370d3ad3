"""Controlled conditions: one package per condition, from a scenario to the variables of its role.

A condition is a package ``dit/conditions/<name>/`` (with its role ``roles/<role>/``, and a module
under ``library/`` if it writes privileged state). Its ``__init__`` defines

- ``CONDITION = Condition(name=..., role=..., order=..., variables=(...))`` and
- ``build(scenario, host, ctx) -> dict[str, Any] | None`` (:data:`Builder`): the role's public
  variables for that host (keys exactly ``CONDITION.variables``), or None when the host has nothing
  to apply;

and may define four hooks, each called by the driver for every condition that has it, in
``order``, without the driver naming the condition:

- ``process(scenario, host, ctx) -> ProcessSettings | None`` (:data:`ProcessHook`): environment,
  cgroup and CPUs of the run's device processes on the host (the memory limit, the CPU share, thread
  counts); the cgroups of every hook are joined (one directory per cgroup v1 hierarchy);
- ``preflight(facts) -> str | None`` (:data:`PreflightHook`): the preflight gate. ``facts`` is a
  :class:`PreflightFacts` (every node's ``dit_facts``, the built variables, the inventory); the hook
  returns why the run must not start (``"memory limit refused: ..."``, prefixed with ``preflight:``
  in the run's error) or None. The first refusal stops the run before anything is applied;
- ``resolve(facts) -> {host: variables}`` (:data:`ResolveHook`): variables that depend on what
  preflight found on the nodes (netem's backend), applied to the built variables before the run's
  metadata is written;
- ``aggregate(run) -> None`` (:data:`AggregateHook`): the condition's own analysis of a collected
  run (a :class:`dit.analysis.run.LoadedRun`), writing under ``aggregate/``; called after the
  aggregate proper (:func:`dit.analysis.aggregate.aggregate_run`) for every condition, active or
  not, so a hook decides from the run what to write (netem's network self-check). A hook that needs
  pandas imports it inside, so discovering the conditions stays cheap.

Builders and gates are pure (no host is touched, nothing is read but their arguments) and unit-tested
with no host. The apply stage includes the role of every condition that some host needs, in ``order``:
conditions with ``order < EDGE_SERVICE_ORDER`` are applied before the edge inference service
starts (so its capacity profile runs under them: frequency pinning), the others after it (traffic
towards the edge service, load, monitors). Packages (and plain modules) are discovered by scanning
this package, so adding a condition touches no shared file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from dit.scenario import Scenario

if TYPE_CHECKING:
    from dit.analysis.run import LoadedRun

EDGE_SERVICE_ORDER = 50


@dataclass(frozen=True)
class Condition:
    name: str
    role: str | None  # None: the condition only shapes the run's processes (``process`` hook)
    order: int
    variables: tuple[str, ...]


@dataclass(frozen=True)
class HostContext:
    """What a builder may know about a host besides the scenario."""

    host: str
    role: str  # "edge" | "device"
    local: bool  # local mode: the node is a directory here; privileged network commands are recorded
    run_id: str
    node_root: str  # the node's run root (as a path on the node)
    sysfs_root: str  # the directory standing for /sys: "/sys" on real hosts, a fake tree in local mode
    edge_host: str
    edge_address: str  # where devices reach the edge server (inference network)
    hostvars: Mapping[str, Any] = field(default_factory=dict)
    addresses: Mapping[str, str] = field(default_factory=dict)  # every host -> its inference address


@dataclass(frozen=True)
class ProcessSettings:
    """How the run's device processes are started on a host."""

    env: dict[str, str]
    # The cgroup directory the processes join, or several (cgroup v1 keeps memory and cpu in separate
    # hierarchies: the processes join one cgroup in each), or None.
    cgroup: str | tuple[str, ...] | None
    cpus: tuple[int, ...] | None = None  # CPUs the processes are confined to, or None

    @property
    def cgroups(self) -> tuple[str, ...]:
        """Every cgroup directory the processes join (empty: none)."""
        if self.cgroup is None:
            return ()
        return (self.cgroup,) if isinstance(self.cgroup, str) else tuple(self.cgroup)


@dataclass(frozen=True)
class PreflightFacts:
    """What a preflight gate may know: the run is set up, nothing is applied yet."""

    scenario: Scenario
    nodes: Mapping[str, Mapping[str, Any]]  # host -> its preflight facts (dit_facts)
    built: Mapping[str, Mapping[str, Any]]  # build_conditions' result: host -> {condition: variables}
    hostvars: Mapping[str, Mapping[str, Any]]  # host -> its inventory variables
    local: bool  # local mode: every node is a directory here, privileged commands are recorded


#: ``build(scenario, host, ctx)``: the role's variables for the host, or None (required).
Builder = Callable[[Scenario, str, HostContext], "dict[str, Any] | None"]
#: ``process(scenario, host, ctx)``: how the run's device processes start on the host, or None.
ProcessHook = Callable[[Scenario, str, HostContext], "ProcessSettings | None"]
#: ``preflight(facts)``: why the run must not start (one sentence naming the nodes), or None.
PreflightHook = Callable[[PreflightFacts], "str | None"]
#: ``resolve(facts)``: ``{host: variables}`` for the hosts whose variables depend on the preflight
#: facts (called once, after preflight, before anything is applied); other hosts keep their build.
ResolveHook = Callable[[PreflightFacts], "Mapping[str, Mapping[str, Any]]"]
#: ``preflight_notes(facts)``: what the run will not do as asked, said plainly (does not refuse).
NotesHook = Callable[[PreflightFacts], "list[str]"]
#: ``aggregate(run)``: the condition's analysis of a collected run, written under ``aggregate/``.
AggregateHook = Callable[["LoadedRun"], None]


def _modules() -> list[ModuleType]:
    found: list[ModuleType] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "CONDITION", None), Condition):
            found.append(module)
    return sorted(
        found, key=lambda m: (cast(Condition, m.CONDITION).order, cast(Condition, m.CONDITION).name)
    )


def conditions() -> list[Condition]:
    return [cast(Condition, m.CONDITION) for m in _modules()]


def build_conditions(scenario: Scenario, contexts: Mapping[str, HostContext]) -> dict[str, dict[str, Any]]:
    """``{host: {condition name: role variables}}`` for every host with something to apply."""
    out: dict[str, dict[str, Any]] = {host: {} for host in contexts}
    for module in _modules():
        condition = cast(Condition, module.CONDITION)
        build = cast(Builder, module.build)
        for host, ctx in contexts.items():
            variables = build(scenario, host, ctx)
            if variables is None:
                continue
            missing = set(condition.variables) - set(variables)
            extra = set(variables) - set(condition.variables)
            if missing or extra:
                raise ValueError(
                    f"condition {condition.name}: builder returned variables {sorted(variables)}, "
                    f"expected {sorted(condition.variables)}"
                )
            out[host][condition.name] = variables
    return out


def process_settings(scenario: Scenario, contexts: Mapping[str, HostContext]) -> dict[str, ProcessSettings]:
    """Environment and cgroup of the run's device processes, per host (seeds always set)."""
    out: dict[str, ProcessSettings] = {}
    for host, ctx in contexts.items():
        env = {"PYTHONHASHSEED": str(scenario.seed), "DIT_SEED": str(scenario.seed)}
        cgroups: list[str] = []
        cpus: tuple[int, ...] | None = None
        for module in _modules():
            hook = cast("ProcessHook | None", getattr(module, "process", None))
            if hook is None:
                continue
            settings = hook(scenario, host, ctx)
            if settings is None:
                continue
            env.update(settings.env)
            cgroups += [c for c in settings.cgroups if c not in cgroups]  # v2: memory and cpu share one
            cpus = settings.cpus or cpus
        cgroup: str | tuple[str, ...] | None = (
            None if not cgroups else cgroups[0] if len(cgroups) == 1 else tuple(cgroups)
        )
        out[host] = ProcessSettings(env, cgroup, cpus)
    return out


def active(built: Mapping[str, Mapping[str, Any]]) -> list[Condition]:
    """The conditions some host needs, in apply order."""
    needed = {name for per_host in built.values() for name in per_host}
    return [c for c in conditions() if c.name in needed and c.role is not None]


def preflight_refusals(facts: PreflightFacts) -> list[str]:
    """Every condition's ``preflight`` refusal, in condition order (empty: the run may start)."""
    refusals: list[str] = []
    for module in _modules():
        gate = cast("PreflightHook | None", getattr(module, "preflight", None))
        refusal = None if gate is None else gate(facts)
        if refusal:
            refusals.append(refusal)
    return refusals


def resolve_conditions(facts: PreflightFacts) -> dict[str, dict[str, Any]]:
    """The built variables once every condition's ``resolve`` hook has seen the preflight facts.

    A hook returns ``{host: variables}`` for the hosts whose variables depend on what preflight
    found (netem: which backend applies where the kernel lacks ``sch_netem``); the other hosts
    keep what ``build`` gave. The driver calls this before it writes ``metadata.json``, so the
    metadata holds what is applied.
    """
    out = {host: dict(per_host) for host, per_host in facts.built.items()}
    for module in _modules():
        hook = cast("ResolveHook | None", getattr(module, "resolve", None))
        if hook is None:
            continue
        name = cast(Condition, module.CONDITION).name
        view = PreflightFacts(facts.scenario, facts.nodes, out, facts.hostvars, facts.local)
        for host, variables in hook(view).items():
            out.setdefault(host, {})[name] = dict(variables)
    return out


def preflight_notes(facts: PreflightFacts) -> list[str]:
    """Every condition's ``preflight_notes``, in condition order (the driver logs them as warnings)."""
    notes: list[str] = []
    for module in _modules():
        hook = cast("NotesHook | None", getattr(module, "preflight_notes", None))
        notes.extend(hook(facts) if hook is not None else [])
    return notes


def aggregate_hooks() -> list[tuple[Condition, AggregateHook]]:
    """The conditions with an ``aggregate`` step, in condition order."""
    hooks: list[tuple[Condition, AggregateHook]] = []
    for module in _modules():
        hook = cast("AggregateHook | None", getattr(module, "aggregate", None))
        if hook is not None:
            hooks.append((cast(Condition, module.CONDITION), hook))
    return hooks
