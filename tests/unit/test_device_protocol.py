"""The framed binary protocol: round trips and refusal of oversize or garbage frames."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from dit.device import protocol as P


@pytest.mark.parametrize(
    "msg",
    [
        P.Request("device1", 3, 7, 2, b"\x00\x01payload" * 100),
        P.Request("ß-dev", 0, 0, 0, b""),
        P.Skip("device2", 1, 2, 11),
        P.Ack(5, 6, P.MsgType.REQUEST),
        P.Ack(5, 6, P.MsgType.SKIP),
        P.Result(1, 2, 30, 40, 50, 9, b"\xff" * 40),
        P.Result(0, 0, 0, 0, 0, 0, b""),
        P.Error("something went wrong: ünïcode"),
    ],
)
def test_round_trip(msg: P.Message) -> None:
    frame = P.encode(msg)
    assert frame[:4] == P.MAGIC
    _kind, length = P.parse_header(frame[: P.HEADER_SIZE])
    assert length == len(frame) - P.HEADER_SIZE
    assert P.decode(frame) == msg


def test_header_layout_is_network_byte_order() -> None:
    frame = P.encode(P.Skip("d", 1, 2, 3))
    magic, version, mtype, flags, length = struct.unpack("!4sBBHI", frame[:12])
    assert (magic, version, mtype, flags) == (b"DITP", 1, 2, 0)
    assert struct.unpack("!IIHH", frame[12:24]) == (1, 2, 3, 1)
    assert length == 12 + 1


def test_oversize_frame_is_refused_on_both_sides() -> None:
    msg = P.Request("d", 0, 0, 0, b"x" * 1000)
    with pytest.raises(P.ProtocolError, match="exceeds the maximum of 100"):
        P.encode(msg, max_frame_bytes=100)
    frame = P.encode(msg)
    with pytest.raises(
        P.ProtocolError, match=r"REQUEST frame body of \d+ bytes exceeds the maximum of 100 bytes"
    ):
        P.decode(frame, max_frame_bytes=100)


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "bad frame magic"),
        (struct.pack("!4sBBHI", b"DITP", 9, 1, 0, 0), "unsupported protocol version 9"),
        (struct.pack("!4sBBHI", b"DITP", 1, 77, 0, 0), "unknown message type 77"),
        (struct.pack("!4sBBHI", b"DITP", 1, 1, 0, 3) + b"abc", "shorter than"),
        (struct.pack("!4sBBHI", b"DITP", 1, 1, 0, 12) + struct.pack("!IIHH", 0, 0, 0, 50), "does not fit"),
        (struct.pack("!4sBBHI", b"DITP", 1, 3, 0, 2) + b"xx", "ACK body must be"),
        (struct.pack("!4sBBHI", b"DITP", 1, 2, 0, 20) + b"\x00" * 20, "does not fit"),
        (struct.pack("!4sBBHI", b"DITP", 1, 1, 0, 10) + b"abc", "announces 10 body bytes, has 3"),
        (b"DIT", "header must be 12 bytes"),
    ],
)
def test_garbage_is_refused(frame: bytes, match: str) -> None:
    with pytest.raises(P.ProtocolError, match=match):
        P.decode(frame)


def test_bad_device_names_are_refused() -> None:
    with pytest.raises(P.ProtocolError, match="device name"):
        P.encode(P.Skip("", 0, 0, 0))
    with pytest.raises(P.ProtocolError, match="device name"):
        P.encode(P.Skip("x" * 256, 0, 0, 0))


def test_out_of_range_fields_are_a_protocol_error() -> None:
    with pytest.raises(P.ProtocolError, match="cannot encode Request"):
        P.encode(P.Request("d", -1, 0, 0, b""))


def test_blocking_socket_helpers() -> None:
    a, b = socket.socketpair()
    with a, b:
        msgs: list[P.Message] = [
            P.Request("d1", 1, 2, 3, bytes(range(256)) * 300),
            P.Ack(1, 2, P.MsgType.REQUEST),
        ]
        for m in msgs:
            P.send_message(a, m)
        assert [P.recv_message(b), P.recv_message(b)] == msgs
        a.sendall(b"NOPE" + b"\x00" * 8)
        with pytest.raises(P.ProtocolError, match="bad frame magic"):
            P.recv_message(b)
        a.sendall(P.encode(P.Request("d1", 0, 0, 0, b"x" * 64))[:20])
        a.close()
        with pytest.raises(ConnectionError, match="connection closed"):
            P.recv_message(b)


def test_asyncio_readers() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        frame = P.encode(P.Result(1, 1, 2, 3, 4, 5, b"out"))
        reader.feed_data(frame + frame[:5])
        reader.feed_eof()
        head = await P.read_header(reader)
        assert head == (P.MsgType.RESULT, len(frame) - P.HEADER_SIZE)
        assert await P.read_body(reader, *head) == P.Result(1, 1, 2, 3, 4, 5, b"out")
        with pytest.raises(P.ProtocolError, match="inside a frame header"):
            await P.read_header(reader)
        empty = asyncio.StreamReader()
        empty.feed_eof()
        assert await P.read_header(empty) is None

    asyncio.run(scenario())
