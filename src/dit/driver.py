"""The driver: sequences the seven stages of one scenario run and always tears down.

preflight → apply → profile → collect run as Ansible playbooks against the run's inventory;
aggregate and optimise touch no node and run here, in the driver process. Teardown runs
whatever happened before it: a failed stage, Ctrl-C, SIGTERM or ``dit stop``. It replays the
journal backwards and verifies that no process carrying the run id is left.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

import dit
from dit.analysis.run import LoadedRun
from dit.ansible_exec import HostEvent, StageOutcome, run_stage
from dit.conditions import (
    EDGE_SERVICE_ORDER,
    HostContext,
    PreflightFacts,
    active,
    aggregate_hooks,
    build_conditions,
    preflight_notes,
    preflight_refusals,
    process_settings,
    resolve_conditions,
)
from dit.follow import LogFollower, targets_for
from dit.inventory import RunInventory, load_inventory, local_inventory
from dit.journal import (
    Journal,
    JournalError,
    collected_name,
    dropped_results,
    fetched_results,
    undo_scopes,
)
from dit.lease import controller_holder
from dit.localmode import cgroup_cpu_root, cgroup_memory_root
from dit.models.resolve import ResolvedModel, resolve_model
from dit.paths import content_root
from dit.procs import ProcessFailure, process_failures, process_identity, run_processes
from dit.reporter import Reporter
from dit.rundir import DRIVER, RunDir, RunDirError, disk_full, os_reason, write_json
from dit.runtimes import LaunchContext, LaunchOutcome, Runtime, RuntimePreflight
from dit.runtimes import envs as runtime_envs
from dit.runtimes import launch as runtime_launch
from dit.runtimes import registry as runtimes
from dit.runtimes.base import node_facts_of, preflight_of, uses_edge_service
from dit.scenario import Scenario
from dit.settle import settle_messages, settle_records

EDGE_SERVICE_TASK = "Start the edge inference service"  # its name in playbooks/apply.yml.j2
# The start instant for the edge service, in the edge's run root: not the prepared processes' start_at.json,
# which a plug-in's own process on the edge may wait for (the service would then profile beside it).
EDGE_START_AT_FILE = "edge_start_at.json"
FRAMEWORKS = ("tensorflow", "tensorflow-cpu", "torch", "transformers", "numpy", "pandas")


class StageFailed(Exception):
    """A stage did not complete; the message says which node and why."""


class Stopped(Exception):
    """The run was asked to stop (Ctrl-C, SIGTERM, ``dit stop``)."""


@dataclass
class RunOptions:
    runs_root: Path
    inventory: str | None = None  # None: local mode
    allow_stand_in: bool = True
    check: bool = False  # dry run: preflight and apply in Ansible check mode only (Driver.dry_run)
    break_stale_lease: bool = False  # take nodes whose lease holder is gone or unverifiable (dit.lease)
    console: Console = field(default_factory=lambda: Console(stderr=True))


@dataclass
class RunResult:
    run_dir: Path
    label: str
    state: str  # completed | degraded (a device process failed; see status.json) | failed | stopped
    error: str | None
    stage_ns: dict[str, int]
    lateness_ns: dict[str, int]
    optimum: dict[str, Any] | None = None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "dit": dit.__version__}
    for dist in ("ansible-core", "ansible-runner", *FRAMEWORKS):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _git_commit() -> dict[str, Any]:
    root = content_root()
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        if head.returncode != 0:
            return {"commit": None, "source": "not a git checkout"}
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": None, "source": str(exc)}


def link_targets(
    devices: Iterable[str], addresses: Mapping[str, str], edge_host: str
) -> dict[str, list[dict[str, str]]]:
    """``{device: [{"target", "address"}]}``: each device's link to the edge server (named ``edge``,
    as the analysis names it), then to every other device, in scenario order."""
    names = list(devices)
    return {
        device: [{"target": "edge", "address": addresses[edge_host]}]
        + [{"target": other, "address": addresses[other]} for other in names if other != device]
        for device in names
    }


#: Offset of the device-to-device iperf3 servers from the collect stage's iperf3 port base (the edge's
#: servers use base + device index): the server on device i listens on base + 500 + i.
IPERF3_D2D_PORT_OFFSET = 500


def iperf3_device_links(
    testers: Iterable[str], devices: Iterable[str], addresses: Mapping[str, str]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """The device-to-device iperf3 tests of the collect stage: ``(clients, servers)``.

    ``clients[tester]`` lists ``{"target", "address", "port_offset"}`` for every other device of the
    scenario (in scenario order); ``servers[device]`` is ``{"address", "port_offset"}`` for every
    device some tester measures towards. Each target runs one server and the testers take turns
    (the playbook runs one test at a time), so a port per target suffices.
    """
    names = list(devices)
    chosen = [t for t in names if t in set(testers)]
    clients: dict[str, list[dict[str, Any]]] = {}
    servers: dict[str, dict[str, Any]] = {}
    for tester in chosen:
        for target in names:
            if target == tester:
                continue
            offset = IPERF3_D2D_PORT_OFFSET + names.index(target)
            clients.setdefault(tester, []).append(
                {"target": target, "address": addresses[target], "port_offset": offset}
            )
            servers[target] = {"address": addresses[target], "port_offset": offset}
    return clients, servers


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


def extract_collected(raw_dir: Path, host: str) -> list[str]:
    """Unpack ``raw/<host>.tar.gz`` (members already prefixed with the host) into ``raw/<host>/``."""
    archive = raw_dir / f"{host}.tar.gz"
    dest = raw_dir / host
    dest.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            sub, _, name = member.name.partition("/")
            target_dir = dest if sub == "results" else dest / sub
            target_dir.mkdir(parents=True, exist_ok=True)
            if "/" in name or name.startswith(".") or not name.startswith(f"{host}_"):
                raise StageFailed(f"collect: unexpected member {member.name!r} in {archive}")
            source = tar.extractfile(member)
            if source is None:
                continue
            # Whole or absent: teardown takes a file in raw/ for fetched and removes the node's copy.
            target, part = target_dir / name, target_dir / f".{name}.part"
            try:
                part.write_bytes(source.read())
                os.replace(part, target)
            except OSError as exc:
                part.unlink(missing_ok=True)
                raise RunDirError(target, "write", exc) from None
            names.append(str(target.relative_to(raw_dir)))
    archive.unlink()
    return names


class Driver:
    """Runs one (already swept) scenario in its own run directory."""

    def __init__(self, scenario: Scenario, options: RunOptions) -> None:
        self.scenario = scenario
        self.options = options
        self.local = options.inventory is None
        self._stop_reason: str | None = None
        self._in_teardown = False
        self.stage_ns: dict[str, int] = {}
        self.lateness_ns: dict[str, int] = {}
        self.edge_port: int | None = None
        self.runtime_pythons: dict[str, str] = {}  # host -> the runtime's venv interpreter (preflight)
        self.model: ResolvedModel | None = None
        self.reporter: Reporter | None = None
        self.inventory: RunInventory | None = None
        self.follower: LogFollower | None = None
        self.outcomes: dict[str, StageOutcome] = {}
        self.process_failures: list[ProcessFailure] = []
        self.current_stage: str | None = None

    # -- stop handling -----------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._stop_reason is None:
            self._stop_reason = name
            if self.reporter is not None:
                self.reporter.warn(f"{name} received: stopping and tearing down")

    def _should_cancel(self) -> bool:
        if self._in_teardown:
            return False
        if self._stop_reason is None and self.run.stop_requested():
            self._stop_reason = "dit stop"
        return self._stop_reason is not None

    @contextmanager
    def _signals(self) -> Iterator[None]:
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _check_stop(self) -> None:
        if self._should_cancel():
            raise Stopped(self._stop_reason or "stop requested")

    @property
    def inv(self) -> RunInventory:
        if self.inventory is None:
            raise RuntimeError("the run's inventory is not set up yet")
        return self.inventory

    # -- the run -----------------------------------------------------------------------------
    def execute(self) -> RunResult:
        scn = self.scenario
        self.run = RunDir.create(self.options.runs_root, scn.name, scn.hash)
        run = self.run
        # Nothing has started yet: a run directory that cannot be written fails here (RunDirError,
        # one line naming the file), before any node is touched.
        try:
            (run.path / "scenario.yaml").write_text(scn.to_yaml(), encoding="utf-8")
        except OSError as exc:
            raise RunDirError(run.path / "scenario.yaml", "write", exc) from None
        write_json(
            run.path / DRIVER,
            {
                "pid": os.getpid(),
                "host": platform.node(),
                "run_id": run.run_id,
                "inventory": self.options.inventory,
                "local": self.local,
                "scenario_hash": scn.hash,
                **process_identity(os.getpid()),  # so that `dit stop` never signals a reused pid
            },
        )
        run.set_status(state="running", stage=None, label=scn.label, started_wall_ns=time.time_ns())
        self.reporter = Reporter(run.log, self.options.console, f"{scn.label} → {run.path}")
        error: str | None = None
        state = "completed"
        optimum: dict[str, Any] | None = None
        with self._signals(), self.reporter.live():
            try:
                self.inventory = self._inventory()
                self._prepare()
                self._preflight()
                self._apply()
                self._follow()
                self._profile()
                self._collect()
                self._aggregate()
                optimum = self._optimise()
            except Stopped as exc:
                state, error = "stopped", f"stopped by {exc}"
            except Exception as exc:
                state, error = "failed", self._describe(exc)
                self.reporter.error(error)
            finally:
                self._unfollow()
                self._in_teardown = True
                teardown_error, self.stage_ns["teardown"] = teardown(
                    run, self.inventory, self.reporter, discard_results=run.discard_requested()
                )
                self._in_teardown = False
                if teardown_error:
                    state = "failed"
                    error = f"{error}; {teardown_error}" if error else teardown_error
        if state == "completed" and self.process_failures:
            state, error = "degraded", "; ".join(f.describe() for f in self.process_failures)
        unwritten = run.try_set_status(
            state=state,
            stage=None,
            error=error,
            degraded=[f.to_dict() for f in self.process_failures],
            finished_wall_ns=time.time_ns(),
            stage_ns=self.stage_ns,
            lateness_ns=self.lateness_ns,
        )
        if unwritten:  # the run is over all the same: the console has its end state
            self.reporter.warn(f"the run's end state is not recorded: {unwritten}")
        self.reporter.info(f"run {state}: {run.path}" + (f" ({error})" if error else ""))
        self.reporter.close()
        return RunResult(run.path, scn.label, state, error, self.stage_ns, self.lateness_ns, optimum)

    def _describe(self, exc: Exception) -> str:
        """One line for a failed stage: an OS error says which file and why in words (a full disk says
        so and where), not ``[Errno 28]``; anything else is its own message."""
        if not isinstance(exc, OSError):
            return str(exc)
        text = (
            str(exc)
            if isinstance(exc, RunDirError)
            else (f"{exc.filename}: " if exc.filename else "") + os_reason(exc)
        )
        if disk_full(exc):
            text += f" (the run directory {self.run.path} is on it)"
        return f"{self.current_stage}: {text}" if self.current_stage else text

    def dry_run(self, work_dir: Path) -> str | None:
        """Preflight and apply in Ansible check mode in a run directory under ``work_dir``.

        Nothing is journaled, changed or started, so there is no teardown; the stages' results are
        in :attr:`outcomes` (:mod:`dit.dryrun` reads them). Returns the error, or None.
        """
        if not self.options.check:
            raise ValueError("Driver.dry_run needs RunOptions(check=True)")
        self.run = RunDir.create(work_dir, self.scenario.name, self.scenario.hash)
        self.reporter = Reporter(self.run.log, self.options.console, f"{self.scenario.label} (dry run)")
        error: str | None = None
        with self._signals(), self.reporter.live():
            try:
                self.inventory = self._inventory()
                self._prepare()
                self._preflight()
                self._apply()
            except Stopped as exc:
                error = f"stopped by {exc}"
            except Exception as exc:
                error = str(exc)
                self.reporter.error(error)
        self.reporter.close()
        return error

    def _inventory(self) -> RunInventory:
        if self.options.inventory is None:
            return local_inventory(self.run.path, self.scenario.devices)
        return load_inventory(self.options.inventory, self.scenario.devices)

    def _prepare(self) -> None:
        from dit.device.build import build_zipapp

        scn = self.scenario
        spec = scn.model.adapter_spec(scn.seed)
        self.model = resolve_model(
            scn.model.name, spec["params"], spec["input"], scn.seed, self.local, self.options.allow_stand_in
        )
        if self.model.stand_in_for and self.reporter is not None:
            self.reporter.warn(
                f"model {self.model.stand_in_for}: its framework is not installed here; "
                "the fake model with the same stages stands in for it (recorded in metadata.json)"
            )
        device_dir = self.run.path / "device"
        device_dir.mkdir(exist_ok=True)
        self.pyz = build_zipapp(device_dir / "dit-device.pyz", extra_packages=["dit/models"])
        self.contexts = self._host_contexts()
        self.conditions = build_conditions(scn, self.contexts)
        self.processes = process_settings(scn, self.contexts)

    def _host_contexts(self) -> dict[str, HostContext]:
        inv = self.inv
        addresses = {host: inv.address_of(host) for host in inv.hosts}
        contexts: dict[str, HostContext] = {}
        for host in inv.hosts:
            hostvars = inv.hostvars.get(host, {})
            if inv.local and "dit_cgroup_root" not in hostvars:  # memory limits apply for real here
                hostvars = {**hostvars, "dit_cgroup_root": cgroup_memory_root()}
            if inv.local and "dit_cpu_cgroup_root" not in hostvars:  # and CPU shares
                hostvars = {**hostvars, "dit_cpu_cgroup_root": cgroup_cpu_root()}
            contexts[host] = HostContext(
                host=host,
                role="edge" if host == inv.edge_host else "device",
                local=inv.local,
                run_id=self.run.run_id,
                node_root=inv.node_root(host, self.run.run_id),
                sysfs_root=str(hostvars.get("sysfs_root", "/sys")),
                edge_host=inv.edge_host,
                edge_address=inv.edge_address,
                hostvars=hostvars,
                addresses=addresses,
            )
        return contexts

    def _common_vars(self) -> dict[str, Any]:
        return {
            "dit_run_id": self.run.run_id,
            "dit_journal_path": str(self.run.journal),
            "dit_process_env": {host: settings.env for host, settings in self.processes.items()},
            "dit_process_cgroup": {
                host: list(settings.cgroups) for host, settings in self.processes.items() if settings.cgroups
            },
            "dit_process_cpus": {
                host: list(settings.cpus) for host, settings in self.processes.items() if settings.cpus
            },
        }

    def _stage(
        self, stage: str, extravars: dict[str, Any], render_context: dict[str, Any] | None = None
    ) -> StageOutcome:
        assert self.reporter is not None
        self._check_stop()
        self.current_stage = stage
        self.run.set_status(stage=stage)
        self.reporter.stage(stage, "running")
        start = time.monotonic_ns()
        outcome = run_stage(
            stage,
            self.run.path / "ansible" / stage,
            self.inv.source,
            self.inv.limit,
            {**self._common_vars(), **extravars},
            self.reporter.event,
            self._should_cancel,
            forks=max(5, len(self.inv.hosts)),
            render_context=render_context,
            check=self.options.check,
        )
        self.outcomes[stage] = outcome
        self._stage_ended(stage, start)
        if outcome.status == "canceled" or (self._stop_reason and stage != "teardown"):
            self.reporter.stage(stage, "failed", self.stage_ns[stage] / 1e6)
            raise Stopped(self._stop_reason or "cancel")
        if not outcome.ok or outcome.failures():
            self.reporter.stage(stage, "failed", self.stage_ns[stage] / 1e6)
            failures = "; ".join(f"{e.host}: {e.message()}" for e in outcome.failures())
            raise StageFailed(f"{stage} failed: {failures or outcome.status}")
        self.reporter.stage(stage, "done", self.stage_ns[stage] / 1e6)
        return outcome

    def _stage_ended(self, stage: str, start_ns: int) -> None:
        """Record a stage's wall time in status.json at once (atomic write), not only at the end:
        a driver killed later in the run still leaves the times of the stages that ended."""
        self.stage_ns[stage] = time.monotonic_ns() - start_ns
        self.run.set_status(stage_ns=self.stage_ns)

    def _timed(self, stage: str, work: Callable[[], Any]) -> Any:
        assert self.reporter is not None
        self._check_stop()
        self.current_stage = stage
        self.run.set_status(stage=stage)
        self.reporter.stage(stage, "running")
        start = time.monotonic_ns()
        try:
            result = work()
        except Exception:
            self._stage_ended(stage, start)
            self.reporter.stage(stage, "failed", self.stage_ns[stage] / 1e6)
            raise
        self._stage_ended(stage, start)
        self.reporter.stage(stage, "done", self.stage_ns[stage] / 1e6)
        return result

    # -- stages ------------------------------------------------------------------------------
    def _preflight(self) -> None:
        holder = controller_holder(self.run.run_id, self.run.path)
        env = runtime_envs.expected_env(self.runtime.name)
        outcome = self._stage(
            "preflight",
            {
                "dit_lease": holder.to_json(),
                "dit_break_stale_lease": self.options.break_stale_lease,
                "dit_runtime_env": env.dirname or "",
                "dit_runtime_checkpoints": runtime_envs.checkpoint_paths(
                    self.runtime.block_schema(), self.scenario.runtime
                ),
                "dit_ping_targets": self._ping_targets(),
                "dit_runtime_facts": node_facts_of(self.runtime, self.scenario.runtime),
            },
        )
        nodes: dict[str, Any] = {}
        for host in self.inv.hosts:
            broken = (outcome.result_of(host, "dit_lease") or {}).get("lease_broken")
            if broken and self.reporter is not None:
                self.reporter.warn(str(broken))
            baseline = (outcome.result_of(host, "dit_ping") or {}).get("pings")
            if isinstance(baseline, list):  # unshaped: nothing is applied yet
                target = self.run.path / "raw" / host / f"{host}_ping_baseline.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                write_json(target, baseline)
            res = outcome.result_of(host, "dit_facts")
            nodes[host] = dict(res.get("dit_facts", {})) if res else {}
        assert self.model is not None
        # Variables that depend on the nodes' facts (netem's backend) are settled before the metadata
        # records the conditions, so the metadata says what is applied.
        self.conditions = resolve_conditions(
            PreflightFacts(self.scenario, nodes, self.conditions, self.inv.hostvars, self.local)
        )
        record = runtime_envs.runtime_record(
            self.runtime.name,
            self.runtime.version,
            self.scenario.runtime,
            env,
            nodes,
            runtime_envs.pythons_of(self.inv.hosts, self.inv.hostvars),
        )
        self.runtime_pythons = record.pythons
        for warning in record.warnings:
            self.reporter_warn(warning)
        metadata = {
            "run_id": self.run.run_id,
            "scenario": {
                "name": self.scenario.name,
                "label": self.scenario.label,
                "hash": self.scenario.hash,
                "sweep_point": self.scenario.sweep_point_json(),
                "document": self.scenario.to_dict(),
            },
            "mode": "local" if self.local else "inventory",
            "inventory": self.inv.source,
            "model": {"spec": self.model.spec, "stand_in_for": self.model.stand_in_for},
            "runtime": record.metadata,
            "conditions": self.conditions,
            "processes": {
                host: {"env": settings.env, "cgroup": list(settings.cgroups) or None, "cpus": settings.cpus}
                for host, settings in self.processes.items()
            },
            "dit": {"version": dit.__version__, "git": _git_commit()},
            "versions": _versions(),
            "controller": {"hostname": platform.node(), "kernel": platform.release(), "python": sys.version},
            "nodes": nodes,
            "written_wall_ns": time.time_ns(),
        }
        write_json(self.run.path / "metadata.json", metadata)
        self._ntp_gate(nodes)
        self._condition_gates(nodes)
        self._runtime_gate(nodes)

    def _runtime_gate(self, nodes: dict[str, Any]) -> None:
        """The runtime's own preflight gate over its custom node facts (e.g. llamacpp-rpc's build record)."""
        custom = {host: dict(facts.get("runtime_facts") or {}) for host, facts in nodes.items()}
        view = RuntimePreflight(
            self.scenario.runtime, self.scenario.to_dict(), self.inv.edge_host, self.scenario.devices, custom
        )
        refusal = preflight_of(self.runtime, view)
        if refusal and self.options.check:
            # A dry run starts no runtime process: what is missing for one is said, not a failure of
            # the dry run (whose subject is what apply would change); the real run stops here.
            self.reporter_warn(f"preflight: runtime {self.runtime.name} (a real run stops here): {refusal}")
        elif refusal:
            raise StageFailed(f"preflight: runtime {self.runtime.name}: {refusal}")

    def _condition_gates(self, nodes: dict[str, Any]) -> None:
        """Every condition's ``preflight`` hook (:mod:`dit.conditions`); the first refusal stops the run."""
        facts = PreflightFacts(self.scenario, nodes, self.conditions, self.inv.hostvars, self.local)
        refusals = preflight_refusals(facts)
        if refusals:
            raise StageFailed(f"preflight: {refusals[0]}")
        for note in preflight_notes(facts):
            if self.reporter is not None:
                self.reporter.warn(f"preflight: {note}")

    def _ntp_gate(self, nodes: dict[str, Any]) -> None:
        limit = float(self.scenario.timing.max_clock_offset_ms)
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
                    f"{host}: clock offset {float(offset):.3f} ms exceeds {limit} ms "
                    "(timing.max_clock_offset_ms)"
                )
        if problems:
            raise StageFailed("preflight: NTP gate refused to start: " + "; ".join(problems))

    def _edge_config(self) -> dict[str, Any]:
        scn = self.scenario
        assert self.model is not None
        return {
            "run_id": self.run.run_id,
            "policy": scn.edge.policy,
            "admission": scn.edge.admission,
            "devices": list(scn.devices),
            "model": self.model.spec,
            "profile": (
                {"repetitions": scn.repetitions, "warmup": scn.warmup, "min_seconds": scn.edge.profile_min_s}
                if scn.edge.profile_capacity
                else None
            ),
            # where the profile stage announces the start instant (_profile), for the profile from it
            "start_at_file": (
                f"{self.contexts[self.inv.edge_host].node_root}/{EDGE_START_AT_FILE}"
                if self._edge_profiles_at_start()
                else None
            ),
        }

    def _edge_profiles_at_start(self) -> bool:
        """The edge service profiles its capacity again from the start instant: when it profiles at all
        and the runtime's devices use it (a plug-in's own inference would send it no request to end it)."""
        return self.scenario.edge.profile_capacity and uses_edge_service(self.runtime)

    def _apply(self) -> None:
        needed = active(self.conditions)
        outcome = self._stage(
            "apply",
            {
                "dit_device_pyz": str(self.pyz),
                "dit_edge_config": self._edge_config(),
                "dit_conditions": self.conditions,
            },
            {
                "conditions_before": [c for c in needed if c.order < EDGE_SERVICE_ORDER],
                "conditions_after": [c for c in needed if c.order >= EDGE_SERVICE_ORDER],
            },
        )
        if self.options.check:
            return  # a dry run started nothing: no port to read, nothing to settle
        # The edge service's own task: conditions after it start tagged processes with dit_proc too.
        res = outcome.result_of(self.inv.edge_host, "dit_proc", task=EDGE_SERVICE_TASK) or {}
        ready = res.get("ready") or {}
        if "port" not in ready:
            raise StageFailed("apply: the edge service did not report its port")
        self.edge_port = int(ready["port"])
        self.reporter_info(f"edge service listening on {self.inv.edge_address}:{self.edge_port}")
        settled = settle_records(outcome, self.scenario.devices)
        if settled:
            self.run.set_status(settle=settled)
            infos, warnings = settle_messages(settled)
            for line in infos:
                self.reporter_info(line)
            for line in warnings:
                self.reporter_warn(line)
        settle = float(self.scenario.timing.settle_s)
        if settle > 0:
            self.reporter_info(f"settling for {settle} s")
            deadline = time.monotonic() + settle
            while time.monotonic() < deadline:
                self._check_stop()
                time.sleep(min(0.1, settle))

    def _follow(self) -> None:
        """Device stdout/stderr into run.log, live, until teardown (see :mod:`dit.follow`)."""
        if self.reporter is None:
            return
        self.follower = LogFollower(targets_for(self.contexts), self.run.run_id, self.reporter.line)
        self.follower.start()

    def _unfollow(self) -> None:
        if self.follower is not None:
            self.follower.stop()
            self.follower = None

    def reporter_info(self, text: str) -> None:
        if self.reporter is not None:
            self.reporter.info(text)

    def reporter_warn(self, text: str) -> None:
        if self.reporter is not None:
            self.reporter.warn(text)

    def _launch_context(self) -> LaunchContext:
        assert self.model is not None
        return LaunchContext(
            run_id=self.run.run_id,
            block=self.scenario.runtime,
            scenario=self.scenario.to_dict(),
            edge_host=self.inv.edge_host,
            devices=self.scenario.devices,
            addresses={host: ctx.addresses[host] for host, ctx in self.contexts.items()},
            node_roots={host: ctx.node_root for host, ctx in self.contexts.items()},
            pythons=runtime_envs.pythons_of(
                list(self.contexts), {h: c.hostvars for h, c in self.contexts.items()}
            ),
            local=self.local,
            model=self.model.spec,
            edge_port=self.edge_port,
            runtime_pythons=dict(self.runtime_pythons),
        )

    def _profile(self) -> None:
        lead_ns = int(float(self.scenario.timing.start_lead_s) * 1e9)
        launched = runtime_launch.launch_vars(self.runtime, self._launch_context(), self.inv.hosts)
        stage_vars: dict[str, Any] = {"dit_launch_specs": launched, "dit_start_lead_ns": lead_ns}
        if self._edge_profiles_at_start():  # the start task writes the instant on the edge too
            stage_vars["dit_edge_start_at_file"] = EDGE_START_AT_FILE
        outcome = self._stage("profile", stage_vars)
        outcomes = runtime_launch.outcomes(outcome, launched)
        self.lateness_ns.update(self.runtime.started(outcomes))
        start_wait = start_waits(outcomes)
        margins = runtime_launch.start_margins(outcome, launched)
        for host, margin_ns in margins.items():
            if host in start_wait:
                start_wait[host]["start_margin_ns"] = margin_ns
        late = {h: -m for h, m in margins.items() if m < 0}
        if late:
            self.reporter_warn(
                "the start task reached "
                + ", ".join(f"{h} {ns / 1e6:.0f} ms" for h, ns in late.items())
                + " after the start instant, so their processes started late: raise timing.start_lead_s"
            )
        if start_wait:  # how each agent waited for the start instant (absolute sleep, SCHED_FIFO, spin)
            self.run.set_status(start_wait=start_wait)
            self._add_metadata(start_wait=start_wait)
        if self.lateness_ns:
            worst = max(self.lateness_ns.items(), key=lambda item: item[1])
            self.reporter_info(
                "start lateness: "
                + ", ".join(f"{d} {ns / 1e6:.3f} ms" for d, ns in self.lateness_ns.items())
                + f" (worst {worst[0]})"
            )

    def _ping_targets(self) -> dict[str, list[dict[str, str]]]:
        """Every device's links: to the edge server, then to each other device of the scenario."""
        return link_targets(
            self.scenario.devices, {h: self.inv.address_of(h) for h in self.inv.hosts}, self.inv.edge_host
        )

    def _add_metadata(self, **fields: Any) -> None:
        """Add fields to ``metadata.json`` (written at preflight) after the fact."""
        path = self.run.path / "metadata.json"
        try:
            metadata = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(metadata, dict):
            write_json(path, {**metadata, **fields})

    def _collect(self) -> None:
        raw = self.run.path / "raw"
        throughput = [
            d for d in self.scenario.devices if self.scenario.network.get(d, {}).get("measure_throughput")
        ]
        d2d_clients, d2d_servers = iperf3_device_links(
            throughput, self.scenario.devices, {h: self.inv.address_of(h) for h in self.inv.hosts}
        )
        self._stage(
            "collect",
            {
                "dit_iperf3_devices": throughput,
                "dit_iperf3_d2d_clients": d2d_clients,
                "dit_iperf3_d2d_servers": d2d_servers,
                "dit_edge_address": self.inv.edge_address,
                "dit_edge_port_actual": self.edge_port,
                "dit_raw_dir": str(raw),
                "dit_ping_targets": self._ping_targets(),
                "dit_runtime_facts": node_facts_of(self.runtime, self.scenario.runtime),
            },
        )
        for host in self.inv.hosts:
            extract_collected(raw, host)
        self.process_failures = process_failures(raw, self.inv.hosts)
        for failure in self.process_failures:
            self.reporter_warn(failure.describe() + "".join(f"\n  {line}" for line in failure.stderr_tail))

    @cached_property
    def runtime(self) -> Runtime:
        """The scenario's runtime (docs/runtimes.md); validation made sure it is installed."""
        return runtimes.get(str(self.scenario.runtime["name"]))

    @cached_property
    def analysed(self) -> LoadedRun:
        """The run directory as the analysis steps see it: ``scenario.yaml`` read once for all of them."""
        return LoadedRun(self.run.path)

    def _aggregate(self) -> None:
        from dit.analysis.monitors import aggregate_monitors
        from dit.analysis.power_model import write_power_models
        from dit.runtimes.base import write_summary

        def work() -> None:
            # The traces first: energy.csv and the power model are inputs of the runtime's results
            # (the layers runtime's model validation compares predicted with measured energy).
            aggregate_monitors(self.analysed)
            write_power_models(self.analysed)
            results = self.runtime.parse_results(self.analysed)
            write_summary(self.analysed.aggregate_dir, self.runtime.name, results)
            for value in results.summary:
                self.reporter_info(
                    f"{self.runtime.name}: {value.name} = {value.value}"
                    + (f" {value.unit}" if value.unit else "")
                )
            for _condition, step in aggregate_hooks():
                step(self.analysed)

        self._timed("aggregate", work)

    def _optimise(self) -> dict[str, Any] | None:
        if not self.scenario.optimisation.enabled:
            assert self.reporter is not None
            self.reporter.stage("optimise", "skipped")
            return None
        from dit.optimise.api import optimise_run

        opt = self.scenario.optimisation

        def work() -> dict[str, Any]:
            result = optimise_run(self.analysed, opt.algorithm, opt.objective, opt.policy, None)
            data: dict[str, Any] = json.loads(result.to_json())
            return data

        result: dict[str, Any] = self._timed("optimise", work)
        self.reporter_info(
            f"optimum ({opt.algorithm}, {opt.objective}, {opt.policy}): {result.get('vector')}"
        )
        return result


