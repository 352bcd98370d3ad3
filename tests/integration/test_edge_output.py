"""The edge service's own output reaches ``logs/edge.out`` while it runs (the terminal follows that file).

It used to write only its CSV files: ``edge.out`` stayed empty and the run's terminal never showed the
edge server (issue 16, item 8).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dit.device import protocol as P
from dit.device.client import EdgeConnection, EdgeError
from tests.integration.test_edge_service import TINY, edge_config, run_devices, wait_ready


def wait_for_text(path: Path, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text(encoding="utf-8") if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path}: {path.read_text(encoding='utf-8')!r}")


def test_edge_service_output_is_written_live(tmp_path: Path) -> None:
    cfg = edge_config(tmp_path, model=TINY, policy="RR")
    (tmp_path / "edge.json").write_text(json.dumps(cfg), encoding="utf-8")
    out, err = tmp_path / "edge.out", tmp_path / "edge.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:  # as dit_launch starts it: files, not a tty
        proc = subprocess.Popen(
            [sys.executable, "-m", "dit.device", "edge", "--config", str(tmp_path / "edge.json")],
            stdout=stdout,
            stderr=stderr,
        )
    try:
        port = int(wait_ready(proc, Path(cfg["ready_file"]))["port"])
        wait_for_text(out, "edge: listening on 127.0.0.1:")  # while it runs, not at exit
        run_devices(port, {"device1": 0, "device2": 2}, 2, TINY)
        wait_for_text(out, "requests served (last: device")
        with EdgeConnection("127.0.0.1", port) as conn:
            conn.send(P.Request("device9", 0, 0, 0, b""))
            with pytest.raises(EdgeError, match="unknown device"):
                conn.receive()  # the ERROR frame
        wait_for_text(err, "edge: refused a REQUEST from device9: unknown device 'device9'")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert "edge: stopped · 4 requests served" in out.read_text(encoding="utf-8")
