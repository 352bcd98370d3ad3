"""One run's use of its nodes: a run of its own, or a variant of a sweep run as one unit (:mod:`dit.run.sweep`).

The driver sequences a run's stages and names no sweep: at each point where a unit's variant differs
from a run of its own it asks :class:`SweepVariant`, which decides here:

- the run id and journal the nodes carry (:meth:`~SweepVariant.node`): the unit's home's;
- the inventory and the device zipapp: the unit's first variant's, shared by the others;
- the preflight: run, or the unit's reused when it would check the same things (its baselines copied);
- what apply applies: the conditions not in force alike already; the metadata's ``sweep`` block;
- the teardown: what the unit's next variant does not keep in force, or everything.

Without a unit every answer is what a run of its own always had.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit.conditions import PreflightFacts, build_conditions, resolve_conditions
from dit.models.weights import sha256_file
from dit.run import preflight as gates
from dit.run.ansible_exec import StageOutcome
from dit.run.inventory import LOCAL_INVENTORY, RunInventory, host_contexts
from dit.run.lease_decision import controller_holder
from dit.run.rundir import RunDir, write_json, write_text
from dit.run.sweep import DONE_STATES, Built, SweepUnit, to_apply, unshaped
from dit.run.teardown import InSession, NodeScope, teardown
from dit.runtime_api import registry as runtimes
from dit.runtime_api.interface import node_facts_of
from dit.runtimes import envs as runtime_envs
from dit.scenario import Scenario

if TYPE_CHECKING:
    from dit.run.console import Reporter

Stage = Callable[[str, dict[str, Any]], StageOutcome]
"""The driver's stage runner: a node stage's playbook with these variables (:meth:`Driver._stage`)."""


@dataclass
class SweepVariant:
    """A run as a variant of ``unit`` (None: a run of its own, on nodes of its own)."""

    unit: SweepUnit | None = None

    def node(self, run: RunDir) -> NodeScope:
        """The run id and journal on the nodes (processes, cgroups, node directory, lease)."""
        unit_node = self.unit.node if self.unit is not None else None
        return unit_node or NodeScope(run.run_id, run.journal)

    def join(self, run: RunDir, scenario: Scenario) -> NodeScope:
        """``run`` is this variant's directory (the unit's home when it is the first); the run id and
        journal the nodes carry for it."""
        if self.unit is not None:
            self.unit.join(run, scenario)
        return self.node(run)

    def finished(self, run: RunDir, state: str) -> None:
        if self.unit is not None:
            self.unit.finished(run, state)

    def stop_requested(self, run: RunDir) -> bool:
        """``dit stop`` of ``run``, or of the unit's home (NNPM's Stop on it), which stops this variant too."""
        return run.stop_requested() or (self.unit is not None and self.unit.stop_requested())

    def inventory(self, run: RunDir, make: Callable[[], RunInventory]) -> RunInventory:
        """The unit's inventory (made by ``make`` for its first variant), else one of this run's own."""

        unit = self.unit
        if unit is None or unit.inventory is None:
            inventory = make()
            if unit is not None:
                unit.inventory = inventory
            return inventory
        if unit.inventory.local:  # the nodes are the unit's home's: this run says where they are
            text = Path(unit.inventory.source).read_text(encoding="utf-8")
            write_text(run.path / LOCAL_INVENTORY, text)
        return unit.inventory

    def device_code(self, device_dir: Path) -> tuple[Path, str]:
        """The device zipapp and its SHA-256 (what the nodes check the shipped one against): built
        into ``device_dir`` once per unit, whose variants ship the same device code."""
        from dit.device.build import build_zipapp

        if self.unit is not None and self.unit.pyz is not None:
            return self.unit.pyz
        pyz = build_zipapp(device_dir / "dit-device.pyz", extra_packages=["dit/models"])
        built = (pyz, sha256_file(pyz))
        if self.unit is not None:
            self.unit.pyz = built
        return built

    def preflight(
        self,
        run: RunDir,
        checked: Mapping[str, Any],
        stage: Stage,
        hosts: Sequence[str],
        reporter: Reporter | None,
    ) -> dict[str, Any]:
        """Every node's facts: from the preflight ``stage`` run with ``checked`` and the lease to take (in
        a unit its home's), or from the unit's preflight when it checked the same things."""
        unit = self.unit
        key = preflight_key(checked)
        nodes = unit.reused_preflight(key) if unit is not None else None
        if unit is not None and nodes is not None:
            unit.copy_baselines(run, hosts)  # its links.csv needs the unshaped ping baselines
            if reporter is not None:
                reporter.stage("preflight", "skipped")
                reporter.info(f"preflight: the sweep's, from {unit.preflight_run}")
            return nodes
        holder = unit.home if unit is not None and unit.home is not None else run
        lease = controller_holder(self.node(run).run_id, holder.path).to_json()
        outcome = stage("preflight", {"dit_lease": lease, **checked})
        nodes = gates.node_facts(
            outcome, hosts, run.path / "raw", reporter.warn if reporter else lambda _: None
        )
        if unit is not None:
            unit.record_preflight(key, nodes, run)
        return nodes

    def write_metadata(self, run: RunDir, metadata: dict[str, Any]) -> None:
        """``metadata.json``; a variant's names its unit and whose facts, clocks and baselines it has."""
        unit = self.unit
        if unit is not None and unit.home is not None:
            metadata["sweep"] = {
                "home": str(unit.home.path),
                "node_run_id": unit.home.run_id,
                "preflight_run": str(unit.preflight_run),
            }
        write_json(run.path / "metadata.json", metadata)
        if unit is not None:  # the conditions in force, which the unit's undo may touch
            unit.metadata = run.path / "metadata.json"

    def to_apply(self, built: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """What apply applies of ``built``: in a unit, not what the variant before left in force alike.
        All of ``built`` is in force from then on (a variant whose apply fails tears down everything)."""
        if self.unit is None:
            return built
        applied, self.unit.in_force = to_apply(built, self.unit.in_force), built
        return applied

    def teardown(
        self,
        run: RunDir,
        inventory: RunInventory | None,
        reporter: Reporter | None,
        state: str,
        local: bool,
        in_session: InSession | None = None,
    ) -> tuple[str | None, int]:
        """Undo the run (:func:`dit.run.teardown.teardown`; ``in_session``: where its first pass may run);
        in a unit whose next variant follows this completed one, only what that variant changes. The
        error, or None, and the wall time."""
        unit = self.unit
        if unit is None or unit.node is None:
            discard = run.discard_requested()
            return teardown(run, inventory, reporter, discard_results=discard, in_session=in_session)
        inventory = inventory or unit.inventory  # failed before it had one: the unit's nodes
        completed = state in DONE_STATES
        upcoming = self._upcoming(inventory, local, reporter) if completed and inventory is not None else None
        return unit.teardown_variant(run, inventory, reporter, upcoming, in_session)

    def _upcoming(self, inventory: RunInventory, local: bool, reporter: Reporter | None) -> Built | None:
        """The conditions the unit's next variant will build on its nodes (None: no next variant here)."""
        unit = self.unit
        if unit is None or unit.upcoming is None or unit.nodes is None or unit.node is None:
            return None
        scenario = unit.upcoming
        try:
            built = build_conditions(scenario, host_contexts(inventory, unit.node.run_id))
            facts = PreflightFacts(scenario, unit.nodes, built, inventory.hostvars, local)
            # a variant that runs the preflight again pings its links unshaped: its delay goes first
            return unshaped(resolve_conditions(facts), preflights_again(unit.preflight_key, scenario))
        except Exception as exc:  # its own run says why in its own directory; this one tears down all
            if reporter is not None:
                reporter.warn(
                    f"sweep: the next variant's conditions cannot be built ({exc}): tearing down all"
                )
            return None


def runtime_checks(scenario: Scenario) -> dict[str, Any]:
    """What the preflight playbook checks of ``scenario``'s runtime (its environment, checkpoints and
    the node facts it asks for): with the lease, the links and the nodes, what tells whether a sweep's
    variant can reuse the unit's preflight."""
    runtime = runtimes.get(str(scenario.runtime["name"]))
    return {
        "dit_runtime_env": runtime_envs.expected_env(runtime.name).dirname or "",
        "dit_runtime_checkpoints": runtime_envs.checkpoint_paths(runtime.block_schema(), scenario.runtime),
        "dit_runtime_facts": node_facts_of(runtime, scenario.runtime),
    }


def preflights_again(recorded: str | None, scenario: Scenario) -> bool:
    """Whether ``scenario``, the next variant of a unit whose preflight checked ``recorded`` (its key),
    runs the preflight playbook again (the links and nodes are the unit's: its runtime decides)."""
    if recorded is None:
        return True
    checked = json.loads(recorded)
    wanted = json.loads(preflight_key(runtime_checks(scenario)))
    return any(checked.get(key) != value for key, value in wanted.items())


def preflight_key(checked: Mapping[str, Any]) -> str:
    """What a preflight checks (its playbook's variables) as the key a unit compares its variants by."""
    return json.dumps(checked, sort_keys=True, default=str)
