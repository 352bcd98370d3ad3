"""Partitioned inference on the client: the phase identity, SKIP at p = N, errors, equivalence."""

from __future__ import annotations

import csv
import itertools
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dit.device import protocol as P
from dit.device.client import (
    INFERENCE_COLUMNS,
    EdgeConnection,
    EdgeError,
    EquivalenceError,
    infer_once,
    reference_output,
    run_inference,
    write_inference_csv,
)
from dit.device.fakemodel import FakeModel, build

SPEC = {"name": "fake", "params": {"profile": "tiny"}, "seed": 11}
BARRIER, QUEUE, REMOTE = 10, 20, 30

Handler = Callable[[P.Message, socket.socket, FakeModel], None]


def honest(msg: P.Message, conn: socket.socket, model: FakeModel) -> None:
    """ACK, then compute the remaining stages and send the RESULT with fixed server timings."""
    if isinstance(msg, P.Skip):
        P.send_message(conn, P.Ack(msg.round, msg.repetition, P.MsgType.SKIP))
        return
    assert isinstance(msg, P.Request)
    P.send_message(conn, P.Ack(msg.round, msg.repetition, P.MsgType.REQUEST))
    x = model.decode(msg.payload, msg.partition_point)
    for s in range(msg.partition_point + 1, model.num_stages + 1):
        x = model.run_stage(s, x)
    n = model.num_stages - msg.partition_point
    P.send_message(conn, P.Result(msg.round, msg.repetition, BARRIER, QUEUE, REMOTE, n, model.encode(x)))


@contextmanager
def scripted_edge(handler: Handler) -> Iterator[tuple[int, list[P.Message]]]:
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[P.Message] = []
    model = build(SPEC)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while True:
                try:
                    msg = P.recv_message(conn)
                except (ConnectionError, OSError):
                    return
                seen.append(msg)
                handler(msg, conn, model)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], seen
    finally:
        srv.close()
        t.join(5)


def test_phase_identity_with_an_exact_clock() -> None:
    ticks = itertools.count(1000, 1000)  # t0 = 1000, end of local = 2000, ACK = 3000, RESULT = 4000
    model = build(SPEC)
    with scripted_edge(honest) as (port, seen), EdgeConnection("127.0.0.1", port) as conn:
        rec = infer_once(
            model,
            conn,
            device="d1",
            round_=2,
            repetition=1,
            point=1,
            origin_mono_ns=500,
            clock=lambda: next(ticks),
        )
    assert isinstance(seen[0], P.Request) and seen[0].device == "d1" and seen[0].partition_point == 1
    assert (rec.local_ns, rec.transmission_ns) == (1000, 1000)
    assert (rec.barrier_ns, rec.queue_ns, rec.remote_ns) == (BARRIER, QUEUE, REMOTE)
    assert rec.return_ns == 1000 - BARRIER - QUEUE - REMOTE
    assert rec.ack_overlap_ns == 0
    assert rec.total_ns == 3000 == rec.phase_sum()
    assert rec.start_ns == 500
    assert rec.request_bytes == model.output_bytes(1)
    assert rec.max_abs_diff is None


def test_a_late_ack_is_taken_off_the_transmission_not_left_negative() -> None:
    # The server reports 60 ns of residence, but the client sees only 40 ns between reading the
    # ACK and reading the RESULT: the ACK's trip was at least 20 ns longer than the result's.
    ticks = iter([1000, 2000, 3000, 3040])
    model = build(SPEC)
    with scripted_edge(honest) as (port, _seen), EdgeConnection("127.0.0.1", port) as conn:
        rec = infer_once(
            model,
            conn,
            device="d1",
            round_=0,
            repetition=0,
            point=1,
            origin_mono_ns=0,
            clock=lambda: next(ticks),
        )
    assert BARRIER + QUEUE + REMOTE == 60
    assert rec.return_ns == 0
    assert rec.ack_overlap_ns == 20
    assert rec.transmission_ns == 1000 - 20
    assert rec.total_ns == 2040 == rec.phase_sum()
    assert min(rec.local_ns, rec.transmission_ns, rec.barrier_ns, rec.queue_ns, rec.remote_ns) >= 0


@pytest.mark.parametrize("point", range(5))
def test_every_point_with_equivalence_and_the_identity(point: int) -> None:
    model = build(SPEC)
    ref = reference_output(model)
    with scripted_edge(honest) as (port, seen), EdgeConnection("127.0.0.1", port) as conn:
        rec = infer_once(
            model,
            conn,
            device="d1",
            round_=0,
            repetition=0,
            point=point,
            origin_mono_ns=0,
            reference=ref,
            tolerance=0.0,
        )
    assert rec.total_ns == rec.phase_sum()
    assert rec.max_abs_diff == 0.0
    if point == 4:  # p = N: local only, SKIP sent, every remote phase is 0
        assert seen == [P.Skip("d1", 0, 0, 4)]
        assert rec.total_ns == rec.local_ns > 0 and rec.request_bytes == 0
        assert rec.transmission_ns == rec.barrier_ns == rec.queue_ns == rec.remote_ns == rec.return_ns == 0
    else:
        assert rec.transmission_ns > 0 and rec.request_bytes == model.output_bytes(point)


