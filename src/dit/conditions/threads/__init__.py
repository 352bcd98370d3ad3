"""Thread count of the inference runtime (``hardware.<device>.threads``).

Nothing on the node changes: the count reaches the run's device processes through their
environment (OpenMP, MKL, OpenBLAS, TensorFlow intra/inter-op, and ``DIT_THREADS``) and the profile
configuration; the run's metadata records it with the other process settings. The model adapters apply
``DIT_THREADS`` through the frameworks' own APIs when they import them (:mod:`dit.device.threads`:
``torch.set_num_threads`` / ``set_num_interop_threads``, ``tf.config.threading`` intra/inter-op) and the
profile command records the values read back from the framework in ``done.json`` (``threads_effective``).
"""

from __future__ import annotations

from typing import Any

from dit.conditions import Condition, HostContext, ProcessSettings
from dit.scenario import Scenario

CONDITION = Condition(name="threads", role=None, order=5, variables=())

THREAD_VARIABLES = (
    "DIT_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    return None  # no role: see process()


def process(scenario: Scenario, host: str, ctx: HostContext) -> ProcessSettings | None:
    threads = scenario.hardware.get(host, {}).get("threads")
    if threads is None:
        return None
    return ProcessSettings(env=dict.fromkeys(THREAD_VARIABLES, str(int(threads))), cgroup=None)
