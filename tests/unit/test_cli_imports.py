"""The ``dit`` command's start imports only what every command needs.

Every ``dit`` process (``dit --help``, ``show``, ``validate``, ``ls``, each CLI call NNPM and the tests
make) paid for Ansible's plug-in API and ansible-runner (through ``dit runtimes``' module), Ansible's
module builder (through ``dit rack``'s defaults) and numpy (through ``dit show``'s labels): about 0.4
CPU-s of imports a command that runs no play and reads no table never used. They are imported where
they are used.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("ansible", "ansible_runner", "numpy", "pandas", "jinja2", "fastapi")


def test_loading_the_dit_command_imports_neither_ansible_nor_numpy() -> None:
    probe = (
        "import json, sys\n"
        "import dit.cli\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_the_commands_that_need_them_still_find_them() -> None:
    """The lazy imports are the ones the commands use: ``dit runtimes`` lists, ``dit rack`` knows its
    defaults, and ``dit show``'s labels resolve (each command's own tests run them in full)."""
    from dit.commands import show
    from dit.rack import DEFAULT_SUBNET
    from dit.rack.plan import RackSpec
    from dit.report import labels

    assert RackSpec.__dataclass_fields__["subnet"].default == DEFAULT_SUBNET == "10.213.0"
    assert labels.ENERGY_OBJECTIVES == ("energy", "edp")
    assert callable(show.show)