def test_equivalence_mismatch_names_model_point_and_difference() -> None:
    def corrupt(msg: P.Message, conn: socket.socket, model: FakeModel) -> None:
        assert isinstance(msg, P.Request)
        P.send_message(conn, P.Ack(msg.round, msg.repetition, P.MsgType.REQUEST))
        P.send_message(
            conn, P.Result(msg.round, msg.repetition, 0, 0, 0, 4 - msg.partition_point, b"\x00" * 16)
        )

    model = build(SPEC)
    ref = reference_output(model)
    with (
        scripted_edge(corrupt) as (port, _),
        EdgeConnection("127.0.0.1", port) as conn,
        pytest.raises(
            EquivalenceError, match=r"model 'fake' at partition point 2: max abs difference \d+\.0 exceeds"
        ),
    ):
        infer_once(
            model,
            conn,
            device="d1",
            round_=0,
            repetition=0,
            point=2,
            origin_mono_ns=0,
            reference=ref,
            tolerance=0.5,
        )


def test_error_frames_and_wrong_answers_raise() -> None:
    def refuse(msg: P.Message, conn: socket.socket, model: FakeModel) -> None:
        P.send_message(conn, P.Error("unknown device 'd9'"))

    model = build(SPEC)
    with (
        scripted_edge(refuse) as (port, _),
        EdgeConnection("127.0.0.1", port) as conn,
        pytest.raises(EdgeError, match="unknown device 'd9'"),
    ):
        infer_once(model, conn, device="d9", round_=0, repetition=0, point=0, origin_mono_ns=0)

    def wrong_round(msg: P.Message, conn: socket.socket, model: FakeModel) -> None:
        P.send_message(conn, P.Ack(99, 0, P.MsgType.REQUEST))

    with (
        scripted_edge(wrong_round) as (port, _),
        EdgeConnection("127.0.0.1", port) as conn,
        pytest.raises(EdgeError, match=r"expected ACK of REQUEST \(0, 0\)"),
    ):
        infer_once(model, conn, device="d1", round_=0, repetition=0, point=0, origin_mono_ns=0)


def test_connection_failure_is_clear() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    conn = EdgeConnection("127.0.0.1", port, connect_timeout_s=0.2)
    with pytest.raises(ConnectionError, match=f"cannot connect to the edge service at 127.0.0.1:{port}"):
        conn.connect()


def test_run_inference_iterates_vectors_then_repetitions_and_writes_csv(tmp_path: Path) -> None:
    model = build(SPEC)
    with scripted_edge(honest) as (port, seen), EdgeConnection("127.0.0.1", port) as conn:
        recs = run_inference(
            model,
            conn,
            device="d2",
            vectors=[[0, 3], [4, 4], [1, 0]],
            device_index=1,
            repetitions=2,
            origin_mono_ns=0,
        )
    assert [(r.round, r.repetition, r.partition_point) for r in recs] == [
        (0, 0, 3), (0, 1, 3), (1, 0, 4), (1, 1, 4), (2, 0, 0), (2, 1, 0)
    ]  # fmt: skip
    assert [type(m).__name__ for m in seen] == ["Request", "Request", "Skip", "Skip", "Request", "Request"]
    path = tmp_path / "inference.csv"
    write_inference_csv(path, recs)
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == INFERENCE_COLUMNS
        rows = list(reader)
    for row in rows:
        phases = ("local_ns", "transmission_ns", "barrier_ns", "queue_ns", "remote_ns", "return_ns")
        assert int(row["total_ns"]) == sum(int(row[k]) for k in phases)
        assert row["max_abs_diff"] == ""
    with pytest.raises(ValueError, match="has no position 5"):
        run_inference(model, None, device="d", vectors=[[0]], device_index=5, repetitions=1, origin_mono_ns=0)


def test_the_connection_leaves_from_the_device_s_own_source_address() -> None:
    """Local mode: the agent's connection to the edge leaves from the device's own loopback address,
    which the userspace link emulator's rules select."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        conn = EdgeConnection("127.0.0.1", srv.getsockname()[1], source="127.7.7.3")
        conn.connect()
        peer, _ = srv.accept()
        with peer:
            assert peer.getpeername()[0] == "127.7.7.3"
        conn.close()
