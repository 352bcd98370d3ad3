"""``DIT_TEST_CPU_LOG``: the CPU time each test costs, its own and its waited-for children's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import CPU_LOG, REPO

SPIN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
BURN = f"""
import subprocess, sys

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", {SPIN!r}], check=True)

def test_idle():
    pass
"""


def test_each_test_appends_its_cpu_its_wall_time_and_its_node_id(tmp_path: Path) -> None:
    (tmp_path / "test_burn.py").write_text(BURN, encoding="utf-8")
    log = tmp_path / "cpu.log"
    env = {**os.environ, CPU_LOG: str(log)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        line.split("\t")[2]: line.split("\t")[:2] for line in log.read_text(encoding="utf-8").splitlines()
    }
    burn = next(cpu for node, cpu in rows.items() if node.endswith("::test_burns_in_a_child"))
    idle = next(cpu for node, cpu in rows.items() if node.endswith("::test_idle"))
    assert float(burn[0]) >= 0.4  # the child's CPU counts, once it is waited for
    assert float(burn[1]) >= 0.4
    assert float(idle[0]) < 0.2
