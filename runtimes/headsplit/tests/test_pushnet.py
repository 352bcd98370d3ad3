"""Dataflow control's transport: frames without pickle, persistent connections from the sender's own
address with TCP_NODELAY."""

from __future__ import annotations

import queue
import socket

import pytest

torch = pytest.importorskip("torch")

from headsplit import dataflow, pushnet  # noqa: E402


def test_a_message_round_trips_through_a_frame() -> None:
    t = torch.randn(3, 5)
    msg = dataflow.Msg("x", 7, 1, 12, 4, "worker1", "worker2", t, verdict=False, hops=5, path_ns=99,
                       verdicts=((0, 0.25, True), (2, 1.5, False)))  # fmt: skip
    frame = pushnet.encode(msg)
    n_head, n_payload = pushnet.FRAME.unpack(frame[: pushnet.FRAME.size])
    head = frame[pushnet.FRAME.size : pushnet.FRAME.size + n_head]
    assert n_payload == 3 * 5 * 4 and head.startswith(b"{")  # JSON, never pickle
    got = pushnet.decode(head, frame[pushnet.FRAME.size + n_head :])
    assert got.t is not None and torch.equal(got.t, t)
    assert (got.kind, got.step, got.attempt, got.start, got.layer, got.src, got.dst) == (
        "x",
        7,
        1,
        12,
        4,
        "worker1",
        "worker2",
    )
    assert (got.verdict, got.hops, got.path_ns, got.verdicts) == (False, 5, 99, msg.verdicts)
    assert (
        pushnet.decode(*_split(pushnet.encode(dataflow.Msg("error", 1, 0, 0, 0, "a", "b", None, text="x")))).t
        is None
    )


def _split(frame: bytes) -> tuple[bytes, bytes]:
    n_head, _ = pushnet.FRAME.unpack(frame[: pushnet.FRAME.size])
    return frame[pushnet.FRAME.size : pushnet.FRAME.size + n_head], frame[pushnet.FRAME.size + n_head :]


def test_two_processes_ends_push_both_ways_from_their_own_addresses() -> None:
    """Two ends on their own loopback addresses: every message arrives, in order, and each connection
    leaves from its sender's address with TCP_NODELAY set."""
    got: dict[str, queue.Queue[dataflow.Msg]] = {"a": queue.Queue(), "b": queue.Queue()}
    a = pushnet.PushNet("a", "127.0.0.1", got["a"].put)
    try:
        b = pushnet.PushNet("b", "127.0.0.2", got["b"].put)
    except OSError:
        a.close()
        pytest.skip("127.0.0.2 cannot be bound here")
    try:
        table = {"a": a.address, "b": b.address}
        a.connect(table)
        b.connect(table)
        assert a.conns["b"].getsockname()[0] == "127.0.0.1" and b.conns["a"].getsockname()[0] == "127.0.0.2"
        for end in (a, b):
            (conn,) = end.conns.values()
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        for i in range(50):
            a.send(dataflow.Msg("h", i, 0, 0, 0, "a", "b", torch.full((1, 4), float(i))))
            b.send(dataflow.Msg("z", i, 0, 0, 0, "b", "a", torch.full((1, 4), -float(i))))
        for name, sign in (("b", 1.0), ("a", -1.0)):
            for i in range(50):
                m = got[name].get(timeout=10)
                assert m.step == i and m.t is not None and float(m.t[0, 0]) == sign * i
    finally:
        a.close()
        b.close()
