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