FETCH_ACTIONS = ("ansible.builtin.fetch", "fetch")


@dataclass
class _TeardownSeen:
    """What teardown's playbook reported: ``dit_restore``'s results and the fetches that failed."""

    undone: list[str] = field(default_factory=list)
    removed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    restore: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # each host's last result
    fetch_errors: dict[str, list[str]] = field(default_factory=dict)

    def add(self, event: HostEvent) -> None:
        if event.action == "dit_restore":
            self.undone.extend(event.result.get("undone", []))
            self.removed.setdefault(event.host, []).extend(event.result.get("removed_results", []))
            self.refused.extend(
                f"{event.host}: refused {r.get('op')} record {r.get('id')} (from {r.get('source')}): "
                f"{r.get('reason')}"
                for r in event.result.get("refused", [])
            )
            self.restore[event.host] = event.result
        elif self.failed_fetch(event) and "item" in event.result:
            item = event.result.get("item") or {}
            message = " ".join(str(event.result.get("msg") or "failed").split())
            # "Failed to transfer file to '<dest>': [Errno 28] No space left on device: <src> -> <dest>"
            found = re.search(r"\[Errno \d+\] ([^:]+)", message)
            reason = found.group(1) if found else message[:200]
            self.fetch_errors.setdefault(event.host, []).append(f"{item.get('path')}: {reason}")

    @staticmethod
    def failed_fetch(event: HostEvent) -> bool:
        return event.action in FETCH_ACTIONS and event.status == "failed"


