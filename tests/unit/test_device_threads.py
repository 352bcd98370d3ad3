"""hardware.<device>.threads inside the frameworks: set through their APIs, read back, recorded."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dit.device import threads

SRC = Path(__file__).resolve().parents[2] / "src"


class FakeTorch:
    """torch's thread calls; the inter-op pool may be set once, like the real one."""

    def __init__(self, intra: int = 2, inter: int = 2, interop_locked: bool = False) -> None:
        self.intra, self.inter, self.interop_locked = intra, inter, interop_locked

    def get_num_threads(self) -> int:
        return self.intra

    def set_num_threads(self, n: int) -> None:
        self.intra = n

    def get_num_interop_threads(self) -> int:
        return self.inter

    def set_num_interop_threads(self, n: int) -> None:
        if self.interop_locked:
            raise RuntimeError("cannot set number of interop threads after parallel work has started")
        self.inter, self.interop_locked = n, True


class FakeThreading:
    def __init__(self, initialised: bool = False) -> None:
        self.values = {"intra_op": 0, "inter_op": 0}
        self.initialised = initialised

    def __getattr__(self, name: str) -> Any:
        verb, _, rest = name.partition("_")
        what = rest.removesuffix("_parallelism_threads")
        if verb == "get":
            return lambda: self.values[what]

        def setter(n: int) -> None:
            if self.initialised:
                raise RuntimeError(f"{what} parallelism cannot be modified after initialization")
            self.values[what] = n

        return setter


def fake_tf(initialised: bool = False) -> Any:
    return SimpleNamespace(config=SimpleNamespace(threading=FakeThreading(initialised)))


def test_torch_gets_the_count_and_the_read_back_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIT_THREADS", "1")
    torch = FakeTorch()
    record = threads.configure_torch(torch)
    assert (torch.intra, torch.inter) == (1, 1)
    assert record == {"requested": 1, "errors": [], "intra_op": 1, "inter_op": 1}
    assert threads.effective()["torch"] == record and threads.effective()["requested"] == 1
    # a second adapter in the same process: intra-op is set again, inter-op already is what was asked
    assert threads.configure_torch(torch)["errors"] == []


def test_torch_interop_once_per_process_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIT_THREADS", "1")
    torch = FakeTorch(inter=4, interop_locked=True)
    record = threads.configure_torch(torch)
    assert record["intra_op"] == 1 and record["inter_op"] == 4  # what really is in effect
    assert "set_num_interop_threads(1)" in record["errors"][0]


def test_tensorflow_gets_the_count_before_it_initialises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIT_THREADS", "3")
    tf = fake_tf()
    record = threads.configure_tensorflow(tf)
    assert record == {"requested": 3, "errors": [], "intra_op": 3, "inter_op": 3}
    late = threads.configure_tensorflow(fake_tf(initialised=True))
    assert (late["intra_op"], late["inter_op"]) == (0, 0) and len(late["errors"]) == 2


def test_no_count_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIT_THREADS", raising=False)
    torch = FakeTorch(intra=2, inter=2)
    assert threads.configure_torch(torch) == {"requested": None, "errors": [], "intra_op": 2, "inter_op": 2}


@pytest.mark.parametrize("bad", ["0", "two", "-1"])
def test_a_bad_count_names_the_variable(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("DIT_THREADS", bad)
    with pytest.raises(ValueError, match="DIT_THREADS"):
        threads.configure_torch(FakeTorch())


def test_a_one_thread_profile_uses_one_core(tmp_path: Path) -> None:
    """The profile command with threads: 1: no stage's process CPU time exceeds its wall time x 1.05."""
    cfg = {
        "run_id": "run-1",
        "host": "device1",
        "start_at_ns": time.time_ns() + 50_000_000,
        "model": {"name": "fake", "builder": "dit.device.fakemodel:build", "params": {"profile": "alexnet"}},
        "repetitions": 3,
        "warmup": 1,
        "threads": 1,
        "results_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "dit.device", "profile", "--config", str(path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "out" / "layers.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["stage"] != "0"]
    assert rows
    for r in rows:
        assert float(r["cpu_pct"]) <= 105.0, r
    done = json.loads((tmp_path / "out" / "done.json").read_text())
    assert done["threads"] == 1
    assert done["threads_effective"] == {"requested": 1}  # the stdlib fake model: no framework pools
