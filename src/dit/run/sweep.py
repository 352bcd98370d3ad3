"""A sweep as one unit on its nodes: preflight once, each variant's conditions as a difference, one teardown.

The variants of a sweep run one after another on the same nodes. Each keeps its own complete run
directory (scenario, metadata, raw/, aggregate/, status), but on the nodes they are one run: the run id
of the unit's first variant (its *home*) tags every process, cgroup, node directory and the lease, and
the home's ``journal.jsonl`` is the journal of the whole unit. So:

- preflight runs once (the home's); a later variant reuses its facts, clocks, baselines and lease, and
  its ``metadata.json`` names the preflight it used (``sweep.preflight_run``), unless what the
  preflight playbook checks differs for it (runtime, checkpoints, links): then it runs again;
- between two variants only what the next one changes is undone (:func:`condition_plan`): its
  processes and node directory always (after their results are fetched), a condition whose variables
  differ or that the next variant does not have; a condition applied alike stays in force, and the
  next variant's apply applies only the others (the node modules journal the prior values as always);
- the last variant's teardown replays the whole journal backwards: every node as before the sweep.

A failed or stopped variant tears everything down at once; the next variant starts a new unit. Each
variant directory's ``sweep.json`` names the home, whose ``sweep.json`` lists the variants, their
states and the progress (what NNPM and ``dit cleanup`` read): ``dit cleanup`` of any variant directory
undoes the unit. docs/sweeps.md has the whole story.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dit.conditions import EDGE_SERVICE_ORDER, conditions
from dit.run.journal import Journal
from dit.run.rundir import RunDir, find_runs, read_json_object, write_json
from dit.run.teardown import InSession, Keep, NodeScope, teardown
from dit.scenario import Scenario
from dit.trusted import UntrustedPath

if TYPE_CHECKING:
    from dit.run.console import Reporter
    from dit.run.driver import RunOptions, RunResult
    from dit.run.inventory import RunInventory

SWEEP_FILE: Final = "sweep.json"
#: The tags of the processes that hand a sweep's variant over to the next one: they keep running, and
#: on SIGHUP start their results anew (the system monitor, the userspace link emulator).
HANDOVER_TAGS: Final = frozenset({"monitor", "link-emulator"})
DONE_STATES: Final = frozenset({"completed", "degraded"})


# -- the difference between two variants' conditions (pure) -------------------------------------
@dataclass(frozen=True)
class ConditionPlan:
    """Per host, what happens to each condition between two variants: left in force, undone, applied."""

    keep: dict[str, frozenset[str]]
    undo: dict[str, frozenset[str]]
    apply: dict[str, frozenset[str]]


Built = Mapping[str, Mapping[str, Any]]  # {host: {condition name: role variables}}


def condition_plan(before: Built, after: Built, pending: Sequence[Mapping[str, Any]] = ()) -> ConditionPlan:
    """What changes from the conditions in force (``before``) to the next variant's (``after``).

    A condition stays in force on a host when both variants build it with equal variables, it is
    applied before the edge service starts (those after it start processes or act on the service,
    which every variant starts anew) and each of its ``pending`` journal records on that host that is a
    process is one that hands a variant over (:data:`HANDOVER_TAGS`: it keeps running and starts its
    results anew for the next variant); a condition with any other process (a delay that varies over
    time from its start) is undone with the variant. Everything else ``before`` has is undone,
    everything else ``after`` has is applied.
    """
    by_name = {c.name: c for c in conditions()}
    with_process = {
        (str(r.get("host")), str(r.get("role")))
        for r in pending
        if r.get("op") == "process" and r.get("role") and _tag(r) not in HANDOVER_TAGS
    }
    keep: dict[str, frozenset[str]] = {}
    undo: dict[str, frozenset[str]] = {}
    apply: dict[str, frozenset[str]] = {}
    for host in sorted(set(before) | set(after)):
        old, new = before.get(host, {}), after.get(host, {})
        kept = set()
        for name in set(old) & set(new):
            condition = by_name.get(name)
            if condition is None or condition.role is None or old[name] != new[name]:
                continue
            if condition.order < EDGE_SERVICE_ORDER and (host, condition.role) not in with_process:
                kept.add(name)
        keep[host] = frozenset(kept)
        undo[host] = frozenset(set(old) - kept)
        apply[host] = frozenset(set(new) - kept)
    return ConditionPlan(keep, undo, apply)


def _tag(record: Mapping[str, Any]) -> str | None:
    undo = record.get("undo")
    return str(undo.get("tag")) if isinstance(undo, Mapping) and undo.get("tag") is not None else None


def spared(plan: ConditionPlan, pending: Sequence[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Per host, the tags of the processes that stay running between two variants: those of the
    conditions ``plan`` keeps (each one of :data:`HANDOVER_TAGS`)."""
    roles = _kept_roles(plan)
    out: dict[str, set[str]] = {}
    for record in pending:
        host, tag = str(record.get("host")), _tag(record)
        if record.get("op") == "process" and tag and record.get("role") in roles.get(host, set()):
            out.setdefault(host, set()).add(tag)
    return {host: frozenset(tags) for host, tags in out.items()}


