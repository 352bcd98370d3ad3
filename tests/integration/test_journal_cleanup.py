"""`dit cleanup` against journals a crash or an adversary left: torn lines, records that reach
outside the run, and node results that were never fetched (kept on the node while they cannot be).

Each test builds the run directory a local-mode driver killed after apply leaves behind (the
inventory, the node directories with their fake /sys, a journal of real-looking changes) and runs
the real `dit cleanup` on it: the teardown playbook and dit_restore do the undoing.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from dit.run.inventory import local_inventory
from dit.run.journal import Journal
from dit.run.rundir import DRIVER, RunDir, write_json
from tests.conftest import DIT, REPO, dit_env

POLICY = "devices/system/cpu/cpufreq/policy0"


@dataclass
class StaleRun:
    run: RunDir
    node_root: Path  # device1's run directory (nodes/device1/<run id>)
    max_freq: Path  # device1's fake scaling_max_freq, capped by the "apply"
    legit: list[str]  # ids of the journaled changes a real apply would have made

    def cleanup(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*DIT, "cleanup", str(self.run.path)],
            cwd=REPO,
            env=dit_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )


@pytest.fixture
def stale(tmp_path: Path) -> StaleRun:
    run = RunDir.create(tmp_path / "runs", "stale", "0123456789abcdef")
    (run.path / "scenario.yaml").write_text("name: stale\ndevices: [device1]\n", encoding="utf-8")
    write_json(run.path / DRIVER, {"pid": 0, "run_id": run.run_id, "local": True, "inventory": None})
    run.set_status(state="running", stage="profile")
    inv = local_inventory(run.path, ("device1",))
    node_root = Path(inv.hostvars["device1"]["dit_remote_base"]) / run.run_id
    (node_root / "results").mkdir(parents=True)
    (node_root / ".dit-run").write_text(run.run_id, encoding="utf-8")
    max_freq = Path(inv.hostvars["device1"]["sysfs_root"]) / POLICY / "scaling_max_freq"
    prior = max_freq.read_text(encoding="utf-8")
    journal = Journal(run.journal)
    legit = journal.record_changes(
        "device1", [{"op": "mkdir", "undo": {"path": str(node_root), "run_id": run.run_id}}], "dit_node"
    )
    legit += journal.record_changes(
        "device1", [{"op": "file", "undo": {"path": str(max_freq), "prior": prior}}], "dit_sysfs"
    )
    max_freq.write_text("1200000\n", encoding="utf-8")
    return StaleRun(run, node_root, max_freq, legit)


def _tear_last_line(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    head, _, last = text.rstrip("\n").rpartition("\n")
    path.write_text(head + "\n" + last[: len(last) // 2], encoding="utf-8")


@pytest.mark.parametrize("where", ["end", "middle"])
def test_cleanup_of_a_torn_journal_succeeds_twice_and_warns(stale: StaleRun, where: str) -> None:
    journal = Journal(stale.run.journal)
    journal.record_changes(
        "device1",
        [{"op": "process", "undo": {"run_id": stale.run.run_id, "host": "device1", "tag": "x"}}],
        "m",
    )
    _tear_last_line(stale.run.journal)
    torn_line = len(stale.run.journal.read_text(encoding="utf-8").splitlines())
    if where == "middle":  # the run went on after the torn write
        stale.legit += journal.record_changes(
            "device1",
            [{"op": "process", "undo": {"run_id": stale.run.run_id, "host": "device1", "tag": "y"}}],
            "m",
        )

    for attempt in (1, 2):
        done = stale.cleanup()
        output = done.stdout + done.stderr
        assert done.returncode == 0, (attempt, output)
        assert "Traceback" not in output
        assert f"journal.jsonl:{torn_line}: torn or invalid record skipped" in output, (attempt, output)
        last = json.loads(stale.run.journal.read_text(encoding="utf-8").splitlines()[-1])
        assert "undone" in last
    assert Journal(stale.run.journal).pending() == []
    assert stale.max_freq.read_text(encoding="utf-8").strip() == "1800000"
    assert not stale.node_root.exists()


def test_cleanup_refuses_records_outside_the_run_and_still_undoes_the_rest(
    stale: StaleRun, tmp_path: Path
) -> None:
    run_id = stale.run.run_id
    victim = tmp_path / "victim.txt"
    victim.write_text("safe\n", encoding="utf-8")
    keep = tmp_path / "keep.txt"
    keep.write_text("keep\n", encoding="utf-8")
    directory = tmp_path / "x"
    directory.mkdir()
    pwned = tmp_path / "pwned"
    escape = stale.node_root / "results" / "escape"
    escape.symlink_to(victim)
    # The run shaped lo (local mode: tc argv recorded in the dry-run log beside the run directory).
    tc_log = f"{stale.node_root}.tc.jsonl"
    conditions = {"device1": {"netem": {"netem_interface": "lo", "netem_netns": "", "netem_log": tc_log}}}
    write_json(stale.run.path / "metadata.json", {"run_id": run_id, "conditions": conditions})
    journal = Journal(stale.run.journal)
    stale.legit += journal.record_changes(
        "device1",
        [{"op": "command", "undo": {"argv": ["tc", "qdisc", "del", "dev", "lo", "root"], "dry_run": True,
                                     "log": tc_log, "ignore_errors": True}}],
        "dit_tc",
    )  # fmt: skip
    hostile = {
        "overwrite": {"op": "file", "undo": {"path": str(victim), "prior": "pwned\n"}},
        "delete": {"op": "file", "undo": {"path": str(keep), "prior": None}},
        "dotdot": {"op": "file", "undo": {"path": f"{stale.node_root}/../../../../victim.txt", "prior": "x"}},
        "symlink": {"op": "file", "undo": {"path": str(escape), "prior": "pwned\n"}},
        "rmdir": {"op": "rmdir", "undo": {"path": str(directory)}},
        "touch": {"op": "command", "undo": {"argv": ["touch", str(pwned)], "dry_run": False}},
        "other interface": {"op": "command", "undo": {"argv": ["tc", "qdisc", "del", "dev", "dit-nosuch0", "root"]}},
        "other log": {"op": "command", "undo": {"argv": ["tc", "qdisc", "del", "dev", "lo", "root"],
                                                  "dry_run": True, "log": str(victim)}},
        "other run": {"op": "process", "undo": {"run_id": "another-run", "host": "device1", "tag": "edge"}},
    }  # fmt: skip
    ids = {
        name: journal.record_changes("device1", [record], "intruder")[0] for name, record in hostile.items()
    }

    done = stale.cleanup()
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output
    for name, change_id in ids.items():
        assert f"record {change_id}" in output, (name, output)
    assert "is outside" in output and "not an interface this run shaped" in output
    # None of it happened ...
    assert victim.read_text(encoding="utf-8") == "safe\n"
    assert keep.exists() and directory.is_dir() and not pwned.exists()
    # ... and every legitimate record was undone all the same.
    assert stale.max_freq.read_text(encoding="utf-8").strip() == "1800000"
    assert not stale.node_root.exists()
    recorded = [json.loads(line) for line in Path(tc_log).read_text(encoding="utf-8").splitlines()]
    assert recorded == [{"argv": ["tc", "qdisc", "del", "dev", "lo", "root"], "undo": True}]
    pending = {c.id for c in Journal(stale.run.journal).pending()}
    assert pending == set(ids.values())  # refused records stay pending: every cleanup reports them


def test_cleanup_fetches_unfetched_node_results_into_raw_or_says_what_it_dropped(stale: StaleRun) -> None:
    results, logs = stale.node_root / "results", stale.node_root / "logs"
    logs.mkdir()
    (results / "profile.csv").write_text("stage,ns\n0,1\n", encoding="utf-8")
    (results / "monitor.csv").write_text("t,cpu\n", encoding="utf-8")
    (logs / "agent.log").write_text("started\n", encoding="utf-8")
    raw = stale.run.path / "raw" / "device1"

    done = stale.cleanup()
    assert done.returncode == 0, done.stdout + done.stderr
    assert not stale.node_root.exists()
    # Named as the collect stage names them (driver.extract_collected).
    assert (raw / "device1_profile.csv").read_text(encoding="utf-8") == "stage,ns\n0,1\n"
    assert (raw / "device1_monitor.csv").exists()
    assert (raw / "logs" / "device1_agent.log").read_text(encoding="utf-8") == "started\n"
    assert "without being fetched" not in done.stdout + done.stderr


def test_cleanup_fetches_per_file_what_raw_lacks_and_leaves_what_collect_fetched(stale: StaleRun) -> None:
    (stale.node_root / "results" / "profile.csv").write_text("stage,ns\n0,1\n", encoding="utf-8")
    (stale.node_root / "results" / "late.csv").write_text("written after collect\n", encoding="utf-8")
    raw = stale.run.path / "raw" / "device1"
    raw.mkdir(parents=True)  # collect ran before late.csv was written (and before profile.csv grew)
    (raw / "device1_profile.csv").write_text("stage,ns\n", encoding="utf-8")

    done = stale.cleanup()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert (raw / "device1_late.csv").read_text(encoding="utf-8") == "written after collect\n"
    assert (raw / "device1_profile.csv").read_text(encoding="utf-8") == "stage,ns\n"  # what collect fetched
    assert not stale.node_root.exists()
    assert f"fetched 1 file(s) of device1's results and logs the collect stage had not into {raw}" in output
    assert "without being fetched" not in output
    assert "results/late.csv" in stale.run.log.read_text(encoding="utf-8")


def _block_raw(stale: StaleRun) -> Path:
    """Make ``raw/device1/`` impossible to create, so that no fetch into it can succeed."""
    (stale.node_root / "results" / "inference.csv").write_text("round,ns\n0,5\n", encoding="utf-8")
    (stale.node_root / "logs").mkdir()
    (stale.node_root / "logs" / "profile.err").write_text("warning\n", encoding="utf-8")
    blocker = stale.run.path / "raw" / "device1"
    blocker.write_text("not a directory\n", encoding="utf-8")
    return blocker


def test_a_result_that_cannot_be_fetched_keeps_the_node_directory_and_says_so(stale: StaleRun) -> None:
    blocker = _block_raw(stale)

    done = stale.cleanup()
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0, output
    assert "Traceback" not in output
    assert (
        f"device1: kept {stale.node_root} on the node: 2 file(s) there are not in {blocker} "
        "(results/inference.csv (13 bytes), logs/profile.err (8 bytes)); "
        "fetching failed: results/inference.csv: Not a directory"
    ) in output
    assert f"'dit cleanup --discard-results {stale.run.path}' deletes them" in output
    assert "journal changes not undone" not in output  # the kept directory is the one thing left
    # The results are where they were; everything else of the run is undone.
    assert (stale.node_root / "results" / "inference.csv").read_text(encoding="utf-8") == "round,ns\n0,5\n"
    assert (stale.node_root / "logs" / "profile.err").is_file()
    assert stale.max_freq.read_text(encoding="utf-8").strip() == "1800000"
    assert [c.op for c in Journal(stale.run.journal).pending()] == ["mkdir"]

    # Once raw/ can take them, the next cleanup fetches them and removes the directory.
    blocker.unlink()
    again = stale.cleanup()
    assert again.returncode == 0, again.stdout + again.stderr
    raw = stale.run.path / "raw" / "device1"
    assert (raw / "device1_inference.csv").read_text(encoding="utf-8") == "round,ns\n0,5\n"
    assert (raw / "logs" / "device1_profile.err").read_text(encoding="utf-8") == "warning\n"
    assert not stale.node_root.exists()
    assert Journal(stale.run.journal).pending() == []


def test_discard_results_deletes_what_cannot_be_fetched_and_says_what(stale: StaleRun) -> None:
    _block_raw(stale)
    done = subprocess.run(
        [*DIT, "cleanup", "--discard-results", str(stale.run.path)],
        cwd=REPO,
        env=dit_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, output
    assert not stale.node_root.exists()
    assert (
        "deleted with --discard-results, never fetched into raw/: device1:results/inference.csv (13 bytes), "
        "device1:logs/profile.err (8 bytes)"
    ) in output
    assert Journal(stale.run.journal).pending() == []


def test_an_unreadable_journal_is_a_one_line_error_not_a_traceback(stale: StaleRun) -> None:
    stale.run.journal.unlink()
    stale.run.journal.mkdir()  # not a file: neither readable nor appendable
    done = stale.cleanup()
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output
    assert "journal.jsonl: cannot read the journal" in output, output
