"""The one ``ansible-inventory --list`` walk: the driver's and NNPM's, with a cycle guard and a timeout."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest

from dit.run.inventory import InventoryError, load_inventory
from dit.web.services.nodes import Inventory, NodeError

# What a plugin inventory could hand over: 'lab' and 'rack' contain each other.
CYCLIC = {
    "_meta": {"hostvars": {"e1": {"ansible_host": "10.0.0.1"}, "d1": {}, "d2": {"ansible_host": "10.0.0.3"}}},
    "all": {"children": ["ungrouped", "edge", "devices"]},
    "edge": {"hosts": ["e1"]},
    "devices": {"children": ["lab"]},
    "lab": {"hosts": ["d1"], "children": ["rack"]},
    "rack": {"hosts": ["d2"], "children": ["lab"]},
}


def fake_ansible_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, sleep_s: float
) -> None:
    """An ``ansible-inventory`` first on PATH that prints ``output`` after ``sleep_s``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "ansible-inventory"
    exe.write_text(
        f"#!{sys.executable}\nimport sys, time\ntime.sleep({sleep_s})\nsys.stdout.write({output!r})\n",
        encoding="utf-8",
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:{Path('/usr/bin')}")


def test_the_walk_survives_a_cycle_of_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ansible_inventory(tmp_path, monkeypatch, json.dumps(CYCLIC), 0)
    source = tmp_path / "inventory"  # a directory: NNPM reads it through ansible-inventory too
    source.mkdir()
    run = load_inventory(str(source), ("d1", "d2"))
    assert run.edge_host == "e1" and run.edge_address == "10.0.0.1"
    assert run.address_of("d2") == "10.0.0.3"
    nodes = {n.name: n.role for n in Inventory(source).nodes()}  # NNPM reads the same walk
    assert nodes == {"e1": "edge", "d1": "device", "d2": "device"}


def test_the_walk_gives_up_after_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ansible_inventory(tmp_path, monkeypatch, json.dumps(CYCLIC), 30)
    monkeypatch.setattr("dit.run.inventory.ANSIBLE_INVENTORY_TIMEOUT_S", 0.5)
    source = tmp_path / "slow"
    source.mkdir()
    start = time.monotonic()
    with pytest.raises(InventoryError, match=r"slow.*did not answer within 0\.5 s"):
        load_inventory(str(source), ("d1",))
    assert time.monotonic() - start < 10
    with pytest.raises(NodeError, match="did not answer") as web:
        Inventory(source).nodes()
    assert web.value.field == "inventory"


def test_garbage_from_ansible_inventory_is_an_error_naming_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ansible_inventory(tmp_path, monkeypatch, "not json", 0)
    source = tmp_path / "odd"
    source.mkdir()
    with pytest.raises(InventoryError, match=r"odd.*not JSON"):
        load_inventory(str(source), ("d1",))
