"""`dit reproduce ch4 --size quick` in local mode, for real: both policies run, the report holds the delay
model's validation per policy, the four optimisers with their gaps and the energy objectives, and a second
invocation reuses both runs (resuming by scenario hash) instead of running them again.

It replaces the slow phase's run of the small ch4_validation sweep: the runs it makes are that sweep's
(the shipped scenario reduced, AlexNet's fake stand-in), and `dit show`, `dit ls` and the sweep's
`dit report` are checked on them here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO, dit_env

pytestmark = pytest.mark.slow


def dit(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DIT, *args], cwd=REPO, env=dit_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def test_reproduce_ch4_quick_reports_validation_optimisers_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "ch4"
    done = dit("reproduce", "ch4", "--out", str(out), timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"report: {out / 'report.html'}" in done.stdout
    record = json.loads((out / "reproduce.json").read_text())
    assert [(v["label"], v["state"], v["reused"]) for v in record["variants"]] == [
        ("ch4_validation[edge_server.policy=RR]", "completed", False),
        ("ch4_validation[edge_server.policy=SJF]", "completed", False),
    ]
    policies = set()
    for variant in record["variants"]:
        run = RunDir(Path(variant["run_dir"]))
        metadata = json.loads((run.path / "metadata.json").read_text())
        policies.add(metadata["scenario"]["document"]["edge_server"]["policy"])
        assert metadata["model"]["spec"]["name"] == "fake"  # AlexNet's stand-in, named in the scenario
        assert metadata["model"]["spec"]["params"] == {"profile": "alexnet"}
        assert metadata["model"]["stand_in_for"] is None  # nothing substituted behind the user's back
        assert run_processes(run.run_id) == []
        shown = dit("show", str(run.path))
        assert shown.returncode == 0 and "completed" in shown.stdout
    assert policies == {"RR", "SJF"}
    listed = dit("ls", "--runs-dir", str(out / "runs"))
    assert listed.returncode == 0 and listed.stdout.count("completed") == 2
    sweep = dit("report", str(out / "runs" / "ch4_validation"), "-o", str(tmp_path / "sweep.html"))
    assert sweep.returncode == 0, sweep.stderr
    assert (tmp_path / "sweep.html").read_text().count("<td>completed</td>") == 2

    html = (out / "report.html").read_text()
    for anchor in ("overview", "validation", "optimisers", "energy"):
        assert f'<section id="{anchor}">' in html, anchor
    for policy in ("RR", "SJF"):
        mape = re.search(rf"<td>MAPE, {policy}</td><td>([0-9.]+) %</td>", html)
        assert mape, f"no measured MAPE for {policy}"
        verdict = "reproduces" if float(mape.group(1)) <= 10 else "does not reproduce"
        assert re.search(rf"<td>MAPE, {policy}</td>.*?<td>{verdict}", html, re.S)
        for algorithm in ("greedy", "trend", "exhaustive", "exact"):
            assert re.search(rf"<td>{policy}</td><td>{algorithm}</td>", html), (policy, algorithm)
    assert (out / "validation" / "validation.csv").is_file()
    assert "fake power sensor" in html.lower()  # local mode's power is labelled, never a measurement
    assert "2 cores" in html or "cores</td><td>" in html

    again = dit("reproduce", "ch4", "--out", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("already finished") == 2
    record = json.loads((out / "reproduce.json").read_text())
    assert all(v["reused"] for v in record["variants"])
    assert len(list((out / "runs" / "ch4_validation").iterdir())) == 2  # no third run