def teardown(
    run: RunDir, inventory: RunInventory | None, reporter: Reporter | None, discard_results: bool = False
) -> tuple[str | None, int]:
    """Replay ``run``'s pending journal backwards on every node; verify no process survives.

    A node's run directory goes only once ``raw/`` holds every file of its ``results/`` and
    ``logs/``: what raw/ lacks is fetched, and a directory holding a file that could not be fetched
    is kept and named, unless ``discard_results``. Nothing here depends on writing the run
    directory: status, log and journal writes are best effort, said on stderr when they fail (a
    full disk), and the undo runs all the same.

    Returns the error (None when everything was undone and nothing survives) and the wall time.
    """
    journal = Journal(run.journal)
    errors: list[str] = []
    infos: list[str] = []
    notes: list[str] = []  # what could not be written into the run directory: said, not failures
    try:
        pending, warnings = journal.pending_by_host(), journal.problems()
    except JournalError as exc:  # unreadable: still reap the run's processes below
        pending, warnings = {}, []
        errors.append(str(exc))
    start = time.monotonic_ns()
    if reporter is not None:
        reporter.stage("teardown", "running")
    _note(notes, run.try_set_status(stage="teardown"))
    if inventory is not None:
        raw = run.path / "raw"
        fetched_before = {host: fetched_results(raw, host) for host in inventory.hosts}
        seen = _TeardownSeen()

        def on_event(event: HostEvent) -> None:
            seen.add(event)
            # A failed fetch is said once per node, with the directory it kept (_kept_message).
            if reporter is not None and not seen.failed_fetch(event):
                reporter.event(event)

        outcome = _teardown_playbook(
            run,
            inventory,
            {
                "dit_run_id": run.run_id,
                "dit_journal_path": str(run.journal),
                "dit_undo": pending,
                "dit_undo_scope": undo_scopes(run.run_id, inventory, run.path / "metadata.json"),
                "dit_raw_dir": str(raw),
                "dit_fetched": fetched_before,
                "dit_discard_results": discard_results,
            },
            on_event,
            notes,
        )
        warnings.extend(seen.refused)
        try:
            journal.mark_undone(seen.undone)
        except JournalError as exc:  # undone on the nodes all the same; a later cleanup redoes it harmlessly
            errors.append(f"{exc}: the nodes are undone, run 'dit cleanup {run.path}' once it can be written")
        kept_ids: set[str] = set()
        for host in inventory.hosts:
            result = seen.restore.get(host) or {}
            if result.get("kept"):
                kept_ids.update(str(r.get("id")) for r in result.get("kept_records", []))
                errors.append(_kept_message(run, host, result, seen.fetch_errors.get(host, [])))
            new = sorted(set(fetched_results(raw, host)) - set(fetched_before[host]))
            if new:
                infos.append(
                    f"fetched {len(new)} file(s) of {host}'s results and logs the collect stage had not "
                    f"into {raw / host}: {', '.join(new)}"
                )
        if kept_ids:
            errors.append(
                f"the results stay on the nodes: 'dit cleanup {run.path}' fetches them once raw/ can take "
                f"them, 'dit cleanup --discard-results {run.path}' deletes them"
            )
        dropped = dropped_results(raw, seen.removed)
        if dropped:
            warnings.append(
                ("deleted with --discard-results, never fetched into raw/: " if discard_results
                 else "removed from the nodes without being fetched into raw/: ")
                + ", ".join(dropped)
            )  # fmt: skip
        # A failed fetch is reported with the directory it kept (above), not as a failure of its own.
        errors.extend(f"{e.host}: {e.message()}" for e in outcome.failures() if e.action not in FETCH_ACTIONS)
        if not outcome.ok and not errors:
            errors.append(f"teardown playbook {outcome.status}")
        try:
            undone = set(seen.undone)
            left = {c.host for c in journal.pending() if c.id not in kept_ids and c.id not in undone}
        except JournalError:
            left = set()  # unreadable: already reported above
        if left:
            errors.append(f"journal changes not undone on {', '.join(sorted(left))}")
        if inventory.local:
            survivors = run_processes(run.run_id)
            if survivors:
                errors.append(
                    "processes of the run survive teardown: " + ", ".join(str(p.pid) for p in survivors)
                )
    elif pending:
        errors.append("no inventory to undo the journal with")
    ns = time.monotonic_ns() - start
    try:
        stage_ns = dict(run.status().get("stage_ns", {}))
    except (OSError, ValueError, TypeError, AttributeError):
        stage_ns = {}  # set_status below sets the unreadable file aside
    stage_ns["teardown"] = ns
    _note(
        notes,
        run.try_set_status(
            stage_ns=stage_ns, teardown={"ok": not errors, "errors": errors, "warnings": warnings}
        ),
    )
    _say(run, reporter, infos, warnings + notes)
    if reporter is not None:
        reporter.stage("teardown", "failed" if errors else "done", ns / 1e6)
        for error in errors:
            reporter.error(f"teardown: {error}")
    return ("; ".join(errors) if errors else None), ns


