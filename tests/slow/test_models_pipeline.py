"""`dit run` of a scenario using each real adapter, in local mode, with the equivalence check on.

The edge service runs the remote stages of the real model; every partitioned inference's output
is compared with the unpartitioned one on the device (a mismatch fails the run). Two devices, the
vectors cover p = 0, a middle cut and p = N on both.

Of the Keras models, a whole run is made with one CNN (AlexNet) and one RNN (GRU-VQP): the run's path
(the adapter on the device agent and in the edge service, the tensors over the wire, the equivalence
check in the run) is the same for every Keras model, and each such run costs CI about a minute.
Every Keras model of the catalogue (VGG-16, ResNet-50, MobileNetV2, DenseNet-121 and EfficientNet-B0
too) is still built, profiled and checked for equivalence at every partition point by
tests/slow/test_models_keras.py. Every PyTorch / Hugging Face decoder gets its run here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from dit.device.common import build_model
from dit.models.catalogue import entry
from dit.run.procs import run_processes
from dit.run.rundir import RunDir
from tests.conftest import DIT, REPO

pytestmark = pytest.mark.slow

DECODER = {"num_layers": 2, "prompt_len": 8}
CASES: list[tuple[str, dict[str, Any], float]] = [
    ("alexnet", {}, 1e-5),  # the Keras CNN
    ("gru_vqp", {}, 1e-5),  # the Keras RNN
    ("gpt2", DECODER, 1e-4),
    ("tinyllama", DECODER, 1e-4),
    ("hf_decoder", {"family": "qwen2", **DECODER}, 1e-4),
]


@pytest.mark.parametrize(("name", "params", "tolerance"), CASES, ids=[c[0] for c in CASES])
def test_dit_run_with_the_real_model(
    name: str, params: dict[str, Any], tolerance: float, tmp_path: Path
) -> None:
    catalogue = entry(name)
    if importlib.util.find_spec(catalogue.framework) is None:
        pytest.skip(f"{name} needs {catalogue.framework} (./dev slow installs the extras)")
    # Generate (or verify) the weights once here, not in three processes at once.
    model = build_model(
        {"name": name, "builder": catalogue.builder, "params": params, "input": {}, "seed": 0}
    )
    n = model.num_stages
    scenario = {
        "name": f"real-{name}",
        "model": {
            "name": name,
            "params": params,
            "equivalence_check": {"enabled": True, "tolerance": tolerance},
        },
        "devices": ["device1", "device2"],
        "repetitions": 1,
        "warmup": 1,
        "seed": 0,
        "inference": {"partition_points": [[0, n // 2], [n // 2, n], [n, 0]], "repetitions": 1},
        "optimisation": {"enabled": False},
        "monitors": {"enabled": False},
        "timing": {"start_lead_s": 5},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [*DIT, "run", str(path), "--runs-dir", str(runs), "--no-stand-in"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (run_dir,) = (runs / f"real-{name}").iterdir()
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["model"]["stand_in_for"] is None
    assert metadata["model"]["spec"]["builder"] == catalogue.builder
    phases = pd.read_csv(run_dir / "aggregate" / "phases.csv")
    assert len(phases) == 2 * 3
    assert set(phases["partition_point"]) == {0, n // 2, n}
    remote = phases[phases["partition_point"] < n]
    assert (remote["remote_ns"] > 0).all()
    assert (remote["max_abs_diff"] <= tolerance).all()
    edge_layers = pd.read_csv(run_dir / "raw" / "edge" / "edge_layers.csv")
    assert edge_layers["stage"].max() == n
    assert run_processes(RunDir(run_dir).run_id) == []