def _kept_roles(plan: ConditionPlan) -> dict[str, set[str | None]]:
    by_name = {c.name: c.role for c in conditions()}
    return {host: {by_name.get(name) for name in names} for host, names in plan.keep.items()}


def keep_records(plan: ConditionPlan, spare: Mapping[str, Collection[str]] | None = None) -> Keep:
    """Which pending journal records stay in force between two variants: the lease, what the roles of
    the conditions ``plan`` keeps changed on their host (their processes among them: ``spare``), and on
    a host with such a process the run directory it runs in (dit_node's, emptied for the next variant)."""
    roles = _kept_roles(plan)
    spare = spare or {}

    def keep(record: Mapping[str, Any]) -> bool:
        host = str(record.get("host"))
        if record.get("op") == "lease":
            return True
        if record.get("op") == "mkdir" and record.get("source") == "dit_node":
            return bool(spare.get(host))
        if not record.get("role"):
            return False
        if record.get("op") == "process" and _tag(record) not in spare.get(host, ()):
            return False
        return record.get("role") in roles.get(host, set())

    return keep


#: Conditions that change what a preflight measures (its unshaped ping baselines of the links).
SHAPES_PREFLIGHT: Final = frozenset({"netem"})


def unshaped(built: Built, preflight_again: bool) -> dict[str, dict[str, Any]]:
    """The next variant's conditions as the plan between two variants must see them: without those
    that shape what a preflight measures when that variant runs its preflight again (they are then
    undone before it and applied after it, as for a unit's first variant)."""
    return {
        host: {
            name: values
            for name, values in per_host.items()
            if not (preflight_again and name in SHAPES_PREFLIGHT)
        }
        for host, per_host in built.items()
    }


def to_apply(built: Built, in_force: Built) -> dict[str, dict[str, Any]]:
    """The conditions of ``built`` that are not in force alike already: what a variant's apply applies."""
    return {
        host: {
            name: values for name, values in per_host.items() if in_force.get(host, {}).get(name) != values
        }
        for host, per_host in built.items()
    }


