"""Controlled conditions: one package per condition, from a scenario to the variables of its role.

A condition is a package ``dit/conditions/<name>/`` (with its role ``roles/<role>/``, and a module
under ``library/`` if it writes privileged state). When the scenario sets it, its ``schema.json`` is its
part of the scenario schema: its block (netem's ``network``) or its fields of a shared block (cpufreq's
``hardware.cpu_freq_mhz``), merged into ``scenarios/scenario.schema.json`` by
``python -m dit.devtools.scenario_schema``. Its ``__init__`` defines

- ``CONDITION = Condition(name=..., role=..., order=..., variables=(...))`` and
- ``build(scenario, host, ctx) -> dict[str, Any] | None`` (:data:`Builder`): the role's public
  variables for that host (keys exactly ``CONDITION.variables``), or None when the host has nothing
  to apply;

and may define these hooks, each called by the driver for every condition that has it, in
``order``, without the driver naming the condition:

- ``check_block(block, device, conf, report)`` (:data:`dit.scenario.errors.BlockCheck`): the checks of
  one device's entry of the condition's per-device block (a top-level field of its ``schema.json``)
  that the schema cannot express, each problem reported at its field's path; called by the scenario's
  validation, not by the driver: the assembled schema names it in the block's ``x-check``;

- ``process(scenario, host, ctx) -> ProcessSettings | None`` (:data:`ProcessHook`): environment,
  cgroup and CPUs of the run's device processes on the host (the memory limit, the CPU share, thread
  counts); the cgroups of every hook are joined (one directory per cgroup v1 hierarchy);
- ``preflight(facts) -> str | None`` (:data:`PreflightHook`): the preflight gate. ``facts`` is a
  :class:`PreflightFacts` (every node's ``dit_facts``, the built variables, the inventory); the hook
  returns why the run must not start (``"memory limit refused: ..."``, prefixed with ``preflight:``
  in the run's error) or None. The first refusal stops the run before anything is applied;
- ``applied(scenario, outcome) -> Applied | None`` (:data:`AppliedHook`): what the condition reads
  out of the apply stage's results (:class:`StageResults`) once it has run:
  fields for ``status.json`` and lines for the run log (the load condition's settle records);
- ``resolve(facts) -> {host: variables}`` (:data:`ResolveHook`): variables that depend on what
  preflight found on the nodes (netem's backend), applied to the built variables before the run's
  metadata is written;
- ``aggregate(run) -> None`` (:data:`AggregateHook`): the condition's own analysis of a collected
  run (a :class:`dit.analysis.run.LoadedRun`), writing under ``aggregate/``; called after the
  aggregate proper (:func:`dit.analysis.aggregate.aggregate_run`) for every condition, active or
  not, so a hook decides from the run what to write (netem's network self-check). A hook that needs
  pandas imports it inside, so discovering the conditions stays cheap;
- ``undo_scope(host, built, hostvars) -> UndoScope | None`` (:data:`UndoScopeHook`): what undoing
  the condition's journal records may touch on the host (the cgroup hierarchy it creates cgroups in,
  the interfaces it shaped), from the variables the run built for it (``built``, None when the host
  had none) and the host's inventory variables, never from the journal (docs/journal.md);
- ``local_hostvars() -> dict`` (:data:`LocalHostvarsHook`): host variables local mode sets for every
  node unless its inventory does (where this machine creates the condition's cgroups).

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
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast

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


class TaskResult(Protocol):
    """One task's result on one host, as a stage reports it (:class:`dit.run.ansible_exec.HostEvent`)."""

    @property
    def action(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def result(self) -> Mapping[str, Any]: ...


class StageResults(Protocol):
    """A stage's results per host, in task order (:class:`dit.run.ansible_exec.StageOutcome`)."""

    @property
    def results(self) -> Mapping[str, Sequence[TaskResult]]: ...


@dataclass(frozen=True)
class Applied:
    """What a condition has to say once the apply stage has run."""

    status: Mapping[str, Any] = field(default_factory=dict)  # fields of status.json (docs/raw-results.md)
    infos: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # said, never silent; the run goes on


@dataclass(frozen=True)
class UndoScope:
    """What undoing a condition's journal records may touch on one host (``dit_restore``'s scope)."""

    cgroup_roots: tuple[str, ...] = ()  # hierarchies the condition creates the run's cgroups under
    interfaces: tuple[Mapping[str, str], ...] = ()  # ``{dev, netns, log}`` of every interface it shaped


#: ``preflight(facts)``: why the run must not start (one sentence naming the nodes), or None.
PreflightHook = Callable[[PreflightFacts], "str | None"]
#: ``resolve(facts)``: ``{host: variables}`` for the hosts whose variables depend on the preflight
#: facts (called once, after preflight, before anything is applied); other hosts keep their build.
ResolveHook = Callable[[PreflightFacts], "Mapping[str, Mapping[str, Any]]"]
#: ``preflight_notes(facts)``: what the run will not do as asked, said plainly (does not refuse).
NotesHook = Callable[[PreflightFacts], "list[str]"]
#: ``aggregate(run)``: the condition's analysis of a collected run, written under ``aggregate/``.
AggregateHook = Callable[["LoadedRun"], None]
#: ``applied(scenario, outcome)``: what the condition reads from the apply stage's results, or None.
AppliedHook = Callable[[Scenario, StageResults], "Applied | None"]
#: ``undo_scope(host, built, hostvars)``: what undoing the condition's records may touch on the host.
UndoScopeHook = Callable[[str, "Mapping[str, Any] | None", Mapping[str, Any]], "UndoScope | None"]
#: ``local_hostvars()``: host variables local mode sets for every node the inventory leaves them unset on.
LocalHostvarsHook = Callable[[], "dict[str, Any]"]


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


def process_vars(processes: Mapping[str, ProcessSettings]) -> dict[str, Any]:
    """The stages' variables for starting the run's processes: ``{host: ...}`` environment, cgroups, CPUs."""
    return {
        "dit_process_env": {host: settings.env for host, settings in processes.items()},
        "dit_process_cgroup": {host: list(s.cgroups) for host, s in processes.items() if s.cgroups},
        "dit_process_cpus": {host: list(s.cpus) for host, s in processes.items() if s.cpus},
    }


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


def after_apply(scenario: Scenario, outcome: StageResults) -> list[Applied]:
    """Every condition's ``applied`` reading of the apply stage, in condition order."""
    found: list[Applied] = []
    for module in _modules():
        hook = cast("AppliedHook | None", getattr(module, "applied", None))
        applied = None if hook is None else hook(scenario, outcome)
        if applied is not None:
            found.append(applied)
    return found


def undo_scope(
    host: str, built: Mapping[str, Mapping[str, Any]], hostvars: Mapping[str, Any]
) -> dict[str, Any]:
    """``dit_restore``'s condition scope for ``host`` (``cgroup_root``, ``interfaces``) from every
    condition's ``undo_scope`` hook; ``built`` is the host's ``{condition name: variables}``.

    The cgroup root is the common parent of every condition's hierarchy (on cgroup v1 memory and cpu
    are separate hierarchies; a run's cgroup is still only a directory ``dit-<run id>-<host>`` under it).
    """
    roots: list[str] = []
    interfaces: list[dict[str, str]] = []
    for module in _modules():
        hook = cast("UndoScopeHook | None", getattr(module, "undo_scope", None))
        name = cast(Condition, module.CONDITION).name
        scope = None if hook is None else hook(host, built.get(name), hostvars)
        if scope is not None:
            roots += [r for r in scope.cgroup_roots if r not in roots]
            interfaces += [dict(i) for i in scope.interfaces]
    out: dict[str, Any] = {"interfaces": interfaces}
    if roots:
        out["cgroup_root"] = posixpath.commonpath(roots)
    return out


def local_hostvars() -> dict[str, Any]:
    """The host variables local mode sets on every node, from every condition's ``local_hostvars``."""
    out: dict[str, Any] = {}
    for module in _modules():
        hook = cast("LocalHostvarsHook | None", getattr(module, "local_hostvars", None))
        out.update(hook() if hook is not None else {})
    return out
