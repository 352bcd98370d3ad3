"""A role run without the variables its condition sets refuses with a message naming them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: netem
"""


def test_netem_without_an_interface_or_a_tree_is_refused_naming_both(tmp_path: Path) -> None:
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY, encoding="utf-8")
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_LIBRARY": str(REPO / "library"),
        "ANSIBLE_MODULE_UTILS": str(REPO / "module_utils"),
        "ANSIBLE_ACTION_PLUGINS": str(REPO / "action_plugins"),
        "ANSIBLE_NOCOLOR": "1",
    }
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "netem: netem_interface and netem_tree (or the userspace plan) must be set" in proc.stdout, (
        proc.stdout
    )
    assert "Shape the inference interface with the tc tree]" not in proc.stdout  # refused before dit_tc
