"""``dit_handoff``: one playbook runs several stages, and the controller speaks between them.

The driver runs consecutive stages (preflight, apply, profile, collect) as one ``ansible-playbook``
start, each costing about 1.3 CPU-s and a second or more of wall time, not one per stage. A later
stage's variables often follow from what the one before it reported (preflight's facts settle the
conditions apply sets, apply's edge service names the port profile uses), so a play of this one task
(``run_once``) stands between them: it waits until the driver, reading the stage that ended, has
written the next stage's variables into ``path`` (``!unsafe`` YAML, :func:`dit.ansible_data.unsafe_yaml`)
and gives them to every host as facts, or fails with the driver's reason (a refused gate, a stop)
so that nothing after it runs. A driver that is gone (killed) never writes: the task fails instead of
waiting forever.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

#: The key of a handoff file that stops the playbook instead (its value: the driver's reason).
STOP_KEY = "dit_handoff_stop"
POLL_S = 0.02


def _parent(pid: int) -> int:
    """The parent of ``pid`` (0 when it is gone), from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def driver_alive(pid: int, depth: int = 4) -> bool:
    """Whether the driver ``pid`` is still an ancestor of this process (a worker of ``ansible-playbook``,
    which the driver started): a killed driver's playbook is re-parented, and a reused pid is no ancestor."""
    current = os.getpid()
    for _ in range(depth):
        current = _parent(current)
        if current == pid:
            return True
        if current <= 1:
            return False
    return False


class HandoffAction(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True  # a dry run's preflight hands over to its apply as well

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        path = str(self._task.args.get("path") or "")
        pid = int(self._task.args.get("driver_pid") or 0)
        if not path or pid <= 0:
            raise AnsibleActionFail("dit_handoff: path and driver_pid are required")
        while not os.path.exists(path):
            if not driver_alive(pid):
                raise AnsibleActionFail(f"dit_handoff: the driver (pid {pid}) is gone; {path} never came")
            time.sleep(POLL_S)
        # Ansible's own loader honours !unsafe: the values stay data, as an extra-vars file's do.
        given = self._loader.load_from_file(path, cache="none")
        if not isinstance(given, dict):
            raise AnsibleActionFail(f"dit_handoff: {path} holds no mapping of variables")
        if STOP_KEY in given:
            raise AnsibleActionFail(str(given[STOP_KEY]))
        result["ansible_facts"] = dict(given)
        result["changed"] = False
        return result