# -- the unit the variants share -----------------------------------------------------------------
@dataclass
class SweepUnit:
    """What consecutive variants share on their nodes; filled by the first variant's driver."""

    total: int = 0  # variants of the sweep (for the progress in sweep.json)
    home: RunDir | None = None
    inventory: RunInventory | None = None
    preflight_key: str | None = None
    preflight_run: Path | None = None  # the variant whose preflight the facts come from
    nodes: dict[str, Any] | None = None  # every node's dit_facts from that preflight
    pyz: tuple[Path, str] | None = None  # the device zipapp and its SHA-256, built once
    in_force: dict[str, dict[str, Any]] = field(default_factory=dict)
    upcoming: Scenario | None = None  # the variant that runs next in this unit (None: tear down all)
    closed: bool = False  # torn down: the next variant starts a new unit
    variants: list[dict[str, Any]] = field(default_factory=list)
    metadata: Path | None = None  # the newest variant's metadata.json: the conditions the undo may touch
    started_wall_ns: int = field(default_factory=time.time_ns)
    _held: int | None = None

    @property
    def node(self) -> NodeScope | None:
        return None if self.home is None else NodeScope(self.home.run_id, self.home.journal, self.metadata)

    def join(self, run: RunDir, scenario: Scenario) -> None:
        """``run`` is the next variant of the unit (the first one is its home); both say so on disk."""
        if self.home is None:
            self.home = run
            # `dit stop HOME` signals a process that holds the directory open: this one, until the end
            self._held = os.open(run.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        entry = {"label": scenario.label, "hash": scenario.hash, "run_dir": str(run.path), "state": "running"}
        self.variants.append(entry)
        if run != self.home:
            write_json(run.path / SWEEP_FILE, {"home": str(self.home.path), "node_run_id": self.home.run_id})
        self.save()

    def finished(self, run: RunDir, state: str) -> None:
        for entry in self.variants:
            if entry["run_dir"] == str(run.path):
                entry["state"] = state
        self.save()

    def save(self, state: str = "running") -> None:
        """The unit's record in the home's ``sweep.json``: its variants and progress (best effort)."""
        if self.home is None:
            return
        done = sum(1 for v in self.variants if v["state"] != "running")
        elapsed_s = (time.time_ns() - self.started_wall_ns) / 1e9
        record = {
            "home": str(self.home.path),
            "node_run_id": self.home.run_id,
            "pid": os.getpid(),
            "state": "closed" if self.closed else state,
            "variants": self.variants,
            "total": self.total,
            "elapsed_s": round(elapsed_s, 1),
            "eta_s": round(elapsed_s / done * (self.total - done), 1) if done and self.total > done else None,
            "updated_wall_ns": time.time_ns(),
        }
        with contextlib.suppress(OSError):  # a full disk: the variants' own directories say everything
            write_json(self.home.path / SWEEP_FILE, record)

    def close(self) -> None:
        self.closed = True
        self.save()
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def teardown_variant(
        self,
        run: RunDir,
        inventory: RunInventory | None,
        reporter: Reporter | None,
        upcoming: Built | None,
        in_session: InSession | None = None,
    ) -> tuple[str | None, int]:
        """Undo what the unit's next variant (its conditions: ``upcoming``) does not keep in force,
        or everything (``upcoming`` None: no next variant, a failure, a stop), with ``run`` the variant
        that ends (``in_session``: where the first teardown pass may run). The error, or None, and the
        wall time."""
        node = self.node
        assert node is not None, "a variant joins its unit before it runs"
        discard = run.discard_requested() or (self.home is not None and self.home.discard_requested())
        if upcoming is not None and not discard:
            pending = [dict(c.record) for c in Journal(node.journal).pending()]
            plan = condition_plan(self.in_force, upcoming, pending)
            spare = spared(plan, pending)
            error, ns = teardown(
                run,
                inventory,
                reporter,
                node=node,
                keep=keep_records(plan, spare),
                spare=spare,
                in_session=in_session,
            )
            if error is None:
                self.in_force = {
                    host: {name: self.in_force[host][name] for name in names}
                    for host, names in plan.keep.items()
                    if host in self.in_force
                }
                run.try_set_status(
                    sweep_kept={host: sorted(names) for host, names in plan.keep.items() if names}
                )
                return None, ns
            # what could not be undone for the next variant: everything goes, the next starts anew
            final_error, more_ns = teardown(run, inventory, reporter, node=node)
            self.close()
            return "; ".join(e for e in (error, final_error) if e), ns + more_ns
        result = teardown(run, inventory, reporter, discard_results=discard, node=node, in_session=in_session)
        self.close()
        return result

    def finish(self) -> str | None:
        """Tear down what the unit's variants left in force for a variant that will not come (Ctrl-C
        between two variants, a variant whose run directory could not be made); the error, or None."""
        if self.closed:
            return None
        error = None
        last = RunDir(Path(self.variants[-1]["run_dir"])) if self.variants else None
        if last is not None and self.inventory is not None:
            error, _ns = teardown(last, self.inventory, None, node=self.node)
        self.close()
        return error

    def stop_requested(self) -> bool:
        """``dit stop`` of the home (or NNPM's Stop on it) stops the variant running now."""
        return self.home is not None and self.home.stop_requested()

    def reused_preflight(self, key: str) -> dict[str, Any] | None:
        """The facts of the unit's preflight when ``key`` (what the preflight playbook checks) is the same."""
        return self.nodes if self.nodes is not None and key == self.preflight_key else None

    def record_preflight(self, key: str, nodes: dict[str, Any], run: RunDir) -> None:
        self.preflight_key, self.nodes, self.preflight_run = key, nodes, run.path

    def copy_baselines(self, run: RunDir, hosts: Sequence[str]) -> None:
        """The unshaped ping baselines of the unit's preflight, into ``run``'s raw/ (its links.csv needs them)."""
        if self.preflight_run is None:
            return
        for host in hosts:
            source = self.preflight_run / "raw" / host / f"{host}_ping_baseline.json"
            if source.is_file():
                target = run.path / "raw" / host / source.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)


