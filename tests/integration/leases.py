"""What the lease tests share (test_leases.py, test_stop_and_cleanup.py): the local lease file, the
``dit`` command, and the checks of a run refused in preflight."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dit.report.labels import run_outcome
from dit.run.journal import Journal
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, dit_env, write_scenario


def lease_file() -> Path:
    return Path(os.environ["DIT_LOCAL_LEASE_DIR"]) / "lease.json"


def dit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DIT, *args], cwd=REPO, env=dit_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def only_run(runs_dir: Path) -> RunDir:
    (status,) = runs_dir.glob("*/*/status.json")
    return RunDir(status.parent)


def tiny_scenario(directory: Path, **overrides: object) -> Path:
    """The smallest complete local run (one device, one profiling pass, no inference, no optimisation):
    the tests below need a run that takes and releases the lease, not its measurements."""
    fields: dict[str, object] = {
        "name": "tiny",
        "devices": ["device1"],
        "repetitions": 1,
        "warmup": 0,
        "inference": {"enabled": False},
        "optimisation": {"enabled": False},
    }
    return write_scenario(directory, **{**fields, **overrides})


def assert_refused_and_untouched(run: RunDir, before: bytes) -> None:
    """Refused in preflight: no change journaled, no node directory, no process, the lease intact."""
    status = run.status()
    assert status["state"] == "failed" and status["teardown"]["ok"] is True
    # its report and run page say a lease refused it (issue 36), not "no inference ran"
    assert (run_outcome(status) or "").startswith("Refused by a node's lease during the preflight stage")
    assert Journal(run.journal).records() == []
    assert not any((run.path / "nodes").glob(f"*/{run.run_id}"))
    assert run_processes(run.run_id) == []
    assert lease_file().read_bytes() == before
