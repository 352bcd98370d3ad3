"""A sweep as one unit on its nodes: the difference plan between two variants' conditions, and the
sweep's journal across variants (what stays in force between them, what the last teardown undoes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dit.run.journal import Journal
from dit.run.sweep import condition_plan, keep_records, spared, to_apply, unshaped
from dit.run.sweep_variant import preflights_again, runtime_checks
from dit.scenario import load
from tests.conftest import REPO, write_scenario


def cpufreq(khz: int) -> dict[str, Any]:
    return {"cpufreq_max_khz": khz}


def memory(limit: int) -> dict[str, Any]:
    return {"cgroup_memory_path": "/sys/fs/cgroup/memory/dit-r-device1", "cgroup_memory_limit_bytes": limit}


def test_the_plan_keeps_what_both_variants_apply_alike_and_undoes_and_applies_the_rest() -> None:
    before = {
        "device1": {"cpufreq": cpufreq(1_200_000), "memory": memory(256), "netem": {"delay": 5}},
        "device2": {"cpufreq": cpufreq(600_000)},
        "edge": {"background_traffic": {"rate": 1}},
    }
    after = {
        "device1": {"cpufreq": cpufreq(600_000), "memory": memory(256), "netem": {"delay": 5}},
        "device2": {"memory": memory(128)},
        "edge": {"background_traffic": {"rate": 1}},
    }
    plan = condition_plan(before, after)
    assert plan.keep == {
        "device1": frozenset({"memory", "netem"}),
        "device2": frozenset(),
        # applied after the edge service starts (traffic towards it): every variant starts it anew
        "edge": frozenset(),
    }
    assert plan.undo == {
        "device1": frozenset({"cpufreq"}),
        "device2": frozenset({"cpufreq"}),
        "edge": frozenset({"background_traffic"}),
    }
    assert plan.apply == {
        "device1": frozenset({"cpufreq"}),
        "device2": frozenset({"memory"}),
        "edge": frozenset({"background_traffic"}),
    }
    assert to_apply(after, {h: {n: before[h][n] for n in names} for h, names in plan.keep.items()}) == {
        "device1": {"cpufreq": cpufreq(600_000)},
        "device2": {"memory": memory(128)},
        "edge": {"background_traffic": {"rate": 1}},
    }


def test_a_condition_whose_process_varies_over_time_is_undone_with_the_variant() -> None:
    # netem-vary plays its delay timeline from its start: the next variant needs its own from the start
    same = {"device1": {"netem": {"delay": 5}, "monitors": {"period": 1}}}
    pending = [
        {"host": "device1", "op": "process", "role": "netem", "undo": {"tag": "link-emulator"}},
        {"host": "device1", "op": "process", "role": "netem", "undo": {"tag": "netem-vary"}},
    ]
    plan = condition_plan(same, same, pending)
    assert plan.keep["device1"] == frozenset({"monitors"})  # monitors: none of its processes pending here
    assert plan.apply["device1"] == frozenset({"netem"})
    assert spared(plan, pending) == {}


def test_the_link_emulator_and_the_monitors_stay_running_with_their_node_directory() -> None:
    """Processes that hand a variant over (the link emulator, the monitor) keep their condition in
    force: their records, the NFQUEUE rules and the run directory they run in stay; on a host without
    one the run directory goes as before."""
    same = {
        "device1": {"netem": {"delay": 5}, "monitors": {"period": 1}},
        "device2": {"memory": memory(256)},
    }
    rules = {"host": "device1", "op": "command", "role": "netem", "undo": {"argv": ["iptables", "-X", "DIT"]}}
    emulator = {"host": "device1", "op": "process", "role": "netem", "undo": {"tag": "link-emulator"}}
    monitor = {"host": "device1", "op": "process", "role": "monitors", "undo": {"tag": "monitor"}}
    edge = {"host": "device1", "op": "process", "undo": {"tag": "edge"}}  # a variant's own process
    node1 = {"host": "device1", "op": "mkdir", "source": "dit_node", "undo": {"path": "/n/r"}}
    node2 = {"host": "device2", "op": "mkdir", "source": "dit_node", "undo": {"path": "/n/r"}}
    pending = [rules, emulator, monitor, edge, node1, node2]
    plan = condition_plan(same, same, pending)
    assert plan.keep == {"device1": frozenset({"netem", "monitors"}), "device2": frozenset({"memory"})}
    spare = spared(plan, pending)
    assert spare == {"device1": frozenset({"link-emulator", "monitor"})}
    keep = keep_records(plan, spare)
    assert [r for r in pending if not keep(r)] == [edge, node2]
    # a delay that changes: the emulator, its rules and (no process left to keep it) the directory go
    changed = {**same, "device1": {"netem": {"delay": 7}, "monitors": {"period": 1}}}
    plan = condition_plan(same, changed, pending)
    spare = spared(plan, pending)
    assert spare == {"device1": frozenset({"monitor"})}
    assert [r for r in pending if not keep_records(plan, spare)(r)] == [rules, emulator, edge, node2]


def test_the_sweep_journal_across_variants(tmp_path: Path) -> None:
    """Variant 1 changes cpufreq and memory on device1 and starts a process; variant 2 keeps the memory
    limit and changes the cap: between them the process, the node directory and the cap are undone,
    the memory limit and the lease stay; the last teardown then undoes everything, newest first."""
    journal = Journal(tmp_path / "journal.jsonl")
    record = journal.record_changes
    (lease,) = record("device1", [{"op": "lease", "undo": {"path": "/l/lease.json"}}], "dit_lease")
    (node,) = record("device1", [{"op": "mkdir", "undo": {"path": "/n/r"}}], "dit_node")
    (cap1,) = record(
        "device1",
        [{"op": "file", "undo": {"path": "/s/max", "prior": "1800000"}}],
        "dit_sysfs",
        role="cpufreq",
    )
    (group,) = record(
        "device1",
        [{"op": "cgroup", "undo": {"path": "/c/dit-r-device1"}}],
        "dit_cgroup",
        role="cgroup_memory",
    )
    (proc,) = record("device1", [{"op": "process", "undo": {"tag": "load"}}], "dit_proc", role="load")
    first = {"device1": {"cpufreq": cpufreq(1_200_000), "memory": memory(256), "load": {"x": 1}}}
    second = {"device1": {"cpufreq": cpufreq(600_000), "memory": memory(256), "load": {"x": 1}}}

    pending = [dict(c.record) for c in journal.pending()]
    keep = keep_records(condition_plan(first, second, pending))
    undone_between = [r["id"] for r in pending if not keep(r)]
    assert undone_between == [proc, cap1, node]  # newest first, as teardown sends them
    journal.mark_undone(undone_between)

    # variant 2: its node directory, its cap (journaled with variant 1's value gone: the node's own)
    (node2,) = record("device1", [{"op": "mkdir", "undo": {"path": "/n/r"}}], "dit_node")
    (cap2,) = record(
        "device1",
        [{"op": "file", "undo": {"path": "/s/max", "prior": "1800000"}}],
        "dit_sysfs",
        role="cpufreq",
    )
    assert [c.id for c in journal.pending()] == [cap2, node2, group, lease]


def test_a_variant_says_its_place_in_the_sweep_and_the_eta(tmp_path: Path) -> None:
    """What NNPM shows beside a variant of a sweep: read from the home's sweep.json."""
    from dit.run.rundir import write_json
    from dit.run.sweep import SWEEP_FILE, progress_of

    home, second, alone = tmp_path / "home", tmp_path / "second", tmp_path / "alone"
    for d in (home, second, alone):
        d.mkdir()
    variants = [{"run_dir": str(home), "state": "completed"}, {"run_dir": str(second), "state": "running"}]
    write_json(home / SWEEP_FILE, {"home": str(home), "variants": variants, "total": 4, "elapsed_s": 30.0,
                                   "eta_s": 60.0, "state": "running"})  # fmt: skip
    write_json(second / SWEEP_FILE, {"home": str(home), "node_run_id": "x"})
    assert progress_of(second) == {
        "variant": 2,
        "total": 4,
        "elapsed_s": 30.0,
        "eta_s": 60.0,
        "state": "running",
    }
    assert progress_of(home) is not None and progress_of(home)["variant"] == 1  # type: ignore[index]
    assert progress_of(alone) is None
    # a sweep.json naming a home outside the runs directory is read as no sweep's (NNPM lists every run)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere" / "x" / "home"
    elsewhere.mkdir(parents=True)
    write_json(elsewhere / SWEEP_FILE, {"home": str(elsewhere), "variants": variants, "total": 4})
    write_json(alone / SWEEP_FILE, {"home": str(elsewhere), "node_run_id": "x"})
    assert progress_of(alone) is None


