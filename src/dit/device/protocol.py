"""The framed binary protocol between devices and the edge inference service (stdlib only).

Every message is one frame: a 12-byte header in network byte order followed by ``length`` body
bytes. No pickle, no JSON on the hot path; see ``docs/protocol.md`` for the byte layout.

    header = magic "DITP" (4s) | version (B) | type (B) | flags (H, 0) | length (I)
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from enum import IntEnum

MAGIC = b"DITP"
VERSION = 1
HEADER = struct.Struct("!4sBBHI")
HEADER_SIZE = HEADER.size  # 12
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_ROUTE = struct.Struct("!IIHH")  # round, repetition, partition_point, name length
_ACK = struct.Struct("!IIB")  # round, repetition, acknowledged message type
_RESULT = struct.Struct("!IIqqqH")  # round, repetition, barrier_ns, queue_ns, remote_ns, stages
_MAX_NAME = 255


class MsgType(IntEnum):
    REQUEST = 1
    SKIP = 2
    ACK = 3
    RESULT = 4
    ERROR = 5


class ProtocolError(Exception):
    """A frame that is malformed, of an unknown version/type, or too large."""


@dataclass(frozen=True)
class Request:
    device: str
    round: int
    repetition: int
    partition_point: int
    payload: bytes


@dataclass(frozen=True)
class Skip:
    device: str
    round: int
    repetition: int
    partition_point: int


@dataclass(frozen=True)
class Ack:
    round: int
    repetition: int
    acked: MsgType


@dataclass(frozen=True)
class Result:
    round: int
    repetition: int
    barrier_ns: int
    queue_ns: int
    remote_ns: int
    stages: int
    payload: bytes


@dataclass(frozen=True)
class Error:
    message: str


Message = Request | Skip | Ack | Result | Error


def _name(device: str) -> bytes:
    raw = device.encode("utf-8")
    if not raw or len(raw) > _MAX_NAME:
        raise ProtocolError(f"device name {device!r} must be 1..{_MAX_NAME} UTF-8 bytes")
    return raw


def encode_body(msg: Message) -> tuple[MsgType, list[bytes]]:
    """The message type and its body as a list of byte chunks (payloads are not copied)."""
    try:
        if isinstance(msg, Request):
            name = _name(msg.device)
            head = _ROUTE.pack(msg.round, msg.repetition, msg.partition_point, len(name))
            return MsgType.REQUEST, [head, name, msg.payload]
        if isinstance(msg, Skip):
            name = _name(msg.device)
            return MsgType.SKIP, [
                _ROUTE.pack(msg.round, msg.repetition, msg.partition_point, len(name)),
                name,
            ]
        if isinstance(msg, Ack):
            return MsgType.ACK, [_ACK.pack(msg.round, msg.repetition, int(msg.acked))]
        if isinstance(msg, Result):
            head = _RESULT.pack(
                msg.round, msg.repetition, msg.barrier_ns, msg.queue_ns, msg.remote_ns, msg.stages
            )
            return MsgType.RESULT, [head, msg.payload]
        return MsgType.ERROR, [msg.message.encode("utf-8", errors="replace")]
    except struct.error as exc:
        raise ProtocolError(f"cannot encode {type(msg).__name__}: {exc}") from exc


def encode_parts(msg: Message, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> list[bytes]:
    """The frame as byte chunks: header first, then the body chunks."""
    mtype, body = encode_body(msg)
    length = sum(len(b) for b in body)
    if length > max_frame_bytes:
        raise ProtocolError(
            f"{mtype.name} frame body of {length} bytes exceeds the maximum of {max_frame_bytes}"
        )
    return [HEADER.pack(MAGIC, VERSION, int(mtype), 0, length), *body]


def encode(msg: Message, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """The whole frame as one ``bytes``."""
    return b"".join(encode_parts(msg, max_frame_bytes))


def parse_header(header: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[MsgType, int]:
    """Validate a 12-byte header; return the message type and the body length."""
    if len(header) != HEADER_SIZE:
        raise ProtocolError(f"frame header must be {HEADER_SIZE} bytes, got {len(header)}")
    magic, version, mtype, _flags, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} (expected {MAGIC!r}): not a dit peer or garbage")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this side speaks {VERSION})")
    try:
        kind = MsgType(mtype)
    except ValueError:
        raise ProtocolError(f"unknown message type {mtype}") from None
    if length > max_frame_bytes:
        raise ProtocolError(
            f"{kind.name} frame body of {length} bytes exceeds the maximum of {max_frame_bytes} bytes"
        )
    return kind, length


def _route(body: bytes, kind: MsgType) -> tuple[str, int, int, int, int]:
    if len(body) < _ROUTE.size:
        raise ProtocolError(f"{kind.name} body of {len(body)} bytes is shorter than {_ROUTE.size}")
    rnd, rep, point, nlen = _ROUTE.unpack_from(body)
    end = _ROUTE.size + nlen
    if nlen == 0 or end > len(body):
        raise ProtocolError(f"{kind.name} device name length {nlen} does not fit the body")
    try:
        device = body[_ROUTE.size : end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{kind.name} device name is not UTF-8: {exc}") from exc
    return device, rnd, rep, point, end


def decode_body(kind: MsgType, body: bytes) -> Message:
    """Parse a body of a given type into its message."""
    if kind is MsgType.REQUEST:
        device, rnd, rep, point, end = _route(body, kind)
        return Request(device, rnd, rep, point, body[end:])
    if kind is MsgType.SKIP:
        device, rnd, rep, point, end = _route(body, kind)
        if end != len(body):
            raise ProtocolError(f"SKIP body has {len(body) - end} trailing bytes")
        return Skip(device, rnd, rep, point)
    if kind is MsgType.ACK:
        if len(body) != _ACK.size:
            raise ProtocolError(f"ACK body must be {_ACK.size} bytes, got {len(body)}")
        rnd, rep, acked = _ACK.unpack(body)
        try:
            return Ack(rnd, rep, MsgType(acked))
        except ValueError:
            raise ProtocolError(f"ACK of unknown message type {acked}") from None
    if kind is MsgType.RESULT:
        if len(body) < _RESULT.size:
            raise ProtocolError(f"RESULT body of {len(body)} bytes is shorter than {_RESULT.size}")
        rnd, rep, barrier, queue, remote, stages = _RESULT.unpack_from(body)
        return Result(rnd, rep, barrier, queue, remote, stages, body[_RESULT.size :])
    return Error(body.decode("utf-8", errors="replace"))


def decode(frame: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Message:
    """Parse one complete frame."""
    kind, length = parse_header(frame[:HEADER_SIZE], max_frame_bytes)
    body = frame[HEADER_SIZE:]
    if len(body) != length:
        raise ProtocolError(f"{kind.name} frame announces {length} body bytes, has {len(body)}")
    return decode_body(kind, body)


# --- blocking sockets (device side) -------------------------------------------------------------


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def send_message(sock: socket.socket, msg: Message, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
    """Send one frame (header and body chunks; TCP_NODELAY is the caller's business)."""
    for part in encode_parts(msg, max_frame_bytes):
        if part:
            sock.sendall(part)


def recv_message(sock: socket.socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Message:
    """Receive one complete frame; raises :class:`ConnectionError` on EOF."""
    kind, length = parse_header(_recv_exactly(sock, HEADER_SIZE), max_frame_bytes)
    return decode_body(kind, _recv_exactly(sock, length) if length else b"")


# --- asyncio streams (edge side) ----------------------------------------------------------------


async def read_header(
    reader: asyncio.StreamReader, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[MsgType, int] | None:
    """Read and validate a header; ``None`` on a clean EOF before the first byte."""
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError(f"connection closed inside a frame header ({len(exc.partial)} bytes)") from exc
    return parse_header(header, max_frame_bytes)


async def read_body(reader: asyncio.StreamReader, kind: MsgType, length: int) -> Message:
    try:
        body = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(
            f"connection closed inside a {kind.name} body ({len(exc.partial)} of {length} bytes)"
        ) from exc
    return decode_body(kind, body)