def sweep_of(run_dir: Path) -> tuple[RunDir, list[RunDir]] | None:
    """The unit a variant directory belongs to: its home and the variants the home lists (oldest
    first), or None for a run that is no sweep's. The home is trusted only once checked by the caller;
    one outside the variant's runs directory is none (a file there names no other directory to read)."""
    record = read_json_object(run_dir / SWEEP_FILE)
    home = record.get("home")
    if not isinstance(home, str) or Path(home).resolve().parent.parent != run_dir.resolve().parent.parent:
        return None
    home_record = read_json_object(Path(home) / SWEEP_FILE)
    listed = home_record.get("variants")
    listed = listed if isinstance(listed, list) else []
    variants = [
        RunDir(Path(v["run_dir"]))
        for v in listed
        if isinstance(v, dict) and isinstance(v.get("run_dir"), str)
    ]
    return RunDir(Path(home)), variants or [RunDir(run_dir)]


def sweep_record(home: RunDir) -> dict[str, Any]:
    return read_json_object(home.path / SWEEP_FILE)


def progress_of(run_dir: Path) -> dict[str, Any] | None:
    """Where a variant of a sweep unit stands in it, from its home's ``sweep.json`` (NNPM's run list and
    page): ``{"variant": its place from 1, "total", "elapsed_s", "eta_s", "state"}``; None for a run of its own."""
    found = sweep_of(run_dir)
    if found is None and not (run_dir / SWEEP_FILE).is_file():
        return None
    record = read_json_object((found[0].path if found else run_dir) / SWEEP_FILE)
    listed = record.get("variants")
    if not isinstance(listed, list):
        return None
    places = [
        i
        for i, v in enumerate(listed, 1)
        if isinstance(v, dict) and v.get("run_dir") == str(run_dir.resolve())
    ]
    return {
        "variant": places[0] if places else None,
        "total": record.get("total"),
        "elapsed_s": record.get("elapsed_s"),
        "eta_s": record.get("eta_s"),
        "state": record.get("state"),
    }


# -- resume and progress --------------------------------------------------------------------------
@dataclass(frozen=True)
class VariantOutcome:
    """One variant: its label, its run directory (None if it could not start) and how it ended."""

    label: str
    scenario_hash: str
    run_dir: Path | None
    state: str
    reused: bool
    error: str | None = None
    load: tuple[float, float] | None = None  # the 1-minute load average as the run started and ended
    result: RunResult | None = None


def finished_runs(runs_root: Path) -> dict[str, tuple[RunDir, str]]:
    """``{scenario hash: (run, state)}`` of the runs under ``runs_root`` whose results are all there
    (the newest run of a hash kept); a run directory that is not root's alone is not one of them."""
    found: dict[str, tuple[RunDir, str]] = {}
    for run in find_runs(runs_root):
        try:
            run.check_trusted()
        except (UntrustedPath, OSError):
            continue
        status = read_json_object(run.path / "status.json")
        meta = read_json_object(run.path / "metadata.json")
        scenario = meta.get("scenario")
        digest = scenario.get("hash") if isinstance(scenario, dict) else None
        state = status.get("state")
        if state in DONE_STATES and isinstance(digest, str):
            found[digest] = (run, str(state))  # find_runs is in name order: the newest run of a hash wins
    return found