def test_a_variant_that_runs_the_preflight_again_has_the_delay_undone_before_it(tmp_path: Path) -> None:
    """The preflight pings every link unshaped (its baselines): a variant whose runtime makes the preflight
    run again must not find the delay the variant before left in force, which the plan then undoes and
    its apply applies again; a variant reusing the unit's preflight keeps it."""
    (layers,) = load(write_scenario(tmp_path, name="a"))
    (other_seed,) = load(write_scenario(tmp_path, name="b", seed=8))
    headsplit = load(REPO / "scenarios" / "ch6_headsplit.yaml")[0]
    checked = {
        "dit_lease_dirs": {"device1": "/var/lib/dit"},
        "dit_ping_targets": {},
        **runtime_checks(layers),
    }
    recorded = json.dumps(checked, sort_keys=True, default=str)
    assert not preflights_again(recorded, other_seed)
    assert preflights_again(recorded, headsplit)
    assert preflights_again(None, layers)

    in_force = {"device1": {"netem": {"delay": 5}, "memory": memory(256)}}
    for again, kept in ((False, {"netem", "memory"}), (True, {"memory"})):
        plan = condition_plan(in_force, unshaped(in_force, again))
        assert plan.keep["device1"] == frozenset(kept)
        assert plan.apply["device1"] == frozenset()  # what the plan sees; the variant's apply applies netem
    assert to_apply(in_force, unshaped(in_force, True)) == {"device1": {"netem": {"delay": 5}}}
