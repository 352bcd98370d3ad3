"""Real models through the real edge service: partitioned inference at every point, equivalence on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dit.device.client import EdgeConnection, infer_once, reference_output
from dit.device.common import build_model
from dit.models.catalogue import entry

pytestmark = pytest.mark.slow

CASES: list[tuple[str, dict[str, Any], float, str]] = [
    ("gru_vqp", {}, 1e-5, "tensorflow"),
    ("alexnet", {}, 1e-5, "tensorflow"),
    ("hf_decoder", {"family": "llama", "num_layers": 2, "prompt_len": 8}, 1e-4, "torch"),
]


@contextmanager
def edge_service(spec: dict[str, Any], tmp: Path) -> Iterator[int]:
    ready = tmp / "edge-ready.json"
    cfg = {
        "run_id": "models-it",
        "host": "edge",
        "bind": "127.0.0.1",
        "port": 0,
        "policy": "SJF",
        "admission": "immediate",
        "devices": ["device1"],
        "model": spec,
        "profile": None,
        "results_dir": str(tmp / "edge"),
        "ready_file": str(ready),
    }
    (tmp / "edge.json").write_text(json.dumps(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dit.device", "edge", "--config", str(tmp / "edge.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"edge service did not start: {proc.communicate(timeout=30)}")
            time.sleep(0.05)
        yield int(json.loads(ready.read_text())["port"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()


@pytest.mark.parametrize(("name", "params", "tol", "framework"), CASES, ids=[c[0] for c in CASES])
def test_partitioned_through_edge_service(
    name: str, params: dict[str, Any], tol: float, framework: str, tmp_path: Path
) -> None:
    pytest.importorskip(framework)
    spec = {"name": name, "builder": entry(name).builder, "params": params, "seed": 9}
    model: Any = build_model(spec)
    ref = reference_output(model)
    points = list(range(model.num_stages + 1))
    with edge_service(spec, tmp_path) as port, EdgeConnection("127.0.0.1", port, timeout_s=120) as conn:
        recs = [
            infer_once(model, conn, device="device1", round_=r, repetition=0, point=p, origin_mono_ns=0,
                       reference=ref, tolerance=tol)
            for r, p in enumerate(points)
        ]  # fmt: skip
    assert [r.partition_point for r in recs] == points
    assert all(r.max_abs_diff is not None and r.max_abs_diff <= tol for r in recs)
    assert [r.request_bytes for r in recs[:-1]] == [model.output_bytes(p) for p in points[:-1]]