def _note(notes: list[str], error: str | None) -> None:
    note = f"not recorded in the run directory: {error}"
    if error and note not in notes:
        notes.append(note)


def _kept_message(run: RunDir, host: str, result: Mapping[str, Any], fetch_errors: list[str]) -> str:
    """Which node directory was kept, for which files and why."""
    unfetched = [f for f in result.get("unfetched", []) if isinstance(f, Mapping)]
    # A fetch that failed half-way may have left part of a file in raw/: it must not pass for fetched.
    for item in unfetched:
        # raw/<host> may be no directory, or not writable: then there is nothing of it to remove
        with contextlib.suppress(OSError):
            collected_name(run.path / "raw", host, str(item.get("path", ""))).unlink(missing_ok=True)
    shown = ", ".join(f"{f.get('path')} ({int(f.get('bytes', 0))} bytes)" for f in unfetched[:4])
    if len(unfetched) > 4:
        shown += f" and {len(unfetched) - 4} more"
    why = f"; fetching failed: {fetch_errors[0]}" if fetch_errors else ""
    return (
        f"{host}: kept {', '.join(str(k) for k in result.get('kept', []))} on the node: {len(unfetched)} "
        f"file(s) there are not in {run.path / 'raw' / host} ({shown}){why}"
    )


def _teardown_playbook(
    run: RunDir,
    inventory: RunInventory,
    extravars: dict[str, Any],
    on_event: Callable[[HostEvent], None],
    notes: list[str],
) -> StageOutcome:
    """The teardown playbook, its Ansible files written outside the run directory.

    ansible-runner writes the rendered playbook, its inputs and every event under its private
    directory: on a full or read-only run directory that would stop the undo before it starts.
    They are copied into ``ansible/teardown`` afterwards, beside the other stages', if they fit.
    """
    keep = run.path / "ansible" / "teardown"
    try:
        private: Path | None = Path(tempfile.mkdtemp(prefix="dit-teardown-"))
    except OSError as exc:
        notes.append(f"no temporary directory for teardown's Ansible files ({os_reason(exc)}): using {keep}")
        private = None
    try:
        return run_stage(
            "teardown",
            private or keep,
            inventory.source,
            inventory.limit,
            extravars,
            on_event,
            lambda: False,
            forks=max(5, len(inventory.hosts)),
        )
    finally:
        if private is not None:
            try:
                shutil.copytree(private, keep, symlinks=True, dirs_exist_ok=True)
            except OSError as exc:  # shutil.Error (several files) has no errno
                reason = os_reason(exc) if exc.errno else "some files could not be copied"
                notes.append(f"{keep}: teardown's Ansible files are not kept ({reason})")
            shutil.rmtree(private, ignore_errors=True)


def _say(run: RunDir, reporter: Reporter | None, infos: list[str], warnings: list[str]) -> None:
    """Show and log what teardown has to say: through the run's reporter, or on stderr and in run.log."""
    if not infos and not warnings:
        return
    target = reporter or Reporter(run.log, Console(stderr=True, soft_wrap=True), run.run_id)
    try:
        for info in infos:
            target.info(f"teardown: {info}")
        for warning in warnings:
            target.warn(f"teardown: {warning}")
    finally:
        if reporter is None:
            target.close()
