"""A 1-thread run of the real frameworks uses one core: the adapters' thread setup (DIT_THREADS only).

Each check runs in a fresh interpreter (PyTorch's inter-op pool and TensorFlow's pools can be set only
once per process) with only ``DIT_THREADS=1`` in the environment: no OMP_NUM_THREADS to fall back on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

TORCH = """
import json, time
from dit.models.hf_decoder import import_torch
from dit.device.threads import effective
torch = import_torch()
a = torch.rand(768, 768)
c0, t0 = time.process_time_ns(), time.monotonic_ns()
while time.monotonic_ns() - t0 < 400_000_000:
    a = torch.tanh(a @ a)
c1, t1 = time.process_time_ns(), time.monotonic_ns()
print(json.dumps({"cpu_ns": c1 - c0, "wall_ns": t1 - t0, "effective": effective()}))
"""

TENSORFLOW = """
import json, time
from dit.models.keras_staged import import_keras
from dit.device.threads import effective
keras = import_keras()
import tensorflow as tf
a = tf.random.uniform((768, 768))
_ = (a @ a).numpy()
c0, t0 = time.process_time_ns(), time.monotonic_ns()
while time.monotonic_ns() - t0 < 400_000_000:
    a = tf.tanh(a @ a)
    _ = a.numpy()
c1, t1 = time.process_time_ns(), time.monotonic_ns()
print(json.dumps({"cpu_ns": c1 - c0, "wall_ns": t1 - t0, "effective": effective()}))
"""


def run(code: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_THREADS")}
    env.update(PYTHONPATH=str(SRC), DIT_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize(("code", "framework"), [(TORCH, "torch"), (TENSORFLOW, "tensorflow")])
def test_one_thread_uses_one_core(code: str, framework: str) -> None:
    result = run(code)
    effective = result["effective"]
    assert isinstance(effective, dict)
    assert effective[framework] == {"requested": 1, "errors": [], "intra_op": 1, "inter_op": 1}
    cpu_ns, wall_ns = result["cpu_ns"], result["wall_ns"]
    assert isinstance(cpu_ns, int) and isinstance(wall_ns, int)
    assert cpu_ns <= wall_ns * 1.05, f"{framework}: {cpu_ns / wall_ns:.2f} cores"
