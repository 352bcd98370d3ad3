"""The edge inference service as a real subprocess: policies, admission, errors, SIGTERM."""

from __future__ import annotations

import csv
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dit.device import protocol as P
from dit.device.client import EdgeConnection, EdgeError, InferenceRecord, infer_once, reference_output
from dit.device.fakemodel import build

ALEXNET = {
    "name": "fake",
    "builder": "dit.device.fakemodel:build",
    "params": {"profile": "alexnet"},
    "seed": 5,
}
TINY = {"name": "fake", "builder": "dit.device.fakemodel:build", "params": {"profile": "tiny"}, "seed": 5}


def edge_config(tmp: Path, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "run_id": "it-run",
        "host": "edge",
        "bind": "127.0.0.1",
        "port": 0,
        "policy": "RR",
        "admission": "batch",
        "devices": ["device1", "device2"],
        "model": ALEXNET,
        "profile": None,
        "results_dir": str(tmp / "edge"),
        "ready_file": str(tmp / "edge-ready.json"),
    }
    cfg.update(over)
    return cfg


def wait_ready(proc: subprocess.Popen[bytes], ready: Path, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.exists():
            data: dict[str, Any] = json.loads(ready.read_text())
            return data
        if proc.poll() is not None:
            raise AssertionError(f"edge exited early: {proc.communicate()}")
        time.sleep(0.02)
    raise AssertionError("edge service did not become ready")


@contextmanager
def edge_service(cfg: dict[str, Any], tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    path = tmp / "edge.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dit.device", "edge", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        ready = wait_ready(proc, Path(cfg["ready_file"]))
        assert ready["pid"] == proc.pid
        yield proc, int(ready["port"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def run_devices(
    port: int, plan: dict[str, int], repetitions: int, spec: dict[str, Any], key: bytes | None = None
) -> dict[str, list[InferenceRecord]]:
    """One client thread per device, all at round 0, repetitions 0..k-1 (lockstep by batch admission)."""
    out: dict[str, list[InferenceRecord]] = {d: [] for d in plan}
    errors: list[BaseException] = []

    def device(name: str, point: int) -> None:
        try:
            model = build(spec)
            ref = reference_output(model)
            with EdgeConnection("127.0.0.1", port, timeout_s=120, key=key) as conn:
                for k in range(repetitions):
                    out[name].append(
                        infer_once(
                            model, conn, device=name, round_=0, repetition=k, point=point,
                            origin_mono_ns=0, reference=ref, tolerance=0.0,
                        )
                    )  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=device, args=item) for item in plan.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("policy", ["RR", "SJF"])
def test_policies_queueing_difference(policy: str, tmp_path: Path) -> None:
    reps = 3
    profile = {"repetitions": 2, "warmup": 1} if policy == "SJF" else None
    cfg = edge_config(tmp_path, policy=policy, profile=profile)
    with edge_service(cfg, tmp_path) as (_proc, port):
        recs = run_devices(port, {"device1": 2, "device2": 9}, reps, ALEXNET)
    edge_dir = tmp_path / "edge"
    rows = read_csv(edge_dir / "edge_requests.csv")
    stages = read_csv(edge_dir / "edge_stages.csv")
    assert len(rows) == 2 * reps
    assert (edge_dir / "layers.csv").exists() == (policy == "SJF")
    for k in range(reps):
        d1, d2 = recs["device1"][k], recs["device2"][k]
        for rec in (d1, d2):
            assert rec.total_ns == rec.phase_sum()
            assert rec.max_abs_diff == 0.0
        by_dev = {r["device"]: r for r in rows if int(r["repetition"]) == k}
        e1, e2 = by_dev["device1"], by_dev["device2"]
        assert e1["release_ns"] == e2["release_ns"]  # batch admission released them together
        assert int(e1["stages"]) == 9 and int(e2["stages"]) == 2
        assert (int(e1["queue_ns"]), int(e2["queue_ns"])) == (d1.queue_ns, d2.queue_ns)
        assert int(e2["done_ns"]) < int(e1["done_ns"])  # the short job finishes first under both
        # device1 waits at least for device2's whole remote work, under both policies
        assert d1.queue_ns >= d2.remote_ns > 0
        mine = [s for s in stages if int(s["repetition"]) == k]
        order = [(s["device"], int(s["stage"])) for s in mine]
        dur = {(s["device"], int(s["stage"])): int(s["end_ns"]) - int(s["start_ns"]) for s in mine}
        assert sum(v for (d, _), v in dur.items() if d == "device2") == d2.remote_ns
        if policy == "SJF":
            assert order == [("device2", 10), ("device2", 11)] + [("device1", s) for s in range(3, 12)]
            assert d2.queue_ns < d1.queue_ns
            # nothing of device1 ran while device2 was in the system
            assert min(int(s["start_ns"]) for s in mine if s["device"] == "device1") >= int(e2["done_ns"])
        else:
            assert order[:4] == [("device1", 3), ("device2", 10), ("device1", 4), ("device2", 11)]
            assert order[4:] == [("device1", s) for s in range(5, 12)]
            assert d1.queue_ns > 0 and d2.queue_ns > 0
            # device2's queue holds device1's interleaved stages 3 and 4
            assert d2.queue_ns >= dur[("device1", 3)] + dur[("device1", 4)]
    # every device's barrier: the first to arrive waited for the other
    assert all(int(r["barrier_ns"]) >= 0 for r in rows)


def test_immediate_admission_skip_and_equivalence(tmp_path: Path) -> None:
    cfg = edge_config(tmp_path, admission="immediate", devices=["device1"], model=TINY, policy="SJF")
    model = build(TINY)
    ref = reference_output(model)
    with edge_service(cfg, tmp_path) as (_proc, port), EdgeConnection("127.0.0.1", port) as conn:
        recs = [
            infer_once(model, conn, device="device1", round_=r, repetition=0, point=p, origin_mono_ns=0,
                       reference=ref, tolerance=0.0)
            for r, p in enumerate([0, 1, 2, 3, 4])
        ]  # fmt: skip
    assert [r.max_abs_diff for r in recs] == [0.0] * 5
    assert [r.barrier_ns for r in recs] == [0] * 5  # released on arrival
    rows = read_csv(tmp_path / "edge" / "edge_requests.csv")
    assert [int(r["partition_point"]) for r in rows] == [0, 1, 2, 3]  # the SKIP is not a request
    summary = json.loads((tmp_path / "edge" / "edge_summary.json").read_text())
    assert summary["completed_requests"] == 4 and summary["skips"] == 1


def test_errors_are_answered_with_error_frames(tmp_path: Path) -> None:
    cfg = edge_config(tmp_path, model=TINY, max_frame_bytes=4096)
    model = build(TINY)
    with edge_service(cfg, tmp_path) as (_proc, port):
        with (
            EdgeConnection("127.0.0.1", port) as conn,
            pytest.raises(EdgeError, match="unknown device 'device9'"),
        ):
            infer_once(model, conn, device="device9", round_=0, repetition=0, point=0, origin_mono_ns=0)
        with EdgeConnection("127.0.0.1", port) as conn:
            conn.send(P.Request("device1", 0, 0, 4, b""))
            with pytest.raises(EdgeError, match=r"partition point 4 is outside 0\.\.3"):
                conn.receive()
        with EdgeConnection("127.0.0.1", port) as conn:
            conn.send(P.Skip("device1", 0, 0, 4))
            conn.expect_ack(0, 0, P.MsgType.SKIP)
            conn.send(P.Skip("device1", 0, 0, 4))
            with pytest.raises(EdgeError, match="duplicate message for round 0 repetition 0"):
                conn.receive()
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            msg = P.recv_message(raw)
            assert isinstance(msg, P.Error) and "bad frame magic" in msg.message
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(P.encode(P.Request("device1", 1, 0, 0, b"x" * 8192)))
            msg = P.recv_message(raw)
            assert isinstance(msg, P.Error) and "exceeds the maximum of 4096 bytes" in msg.message


def test_sigterm_stops_cleanly_with_a_complete_log(tmp_path: Path) -> None:
    cfg = edge_config(tmp_path, model=TINY, policy="RR")
    model = build(TINY)
    with edge_service(cfg, tmp_path) as (proc, port):
        run_devices(port, {"device1": 0, "device2": 2}, 2, TINY)
        # a third round that can never complete: device2 never sends it
        conn = EdgeConnection("127.0.0.1", port)
        conn.send(P.Request("device1", 0, 2, 0, model.make_input()))
        conn.expect_ack(0, 2, P.MsgType.REQUEST)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        conn.close()
    rows = read_csv(tmp_path / "edge" / "edge_requests.csv")
    assert sorted((r["device"], int(r["repetition"])) for r in rows) == [
        ("device1", 0), ("device1", 1), ("device2", 0), ("device2", 1)
    ]  # fmt: skip
    assert all(len(r) == 13 and all(v != "" for v in r.values()) for r in rows)
    summary = json.loads((tmp_path / "edge" / "edge_summary.json").read_text())
    assert summary["completed_requests"] == 4 and summary["unfinished_rounds"] == [[0, 2]]
    stage_rows = read_csv(tmp_path / "edge" / "edge_stages.csv")
    assert len(stage_rows) == 2 * (4 + 2)


def test_edge_capacity_profile_and_origin(tmp_path: Path) -> None:
    cfg = edge_config(tmp_path, model=TINY, profile={"repetitions": 3, "warmup": 2})
    with edge_service(cfg, tmp_path):
        pass
    layers = read_csv(tmp_path / "edge" / "layers.csv")
    assert len(layers) == 3 * 5
    summary = json.loads((tmp_path / "edge" / "profile_summary.json").read_text())
    assert summary["warmup"] == 2 and summary["repetitions"] == 3
    origin = json.loads((tmp_path / "edge" / "origin.json").read_text())
    ready = json.loads((tmp_path / "edge-ready.json").read_text())
    assert origin["origin_mono_ns"] == ready["origin_mono_ns"]
    assert origin["workload_estimate"] == "capacity_profile_mean_latency_ns"


def test_edge_capacity_profile_lasts_its_minimum_duration(tmp_path: Path) -> None:
    """A tiny model's 3 repetitions take milliseconds; ``min_seconds`` adds repetitions until the profile
    spans at least about that long."""
    cfg = edge_config(tmp_path, model=TINY, profile={"repetitions": 3, "warmup": 1, "min_seconds": 0.5})
    with edge_service(cfg, tmp_path):
        pass
    summary = json.loads((tmp_path / "edge" / "profile_summary.json").read_text())
    assert summary["repetitions"] > 3
    layers = read_csv(tmp_path / "edge" / "layers.csv")
    assert len(layers) == summary["repetitions"] * 5
    assert summary["min_seconds"] == 0.5
    # sized from the faster of two passes at two passes per repetition (the stage-by-stage passes cost
    # more than that on a tiny model); 3 repetitions alone would take milliseconds. The count is sized
    # from a sample: on a machine whose load falls between the sample and the profile (CI's suite beside
    # it) the repetitions run faster than sized, so about means at least half (CI measured 0.37 s of 0.5)
    assert summary["duration_ns"] >= 0.25e9


def write_start_at(path: Path, start_at_ns: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"start_at_ns": start_at_ns}))
    tmp.replace(path)  # atomically, as dit_launch writes it


def test_edge_profiles_its_capacity_again_from_the_start_instant(tmp_path: Path) -> None:
    """With ``start_at_file``, the service profiles again from the instant the profile stage writes
    there (beside the devices' own layer profiles), for ``min_seconds`` when no request comes: that
    profile becomes layers.csv and the one of its start-up moves aside."""
    start_file = tmp_path / "start_at.json"
    cfg = edge_config(
        tmp_path,
        model=TINY,
        profile={"repetitions": 3, "warmup": 1, "min_seconds": 0.3},
        start_at_file=str(start_file),
    )
    with edge_service(cfg, tmp_path):
        startup = read_csv(tmp_path / "edge" / "layers.csv")
        start_at = time.time_ns() + 200_000_000
        write_start_at(start_file, start_at)
        deadline = time.monotonic() + 30
        while not (tmp_path / "edge" / "layers_startup.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
    edge = tmp_path / "edge"
    assert read_csv(edge / "layers_startup.csv") == startup
    summary = json.loads((edge / "profile_summary.json").read_text())
    assert summary["taken"] == "start_instant"
    assert json.loads((edge / "profile_summary_startup.json").read_text())["taken"] == "service_start"
    layers = read_csv(edge / "layers.csv")
    assert len(layers) == summary["repetitions"] * 5 and summary["repetitions"] >= 3
    origin = json.loads((edge / "origin.json").read_text())
    # from the instant on, not before it (start_ns: on the service's monotonic clock, from its origin)
    first_ns = min(int(r["start_ns"]) for r in layers) + origin["origin_mono_ns"]
    assert first_ns - (origin["origin_mono_ns"] + start_at - origin["origin_wall_ns"]) > -5_000_000
    done = json.loads((edge / "edge_summary.json").read_text())["start_profile"]
    assert done["used"] is True and done["ended_by"] == "min_seconds" and done["start_at_ns"] == start_at
    assert done["duration_ns"] >= 0.3e9


def test_the_first_request_ends_the_profile_at_the_start_instant(tmp_path: Path) -> None:
    """The profile at the instant must not hold up the inference: a device's first REQUEST ends it
    after the repetition under way, long before ``min_seconds``."""
    start_file = tmp_path / "start_at.json"
    cfg = edge_config(
        tmp_path,
        model=TINY,
        admission="immediate",
        devices=["device1"],
        profile={"repetitions": 3, "min_seconds": 5},
        start_at_file=str(start_file),
    )
    model = build(TINY)
    with edge_service(cfg, tmp_path) as (_proc, port):
        write_start_at(start_file, time.time_ns())
        time.sleep(0.5)  # profiling now, for up to 5 s
        t0 = time.monotonic()
        with EdgeConnection("127.0.0.1", port) as conn:
            infer_once(model, conn, device="device1", round_=0, repetition=0, point=0, origin_mono_ns=0)
        took_s = time.monotonic() - t0
    done = json.loads((tmp_path / "edge" / "edge_summary.json").read_text())["start_profile"]
    assert done["ended_by"] == "request" and done["used"] is True
    assert done["duration_ns"] < 3e9 and took_s < 2.0  # not the 5 s of min_seconds


def test_the_profile_at_the_start_instant_takes_its_repetitions_before_min_seconds_ends_it(
    tmp_path: Path,
) -> None:
    """``min_seconds`` ends the profile at the instant only once it has ``repetitions`` (a model slower
    than the window would otherwise always keep the start-up profile); only a request cuts it short."""
    start_file = tmp_path / "start_at.json"
    cfg = edge_config(
        tmp_path,
        model=TINY,
        profile={"repetitions": 40, "min_seconds": 0.001},
        start_at_file=str(start_file),
    )
    with edge_service(cfg, tmp_path):
        write_start_at(start_file, time.time_ns())
        deadline = time.monotonic() + 30
        while not (tmp_path / "edge" / "layers_startup.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    done = json.loads((tmp_path / "edge" / "edge_summary.json").read_text())["start_profile"]
    assert done["used"] is True and done["ended_by"] == "min_seconds"
    assert done["repetitions"] == 40
