"""The environment that tags every process of a run (stdlib only: it ships to the nodes).

Every process a run starts carries the run id, its host and a tag in these variables, so the run's
processes can be found from ``/proc/<pid>/environ`` alone (teardown, ``dit cleanup``, the power
monitor's attribution). The Ansible modules cannot import dit: ``module_utils/dit_procs.py`` spells
the same names, and a test checks that both agree.
"""

from __future__ import annotations

from typing import Final

RUN_ENV: Final = "DIT_RUN_ID"
HOST_ENV: Final = "DIT_HOST"
TAG_ENV: Final = "DIT_TAG"
#: The profile stage's common start instant (``time.time_ns()`` epoch) in a main process's environment.
START_AT_ENV: Final = "DIT_START_AT_NS"
#: The two-phase ("prepared") start of a main process that declares a ``prepared_file``: the process
#: prepares (model, reference output, connection), writes the JSON file ``PREPARED_FILE_ENV`` names,
#: then waits (at most ``START_WAIT_TIMEOUT_ENV`` seconds) for the file ``START_AT_FILE_ENV`` names,
#: ``{"start_at_ns": int}``, which the profile stage writes once every node is prepared.
START_AT_FILE_ENV: Final = "DIT_START_AT_FILE"
PREPARED_FILE_ENV: Final = "DIT_PREPARED_FILE"
START_WAIT_TIMEOUT_ENV: Final = "DIT_START_AT_TIMEOUT_S"
