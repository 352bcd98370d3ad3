"""The driver: sequences the seven stages of one scenario run and always tears down.

preflight → apply → profile → collect run as Ansible playbooks against the run's inventory;
aggregate and optimise touch no node and run here, in the driver process. Teardown
(:mod:`dit.run.teardown`) runs whatever happened before it: a failed stage, Ctrl-C, SIGTERM or
``dit stop``. It replays the journal backwards and verifies that no process carrying the run id is left.
The driver names no condition: it builds their variables and calls their hooks (:mod:`dit.conditions`).
What a variant of a sweep run as one unit does differently (the unit's run id, journal, inventory and
preflight, only what is not in force alike applied, its teardown) :mod:`dit.run.sweep_variant` decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rich.console import Console

from dit.analysis.run import LoadedRun
from dit.conditions import (
    HostContext,
    PreflightFacts,
    build_conditions,
    process_settings,
    process_vars,
    resolve_conditions,
)
from dit.models.resolve import ResolvedModel
from dit.run import analyse, profile
from dit.run import apply as applying
from dit.run import launch as runtime_launch
from dit.run import preflight as gates
from dit.run.ansible_exec import ChainedStage, StageOutcome, StageSession
from dit.run.apply import EDGE_SERVICE_TASK
from dit.run.collect import collected, iperf3_vars, link_targets, report_edge_channel
from dit.run.console import Reporter
from dit.run.errors import StageFailed, Stopped
from dit.run.follow import LogFollower, stop_beside, targets_for
from dit.run.inventory import RunInventory, host_contexts, load_inventory, local_inventory
from dit.run.procs import ProcessFailure
from dit.run.provenance import add_metadata, run_metadata, write_run_files
from dit.run.rundir import RunDir, describe_failure
from dit.run.stop import StopRequests
from dit.run.sweep import SweepUnit
from dit.run.sweep_variant import SweepVariant, runtime_checks
from dit.run.teardown import teardown_in_session
from dit.runtime_api import registry as runtimes
from dit.runtime_api.interface import node_facts_of, uses_edge_service
from dit.runtimes import LaunchContext, Runtime
from dit.runtimes import envs as runtime_envs
from dit.scenario import Scenario

__all__ = ["EDGE_SERVICE_TASK", "Driver", "RunOptions", "RunResult", "StageFailed", "Stopped"]

# The start instant for the edge service, in the edge's run root: not the prepared processes' start_at.json,
# which a plug-in's own process on the edge may wait for (the service would then profile beside it).
EDGE_START_AT_FILE = "edge_start_at.json"


@dataclass
class RunOptions:
    runs_root: Path
    inventory: str | None = None  # None: local mode
    allow_stand_in: bool = True
    check: bool = False  # dry run: preflight and apply in Ansible check mode only (Driver.dry_run)
    break_stale_lease: bool = (
        False  # take nodes whose lease holder is gone or unverifiable (dit.run.lease_decision)
    )
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


def node_session(
    run: RunDir, inv: RunInventory, reporter: Reporter, stop: StopRequests, apply: dict[str, Any], check: bool
) -> StageSession:
    """The node stages as one ansible-playbook start: preflight and apply, then profile, collect and
    teardown unless a dry run (whose apply runs in check mode and starts nothing to profile). Teardown
    runs there only after a completed run (:func:`dit.run.teardown.teardown_in_session`)."""
    plan = [ChainedStage("preflight"), ChainedStage("apply", apply)]
    plan += [] if check else [ChainedStage("profile"), ChainedStage("collect"), ChainedStage("teardown")]
    forks = max(5, len(inv.hosts))
    return StageSession(
        plan, run.path / "ansible", inv.source, inv.limit, reporter.event, stop.should_cancel, forks, check
    )


class Driver:
    """Runs one (already swept) scenario in its own run directory."""

    def __init__(self, scenario: Scenario, options: RunOptions, sweep: SweepUnit | None = None) -> None:
        self.scenario = scenario
        self.options = options
        self.local = options.inventory is None
        self.variant = SweepVariant(sweep)  # a run of its own, or a variant of a sweep unit
        # The run directory comes later (execute, dry_run): its stop request is looked up when asked.
        self.stop = StopRequests(lambda: self.variant.stop_requested(self.run), self.reporter_warn)
        self.stage_ns: dict[str, int] = {}
        self.lateness_ns: dict[str, int] = {}
        self.edge_port: int | None = None
        self.key: Path | None = None  # the run's key for the edge channel (_prepare)
        self.runtime_pythons: dict[str, str] = {}  # host -> the runtime's venv interpreter (preflight)
        self.model: ResolvedModel | None = None
        self.reporter: Reporter | None = None
        self.inventory: RunInventory | None = None
        self.follower: LogFollower | None = None
        self.outcomes: dict[str, StageOutcome] = {}
        self.process_failures: list[ProcessFailure] = []
        self.current_stage: str | None = None
        self.session: StageSession | None = None  # preflight to teardown: one ansible-playbook start

    @property
    def inv(self) -> RunInventory:
        if self.inventory is None:
            raise RuntimeError("the run's inventory is not set up yet")
        return self.inventory

    # -- the run -----------------------------------------------------------------------------
    def execute(self) -> RunResult:
        self.run = run = RunDir.create(self.options.runs_root, self.scenario.name, self.scenario.hash)
        self.node = self.variant.join(run, self.scenario)  # the run id and journal on the nodes
        with run.held_open():  # what `dit stop` recognises its driver by
            return self._execute(run)

    def _execute(self, run: RunDir) -> RunResult:
        scn = self.scenario
        write_run_files(run, scn, self.options.inventory, self.local)
        run.set_status(state="running", stage=None, label=scn.label, started_wall_ns=time.time_ns())
        self.reporter = Reporter(run.log, self.options.console, f"{scn.label} → {run.path}")
        error: str | None = None
        state = "completed"
        optimum: dict[str, Any] | None = None
        with self.stop.signals(), self.reporter.live():
            try:
                self.inventory = self.variant.inventory(run, self._inventory)
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
                state, error = "failed", describe_failure(exc, self.current_stage, run.path)
                self.reporter.error(error)
            finally:
                unfollowing, self.follower = stop_beside(self.follower), None  # beside the teardown
                in_session = teardown_in_session(self.session, state)  # a completed run's, in its session
                if in_session is None:
                    self._close_session()  # before teardown: no stage playbook may run beside it
                self.stop.in_teardown = True
                teardown_error, self.stage_ns["teardown"] = self.variant.teardown(
                    run, self.inventory, self.reporter, state, self.local, in_session
                )
                self.stop.in_teardown = False
                unfollowing.join()
                self._close_session()
                profile.forget_run_key(self.key)  # the nodes' copies went with their run directories
                if teardown_error:
                    state = "failed"
                    error = f"{error}; {teardown_error}" if error else teardown_error
            if state == "stopped":
                analyse.record_kept(run, lambda: self.analysed, self.runtime, self.reporter_info)
        if state == "completed" and self.process_failures:
            state, error = "degraded", "; ".join(f.describe() for f in self.process_failures)
        unwritten = run.try_set_status(
            state=state,
            stage=None,
            # the stage a stopped or failed run ended in: its report says "stopped during apply", not
            # "no inference ran" (status.stage is cleared here, stage_ns holds only the stages that ended)
            ended_stage=self.current_stage if state in ("stopped", "failed") else None,
            error=error,
            degraded=[f.to_dict() for f in self.process_failures],
            finished_wall_ns=time.time_ns(),
            stage_ns=self.stage_ns,
            lateness_ns=self.lateness_ns,
        )
        if unwritten:  # the run is over all the same: the console has its end state
            self.reporter.warn(f"the run's end state is not recorded: {unwritten}")
        self.variant.finished(run, state)
        self.reporter.info(f"run {state}: {run.path}" + (f" ({error})" if error else ""))
        self.reporter.close()
        return RunResult(run.path, scn.label, state, error, self.stage_ns, self.lateness_ns, optimum)

    def dry_run(self, work_dir: Path) -> str | None:
        """Preflight and apply in Ansible check mode in a run directory under ``work_dir``.

        Nothing is journaled, changed or started, so there is no teardown; the stages' results are
        in :attr:`outcomes` (:mod:`dit.run.dryrun` reads them). Returns the error, or None.
        """
        if not self.options.check:
            raise ValueError("Driver.dry_run needs RunOptions(check=True)")
        self.run = RunDir.create(work_dir, self.scenario.name, self.scenario.hash)
        self.node = self.variant.node(self.run)
        self.reporter = Reporter(self.run.log, self.options.console, f"{self.scenario.label} (dry run)")
        error: str | None = None
        with self.stop.signals(), self.reporter.live():
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
            finally:
                self._close_session()
        self.reporter.close()
        return error

    def _inventory(self) -> RunInventory:
        if self.options.inventory is None:
            return local_inventory(self.run.path, self.scenario.devices)
        return load_inventory(self.options.inventory, self.scenario.devices)

    def _prepare(self) -> None:
        scn = self.scenario
        self.model = profile.scenario_model(scn, self.local, self.options.allow_stand_in, self.reporter_warn)
        device_dir = self.run.path / "device"
        device_dir.mkdir(exist_ok=True)
        self.pyz, self.pyz_sha256 = self.variant.device_code(device_dir)
        self.key = profile.write_run_key(device_dir)
        self.contexts = self._host_contexts()
        self.conditions = build_conditions(scn, self.contexts)
        self.processes = process_settings(scn, self.contexts)

    def _host_contexts(self) -> dict[str, HostContext]:
        return host_contexts(self.inv, self.node.run_id)

    def _common_vars(self) -> dict[str, Any]:
        return {
            "dit_run_id": self.node.run_id,
            "dit_journal_path": str(self.node.journal),
            # every node's run directory as the journal's undo scope has it: no default spelled twice
            "dit_node_roots": {h: self.inv.node_root(h, self.node.run_id) for h in self.inv.hosts},
            "dit_device_pyz_sha256": self.pyz_sha256,
            **process_vars(self.processes),
        }

    def _begin(self, stage: str) -> int:
        assert self.reporter is not None
        self.stop.check()
        self.current_stage = stage
        self.run.set_status(stage=stage)
        self.reporter.stage(stage, "running")
        return time.monotonic_ns()

    def _end(self, stage: str, start_ns: int, state: str) -> None:
        """A stage's wall time in status.json at once: a killed driver leaves the ended stages' times."""
        assert self.reporter is not None
        self.stage_ns[stage] = time.monotonic_ns() - start_ns
        self.run.set_status(stage_ns=self.stage_ns)
        self.reporter.stage(stage, state, self.stage_ns[stage] / 1e6)

    def _stage(
        self, stage: str, extravars: dict[str, Any], render_context: dict[str, Any] | None = None
    ) -> StageOutcome:
        assert self.reporter is not None
        start = self._begin(stage)
        if self.session is None:  # preflight to teardown in one ansible-playbook start
            self.session = node_session(
                self.run, self.inv, self.reporter, self.stop, self._apply_context(), self.options.check
            )
        extravars = {**self._common_vars(), **extravars}
        self.outcomes[stage] = outcome = self.session.run(stage, extravars, render_context or {})
        if outcome.status == "canceled" or (self.stop.reason and stage != "teardown"):
            self._end(stage, start, "stopped")  # not "failed": the console says what happened
            raise Stopped(self.stop.reason or "cancel")
        if not outcome.ok or outcome.failures():
            self._end(stage, start, "failed")
            failures = "; ".join(f"{e.host}: {e.message()}" for e in outcome.failures())
            raise StageFailed(f"{stage} failed: {failures or outcome.status}")
        self._end(stage, start, "done")
        return outcome

    def _apply_context(self) -> dict[str, Any]:
        return applying.render_context(self.conditions, self.runtime)

    def _close_session(self) -> None:
        if self.session is not None:
            self.session.close()

    def _timed(self, stage: str, work: Callable[[], Any]) -> Any:
        start = self._begin(stage)
        try:
            result = work()
        except Exception:
            self._end(stage, start, "failed")
            raise
        self._end(stage, start, "done")
        return result

    # -- stages ------------------------------------------------------------------------------
    def _preflight(self) -> None:
        env = runtime_envs.expected_env(self.runtime.name)
        checked = {
            "dit_lease_dirs": {h: self.inv.lease_dir(h) for h in self.inv.hosts},
            "dit_break_stale_lease": self.options.break_stale_lease,
            "dit_ping_targets": self._ping_targets(),
            **runtime_checks(self.scenario),
        }
        nodes = self.variant.preflight(self.run, checked, self._stage, self.inv.hosts, self.reporter)
        # what depends on the nodes' facts (netem's backend) is settled first: the metadata says so
        self.conditions = resolve_conditions(
            PreflightFacts(self.scenario, nodes, self.conditions, self.inv.hostvars, self.local)
        )
        pythons = runtime_envs.pythons_of(self.inv.hosts, self.inv.hostvars)
        record = runtime_envs.runtime_record(
            self.runtime.name, self.runtime.version, self.scenario.runtime, env, nodes, pythons
        )
        self.runtime_pythons = record.pythons
        for warning in record.warnings:
            self.reporter_warn(warning)
        metadata = run_metadata(
            self.run.run_id,
            self.scenario,
            local=self.local,
            inventory=self.inv.source,
            model=profile.model_record(self.model),
            runtime=record.metadata,
            conditions=self.conditions,
            processes=self.processes,
            nodes=nodes,
        )
        self.variant.write_metadata(self.run, metadata)
        self._ntp_gate(nodes)
        self._condition_gates(nodes)
        edge, warn = self.inv.edge_host, self.reporter_warn
        gates.runtime_gate(self.runtime, self.scenario, edge, nodes, check=self.options.check, warn=warn)

    def _ntp_gate(self, nodes: dict[str, Any]) -> None:
        gates.ntp_gate(self.scenario, nodes)

    def _condition_gates(self, nodes: dict[str, Any]) -> None:
        facts = PreflightFacts(self.scenario, nodes, self.conditions, self.inv.hostvars, self.local)
        gates.condition_gates(facts, self.reporter_warn)

    def _apply(self) -> None:
        applied = self.variant.to_apply(self.conditions)  # in a sweep unit, not what is in force alike
        edge_root = self.contexts[self.inv.edge_host].node_root
        at_start = applying.edge_profiles_at_start(self.scenario, self.runtime)
        start_at = f"{edge_root}/{EDGE_START_AT_FILE}" if at_start else None
        outcome = self._stage(
            "apply",
            {
                "dit_device_pyz": str(self.pyz),
                "dit_edge_key": str(self.key),
                "dit_edge_config": profile.edge_config(
                    self.scenario, self.node.run_id, profile.model_spec(self.model), start_at, edge_root
                ),
                "dit_conditions": applied,
            },
            applying.render_context(applied, self.runtime),
        )
        if self.options.check:
            return  # a dry run started nothing: no port to read, nothing to settle
        if uses_edge_service(self.runtime):
            self.edge_port = applying.edge_port(outcome, self.inv.edge_host)
            self.reporter_info(f"edge service listening on {self.inv.edge_address}:{self.edge_port}")
        else:
            self.reporter_info(f"edge service not started: runtime {self.runtime.name} does not use it")
        applying.report_applied(self.scenario, outcome, self.run, self.reporter_info, self.reporter_warn)
        applying.settle(float(self.scenario.timing.settle_s), self.stop, self.reporter_info)

    def _follow(self) -> None:
        """Device stdout/stderr into run.log, live, until teardown (see :mod:`dit.run.follow`)."""
        if self.reporter is not None:
            self.follower = LogFollower(targets_for(self.contexts), self.node.run_id, self.reporter.line)
            self.follower.start()

    def reporter_info(self, text: str) -> None:
        if self.reporter is not None:
            self.reporter.info(text)

    def reporter_warn(self, text: str) -> None:
        if self.reporter is not None:
            self.reporter.warn(text)

    def _launch_context(self, ports: Mapping[str, tuple[int, ...]]) -> LaunchContext:
        return profile.launch_context(
            self.scenario,
            self.node.run_id,
            self.contexts,
            edge_host=self.inv.edge_host,
            local=self.local,
            model=profile.model_spec(self.model),
            edge_port=self.edge_port,
            runtime_pythons=self.runtime_pythons,
            ports=ports,
        )

    def _profile(self) -> None:
        lead_ns = int(float(self.scenario.timing.start_lead_s) * 1e9)
        ports = profile.allocate_ports(self.run.run_id, self.inv.hosts, local=self.local)
        add_metadata(self.run.path / "metadata.json", runtime_ports=ports)
        launched = runtime_launch.launch_vars(self.runtime, self._launch_context(ports), self.inv.hosts)
        stage_vars: dict[str, Any] = {"dit_launch_specs": launched, "dit_start_lead_ns": lead_ns}
        # the start task writes the instant on the edge too
        if applying.edge_profiles_at_start(self.scenario, self.runtime):
            stage_vars["dit_edge_start_at_file"] = EDGE_START_AT_FILE
        outcome = self._stage("profile", stage_vars)
        outcomes = runtime_launch.outcomes(outcome, launched)
        self.lateness_ns.update(self.runtime.started(outcomes))
        start_wait = profile.start_waits(outcomes)
        margins = runtime_launch.start_margins(outcome, launched)
        for host, margin_ns in margins.items():
            if host in start_wait:
                start_wait[host]["start_margin_ns"] = margin_ns
        late = profile.late_start(margins)
        if late:
            self.reporter_warn(late)
        if start_wait:  # how each agent waited for the start instant (absolute sleep, SCHED_FIFO, spin)
            self.run.set_status(start_wait=start_wait)
            add_metadata(self.run.path / "metadata.json", start_wait=start_wait)
        lateness = profile.lateness_line(self.lateness_ns)
        if lateness:
            self.reporter_info(lateness)

    def _ping_targets(self) -> dict[str, list[dict[str, str]]]:
        """Every device's links: to the edge server, then to each other device of the scenario."""
        sources = {d: self.inv.source_of(d) for d in self.scenario.devices if self.inv.source_of(d)}
        return link_targets(self.scenario.devices, self._addresses(), self.inv.edge_host, sources)

    def _addresses(self) -> dict[str, str]:
        return {h: self.inv.address_of(h) for h in self.inv.hosts}

    def _collect(self) -> None:
        raw = self.run.path / "raw"
        self._stage(
            "collect",
            {
                **iperf3_vars(self.scenario, self._addresses()),
                "dit_edge_address": self.inv.edge_address,
                "dit_edge_port_actual": self.edge_port,
                "dit_raw_dir": str(raw),
                "dit_ping_targets": self._ping_targets(),
                "dit_runtime_facts": node_facts_of(self.runtime, self.scenario.runtime),
            },
        )
        self.process_failures = collected(raw, self.inv.hosts)
        if uses_edge_service(self.runtime):
            report_edge_channel(self.run, raw, self.inv.edge_host, self.reporter_warn)
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
        self._timed("aggregate", lambda: analyse.aggregate(self.analysed, self.runtime, self.reporter_info))

    def _optimise(self) -> dict[str, Any] | None:
        skipped = analyse.optimise_skipped(self.scenario)
        if skipped is not None:
            assert self.reporter is not None
            self.reporter.stage("optimise", "skipped")
            self.reporter_info(f"optimise skipped: {skipped}")
            self.run.set_status(skipped={"optimise": skipped})
            return None
        opt = self.scenario.optimisation
        result: dict[str, Any] = self._timed(
            "optimise", lambda: analyse.optimise(self.analysed, self.scenario)
        )
        self.reporter_info(
            f"optimum ({opt.algorithm}, {opt.objective}, {opt.policy}): {result.get('vector')}"
        )
        return result
