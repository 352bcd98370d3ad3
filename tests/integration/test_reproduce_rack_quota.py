"""`dit reproduce ch6 --where rack` checks the rack's recorded quotas before anything runs.

The rack here is a recorded one: the state dir (``rack.json`` and ``inventory.yml``) as ``dit rack up``
writes them (:func:`dit.rack.plan.state_doc`, :func:`dit.rack.plan.inventory_yaml`), with no
namespaces, cgroups or sshd behind it; ``dit rack status``'s checks then find the nodes missing, which
is not what is asked here. The state dir sits under /var/lib/dit/tests, root's all the way up, as the
rack's own trust check requires (not /tmp).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dit.cli import app
from dit.commands.reproduce import _reproduce_where
from dit.rack.executor import INVENTORY, STATE
from dit.rack.plan import CgroupLayout, RackSpec, inventory_yaml, state_doc

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rack's state dir must be root's (needs root)"),
]
SECURE_BASE = Path("/var/lib/dit/tests")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    SECURE_BASE.mkdir(parents=True, exist_ok=True)
    for directory in (SECURE_BASE.parent, SECURE_BASE):
        directory.chmod(0o755)
    base = Path(tempfile.mkdtemp(prefix="quota-", dir=SECURE_BASE))
    try:
        yield base / "rack-q"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def record_rack(state_dir: Path, cpu_share_pct: int) -> RackSpec:
    """The state dir ``dit rack up --devices 4 --cpu-share N --memory-mb 2048 --name q`` leaves on a
    2-core machine: the edge (controller, link emulators) on CPU 0, the devices sharing CPU 1."""
    spec = RackSpec(
        state_dir, devices=4, cpu_share_pct=cpu_share_pct, memory_mb=2048, name="q",
        cpus="1", all_cpus="0", host_cpus=2,
    )  # fmt: skip
    layout = CgroupLayout(1)
    state_dir.mkdir(mode=0o700)
    (state_dir / INVENTORY).write_text(
        inventory_yaml(spec, sys.executable, netem_dry_run=True, layout=layout)
    )
    doc = state_doc(spec, layout, False, "recorded for a test", state_dir / INVENTORY, 0)
    (state_dir / STATE).write_text(json.dumps(doc, indent=2) + "\n")
    return spec


def test_an_oversubscribed_rack_is_refused_naming_the_command_that_fits(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_rack(state_dir, 40)
    monkeypatch.setenv("DIT_RACK_DIR", str(state_dir))
    out = tmp_path / "ch6"
    result = CliRunner().invoke(
        app, ["reproduce", "ch6", "--where", "rack", "--out", str(out)], terminal_width=400
    )
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "4 devices at --cpu-share 40 ask for 160 % of one CPU but share 1 CPU (1)" in text
    assert (
        f"`dit rack up --devices 4 --cpu-share 25 --memory-mb 2048 --name q --state-dir {state_dir}`" in text
    )
    assert not out.exists()  # refused before anything ran


def test_a_rack_whose_quotas_fit_is_taken(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_rack(state_dir, 25)
    monkeypatch.setenv("DIT_RACK_DIR", str(state_dir))
    inventory, label, shared = _reproduce_where("rack", "ch6")
    # its quotas fit: each device's capacity is its own, so the report does not say the workers share
    # the machine's cores, and it names the quotas the rows were measured under (issue 47)
    assert inventory == str(state_dir / INVENTORY) and not shared
    assert str(state_dir / INVENTORY) in label and "4 devices x 25 % of CPU" in label


def test_other_chapters_are_not_refused_for_the_quotas(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chapter 4's delay model profiles each node alone (dit rack up warns about it); only Chapter 6
    # sets strategies that load one device against strategies that load all of them side by side
    record_rack(state_dir, 40)
    monkeypatch.setenv("DIT_RACK_DIR", str(state_dir))
    assert _reproduce_where("rack", "ch4")[0] == str(state_dir / INVENTORY)
