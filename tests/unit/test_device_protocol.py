"""The framed binary protocol: round trips and refusal of oversize or garbage frames."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

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
    assert (magic, version, mtype, flags) == (b"DITP", 2, 2, 0)
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
        (struct.pack("!4sBBHI", b"DITP", P.VERSION, 77, 0, 0), "unknown message type 77"),
        (struct.pack("!4sBBHI", b"DITP", P.VERSION, 1, 0, 3) + b"abc", "shorter than"),
        (
            struct.pack("!4sBBHI", b"DITP", P.VERSION, 1, 0, 12) + struct.pack("!IIHH", 0, 0, 0, 50),
            "does not fit",
        ),
        (struct.pack("!4sBBHI", b"DITP", P.VERSION, 3, 0, 2) + b"xx", "ACK body must be"),
        (struct.pack("!4sBBHI", b"DITP", P.VERSION, 2, 0, 20) + b"\x00" * 20, "does not fit"),
        (struct.pack("!4sBBHI", b"DITP", P.VERSION, 1, 0, 10) + b"abc", "announces 10 body bytes, has 3"),
        (struct.pack("!4sBBHI", b"DITP", P.VERSION, 2, 1, 0), "flags 0x0001; none are defined"),
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


# --- the frame MAC (issue 46) --------------------------------------------------------------------

KEY = bytes(range(32))
OTHER_RUN_KEY = bytes(range(1, 33))


def _sessions(device_key: bytes = KEY, edge_key: bytes = KEY) -> tuple[P.Session, P.Session]:
    """(device side, edge side) of one connection, as the HELLO exchange makes them."""
    nd, ne = b"d" * P.NONCE_BYTES, b"e" * P.NONCE_BYTES
    return P.Session(device_key, nd, ne, edge=False), P.Session(edge_key, nd, ne, edge=True)


def _edge_reads(data: bytes, session: P.Session) -> P.Message:
    """What the edge's asyncio reader makes of ``data`` with ``session``."""

    async def read() -> P.Message:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        head = await P.read_header(reader)
        assert head is not None
        return await P.read_body(reader, *head, session)

    return asyncio.run(read())


SKIP = P.Skip("device1", 0, 0, 4)
REQUEST = P.Request("device1", 0, 0, 2, b"\x01activation" * 50)


def test_signed_frames_pass_in_both_directions_in_order() -> None:
    device, edge = _sessions()
    for msg in (SKIP, REQUEST):
        frame = P.encode(msg, session=device)
        assert len(frame) == len(P.encode(msg)) + P.TAG_BYTES
        assert _edge_reads(frame, edge) == msg
    a, b = socket.socketpair()
    with a, b:
        P.send_message(a, P.Ack(0, 0, P.MsgType.SKIP), session=edge)
        assert P.recv_message(b, session=device) == P.Ack(0, 0, P.MsgType.SKIP)


@pytest.mark.parametrize("offset", [2, 5, 13, 30, -1])  # magic, type, body (round, payload), tag
def test_an_altered_frame_is_refused(offset: int) -> None:
    device, edge = _sessions()
    frame = bytearray(P.encode(REQUEST, session=device))
    frame[offset] ^= 0x01
    with pytest.raises(P.ProtocolError):  # a header byte: refused as malformed, else by its MAC
        _edge_reads(bytes(frame), edge)


def test_a_body_byte_changed_fails_the_mac_and_names_the_claimed_device() -> None:
    device, edge = _sessions()
    frame = bytearray(P.encode(REQUEST, session=device))
    frame[-P.TAG_BYTES - 1] ^= 0xFF  # the last payload byte
    with pytest.raises(P.AuthError, match="REQUEST frame: its MAC is not the run's key's") as caught:
        _edge_reads(bytes(frame), edge)
    assert caught.value.device == "device1"


def test_an_unsigned_frame_is_refused() -> None:
    _device, edge = _sessions()
    with pytest.raises(P.AuthError, match="connection closed inside its tag"):
        _edge_reads(P.encode(SKIP), edge)


def test_a_frame_signed_with_another_runs_key_is_refused() -> None:
    device, edge = _sessions(device_key=OTHER_RUN_KEY)
    with pytest.raises(P.AuthError, match="MAC"):
        _edge_reads(P.encode(SKIP, session=device), edge)


def test_a_frame_replayed_on_another_connection_or_out_of_order_is_refused() -> None:
    device, edge = _sessions()
    first = P.encode(SKIP, session=device)
    assert _edge_reads(first, edge) == SKIP
    with pytest.raises(P.AuthError):  # the same frame again: its sequence number is taken
        _edge_reads(first, edge)
    other_device = P.Session(KEY, b"x" * P.NONCE_BYTES, b"e" * P.NONCE_BYTES, edge=False)
    _, fresh_edge = _sessions()
    with pytest.raises(P.AuthError):  # another connection's nonces give another key
        _edge_reads(P.encode(SKIP, session=other_device), fresh_edge)
    # the edge's own frame sent back to it is not a device's (a key per direction)
    _, edge2 = _sessions()
    with pytest.raises(P.AuthError):
        _edge_reads(P.encode(SKIP, session=P.Session(KEY, b"d" * 16, b"e" * 16, edge=True)), edge2)


def test_handshake_over_sockets() -> None:
    import threading

    a, b = socket.socketpair()
    got: list[P.Message] = []

    def edge_side() -> None:
        hello = P.recv_message(b)
        assert isinstance(hello, P.Hello)
        nonce = b"n" * P.NONCE_BYTES
        P.send_message(b, P.Hello(nonce))
        got.append(P.recv_message(b, session=P.Session(KEY, hello.nonce, nonce, edge=True)))

    with a, b:
        thread = threading.Thread(target=edge_side)
        thread.start()
        session = P.device_handshake(a, KEY)
        P.send_message(a, SKIP, session=session)
        thread.join(10)
    assert got == [SKIP]


def test_read_key_wants_a_private_hex_file(tmp_path: Path) -> None:
    import os

    path = tmp_path / "edge.key"
    path.write_text(KEY.hex() + "\n")
    path.chmod(0o600)
    assert P.read_key(path) == KEY
    path.chmod(0o644)
    with pytest.raises(P.ProtocolError, match=r"edge\.key: the run's key is mode 0644 .* must be .* 0600"):
        P.read_key(path)
    path.chmod(0o600)
    path.write_text("ab" * 8)
    with pytest.raises(P.ProtocolError, match="8 bytes, fewer than 32"):
        P.read_key(path)
    link = tmp_path / "link.key"
    os.symlink(path, link)
    with pytest.raises(P.ProtocolError, match="cannot open the run's key"):
        P.read_key(link)