Runner = Callable[[Scenario, "SweepUnit | None"], tuple[Path | None, str, str | None, "RunResult | None"]]


def driver_runner(options: RunOptions) -> Runner:
    """Each variant through :class:`dit.run.driver.Driver`, in ``unit`` when given."""
    from dit.run.driver import Driver
    from dit.run.rundir import RunDirError

    def run(
        scenario: Scenario, unit: SweepUnit | None
    ) -> tuple[Path | None, str, str | None, RunResult | None]:
        try:
            result = Driver(scenario, options, sweep=unit).execute()
        except (RunDirError, UntrustedPath) as exc:  # no run directory: this variant touched no node
            if unit is not None:
                unit.finish()  # what the variants before it left in force for it goes now
            return None, "failed", str(exc), None
        return result.run_dir, result.state, result.error, result

    return run


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def _interrupts_stop() -> Iterator[None]:
    """Between two variants Ctrl-C or SIGTERM (`dit stop`) ends the sweep, after tearing down what the
    last variant left in force (while a variant runs, its driver turns them into a stop with its
    teardown): here they raise KeyboardInterrupt instead of ending the process on the spot."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, _interrupted)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_sweep(
    variants: Sequence[Scenario],
    runs_root: Path,
    console: Console,
    runner: Runner,
    *,
    rerun: bool = False,
    what: str = "sweep",
) -> list[VariantOutcome]:
    """Run every variant not finished under ``runs_root`` yet (all with ``rerun``), as one unit on the
    nodes when more than one is to run; stop after a variant that was stopped. A progress bar says the
    variant running, the time elapsed and the ETA."""
    done = {} if rerun else finished_runs(runs_root)
    todo = [v for v in variants if v.hash not in done]
    outcomes: list[VariantOutcome] = []
    unit: SweepUnit | None = None
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    stopped = False
    with Progress(*columns, console=console, transient=False) as progress, _interrupts_stop():
        task = progress.add_task("variants", total=len(variants))
        try:
            for variant in variants:
                if variant.hash in done:
                    previous, state = done[variant.hash]
                    outcomes.append(VariantOutcome(variant.label, variant.hash, previous.path, state, True))
                    progress.console.print(
                        f"{what}: {variant.label} already finished in {previous.path}", highlight=False
                    )
                    progress.advance(task)
                    continue
                if len(todo) > 1 and (unit is None or unit.closed):
                    unit = SweepUnit(total=len(todo))
                if unit is not None:
                    index = todo.index(variant)
                    following = todo[index + 1] if index + 1 < len(todo) else None
                    unit.upcoming = (
                        following if following is not None and _same_nodes(variant, following) else None
                    )
                progress.update(task, description=variant.label)
                load_start = os.getloadavg()[0]
                run_dir, state, error, result = runner(variant, unit)
                load = (load_start, os.getloadavg()[0])
                outcomes.append(
                    VariantOutcome(variant.label, variant.hash, run_dir, state, False, error, load, result)
                )
                progress.advance(task)
                if state == "stopped":
                    stopped = True
                    break
        except KeyboardInterrupt:
            stopped = True
        finally:
            if unit is not None:
                # Ctrl-C between two variants: what the last one left in force for the next goes now
                unit.finish()
    reason = "not run: the variant before it was stopped" if stopped else "not run"
    for variant in variants[len(outcomes) :]:  # after a stopped run: listed as not run, never dropped
        outcomes.append(VariantOutcome(variant.label, variant.hash, None, "not run", False, reason))
    return outcomes


def _same_nodes(a: Scenario, b: Scenario) -> bool:
    """Whether ``b`` can run in ``a``'s unit: the same devices (so the same nodes and inventory)."""
    return a.devices == b.devices
