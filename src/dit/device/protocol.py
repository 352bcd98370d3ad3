"""The framed binary protocol between devices and the edge inference service (stdlib only).

Every message is one frame: a 12-byte header in network byte order followed by ``length`` body
bytes. No pickle, no JSON on the hot path; see ``docs/protocol.md`` for the byte layout.

    header = magic "DITP" (4s) | version (B) | type (B) | flags (H, 0) | length (I)

With the run's key (a file the controller makes per run, 0600 on every node) a connection starts with
a HELLO each way (a fresh nonce from each side), and every later frame carries a 32-byte
HMAC-SHA256 tag after its body: over the frame's sequence number in its direction, its header and
body, keyed by a key derived from the run's key and both nonces (:class:`Session`). Whoever cannot
reach the key cannot make a frame the other side accepts, nor replay one from another connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

MAGIC = b"DITP"
VERSION = 2  # 2: HELLO and the per-frame MAC
HEADER = struct.Struct("!4sBBHI")
HEADER_SIZE = HEADER.size  # 12
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_ROUTE = struct.Struct("!IIHH")  # round, repetition, partition_point, name length
_ACK = struct.Struct("!IIB")  # round, repetition, acknowledged message type
_RESULT = struct.Struct("!IIqqqH")  # round, repetition, barrier_ns, queue_ns, remote_ns, stages
_MAX_NAME = 255
_SEQ = struct.Struct("!Q")  # a frame's sequence number in its direction, first in what its tag covers

NONCE_BYTES = 16
TAG_BYTES = 32  # HMAC-SHA256, whole
KEY_MIN_BYTES = 32
KEY_FILE = "edge.key"  # the run's key, in the node's run root (hex, 0600)


class MsgType(IntEnum):
    REQUEST = 1
    SKIP = 2
    ACK = 3
    RESULT = 4
    ERROR = 5
    HELLO = 6


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


@dataclass(frozen=True)
class Hello:
    """The first frame each way on a keyed connection: this side's fresh nonce."""

    nonce: bytes


Message = Request | Skip | Ack | Result | Error | Hello


class AuthError(ProtocolError):
    """A frame whose tag is missing or is not the one the run's key gives: refused, connection dropped.

    ``device`` is the device name the frame claims (a REQUEST's or SKIP's, unverified), for the log."""

    def __init__(self, message: str, device: str | None = None) -> None:
        super().__init__(message)
        self.device = device


def read_key(path: str | os.PathLike[str]) -> bytes:
    """The run's key from its file: hex, at least :data:`KEY_MIN_BYTES` bytes, a regular file of this
    process's user that nobody else may read (not followed through a symlink)."""
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ProtocolError(f"{where}: cannot open the run's key: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProtocolError(f"{where}: the run's key is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ProtocolError(
                f"{where}: the run's key is mode {stat.S_IMODE(st.st_mode):04o} of uid {st.st_uid}; "
                f"it must be this user's (uid {os.geteuid()}) and 0600"
            )
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"{where}: the run's key is not hex") from None
    if len(key) < KEY_MIN_BYTES:
        raise ProtocolError(f"{where}: the run's key has {len(key)} bytes, fewer than {KEY_MIN_BYTES}")
    return key


class Session:
    """One keyed connection's MAC state: a key per direction, derived from the run's key and both
    HELLO nonces, and a frame counter per direction (TCP keeps the order, so both sides agree).

    The tag of a frame is ``HMAC-SHA256(direction key, seq (u64) | header | body)``: a frame from
    another connection, another run, out of order or altered in any byte does not verify. Cost: one
    HMAC over the frame, from a pre-keyed copy (docs/protocol.md gives the figures)."""

    def __init__(self, key: bytes, device_nonce: bytes, edge_nonce: bytes, *, edge: bool) -> None:
        if len(device_nonce) != NONCE_BYTES or len(edge_nonce) != NONCE_BYTES:
            raise ProtocolError(f"HELLO nonces must be {NONCE_BYTES} bytes")
        base = hmac.new(key, b"dit-edge-session\0" + device_nonce + edge_nonce, hashlib.sha256).digest()
        to_edge = hmac.new(hmac.new(base, b"device->edge", hashlib.sha256).digest(), digestmod=hashlib.sha256)
        to_device = hmac.new(
            hmac.new(base, b"edge->device", hashlib.sha256).digest(), digestmod=hashlib.sha256
        )
        self._send, self._recv = (to_device, to_edge) if edge else (to_edge, to_device)
        self.sent = 0
        self.received = 0

    @staticmethod
    def _tag(base: hmac.HMAC, seq: int, parts: Sequence[bytes]) -> bytes:
        mac = base.copy()
        mac.update(_SEQ.pack(seq))
        for part in parts:
            mac.update(part)
        return mac.digest()

    def sign(self, parts: Sequence[bytes]) -> bytes:
        """The tag of the next frame sent (header and body chunks)."""
        tag = self._tag(self._send, self.sent, parts)
        self.sent += 1
        return tag

    def verify(self, kind: MsgType, parts: Sequence[bytes], tag: bytes) -> None:
        """Accept the next frame received, or raise :class:`AuthError`."""
        expected = self._tag(self._recv, self.received, parts)
        self.received += 1
        if not hmac.compare_digest(expected, tag):
            raise AuthError(f"{kind.name} frame: its MAC is not the run's key's")


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
        if isinstance(msg, Hello):
            if len(msg.nonce) != NONCE_BYTES:
                raise ProtocolError(f"HELLO nonce must be {NONCE_BYTES} bytes, got {len(msg.nonce)}")
            return MsgType.HELLO, [msg.nonce]
        return MsgType.ERROR, [msg.message.encode("utf-8", errors="replace")]
    except struct.error as exc:
        raise ProtocolError(f"cannot encode {type(msg).__name__}: {exc}") from exc


def encode_parts(
    msg: Message, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, session: Session | None = None
) -> list[bytes]:
    """The frame as byte chunks: header first, then the body chunks, then the tag with a ``session``."""
    mtype, body = encode_body(msg)
    length = sum(len(b) for b in body)
    if length > max_frame_bytes:
        raise ProtocolError(
            f"{mtype.name} frame body of {length} bytes exceeds the maximum of {max_frame_bytes}"
        )
    parts = [HEADER.pack(MAGIC, VERSION, int(mtype), 0, length), *body]
    if session is not None:
        parts.append(session.sign(parts))
    return parts


def encode(
    msg: Message, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, session: Session | None = None
) -> bytes:
    """The whole frame as one ``bytes``."""
    return b"".join(encode_parts(msg, max_frame_bytes, session))


def parse_header(header: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[MsgType, int]:
    """Validate a 12-byte header; return the message type and the body length."""
    if len(header) != HEADER_SIZE:
        raise ProtocolError(f"frame header must be {HEADER_SIZE} bytes, got {len(header)}")
    magic, version, mtype, flags, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} (expected {MAGIC!r}): not a dit peer or garbage")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this side speaks {VERSION})")
    try:
        kind = MsgType(mtype)
    except ValueError:
        raise ProtocolError(f"unknown message type {mtype}") from None
    if flags:  # none defined; refused so that a frame's header is exactly what its tag covers
        raise ProtocolError(f"{kind.name} frame has flags {flags:#06x}; none are defined")
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
    if kind is MsgType.HELLO:
        if len(body) != NONCE_BYTES:
            raise ProtocolError(f"HELLO body must be {NONCE_BYTES} bytes, got {len(body)}")
        return Hello(body)
    return Error(body.decode("utf-8", errors="replace"))


def claimed_device(kind: MsgType, body: bytes) -> str | None:
    """The device name a REQUEST or SKIP body claims, for the log of a refused frame (else None)."""
    if kind not in (MsgType.REQUEST, MsgType.SKIP):
        return None
    try:
        return _route(body, kind)[0]
    except ProtocolError:
        return None


def _verified(kind: MsgType, body: bytes, tag: bytes, session: Session) -> Message:
    header = HEADER.pack(MAGIC, VERSION, int(kind), 0, len(body))
    try:
        session.verify(kind, (header, body), tag)
    except AuthError as exc:
        raise AuthError(str(exc), claimed_device(kind, body)) from None
    return decode_body(kind, body)


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


def send_message(
    sock: socket.socket,
    msg: Message,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    session: Session | None = None,
) -> None:
    """Send one frame (header, body chunks and tag; TCP_NODELAY is the caller's business)."""
    for part in encode_parts(msg, max_frame_bytes, session):
        if part:
            sock.sendall(part)


def recv_message(
    sock: socket.socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, session: Session | None = None
) -> Message:
    """Receive one complete frame (verified with a ``session``); raises :class:`ConnectionError` on EOF."""
    kind, length = parse_header(_recv_exactly(sock, HEADER_SIZE), max_frame_bytes)
    body = _recv_exactly(sock, length) if length else b""
    if session is None:
        return decode_body(kind, body)
    return _verified(kind, body, _recv_exactly(sock, TAG_BYTES), session)


def device_handshake(sock: socket.socket, key: bytes) -> Session:
    """The device's side of a keyed connection's start: HELLO with its nonce, the edge's HELLO back."""
    nonce = os.urandom(NONCE_BYTES)
    send_message(sock, Hello(nonce))
    reply = recv_message(sock)
    if isinstance(reply, Error):
        raise AuthError(f"the edge service refused the HELLO: {reply.message}")
    if not isinstance(reply, Hello):
        raise AuthError(f"expected the edge service's HELLO, got {type(reply).__name__}")
    return Session(key, nonce, reply.nonce, edge=False)


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


async def read_body(
    reader: asyncio.StreamReader, kind: MsgType, length: int, session: Session | None = None
) -> Message:
    """The body after a header (and, with a ``session``, the tag, verified before anything is decoded)."""
    try:
        body = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(
            f"connection closed inside a {kind.name} body ({len(exc.partial)} of {length} bytes)"
        ) from exc
    if session is None:
        return decode_body(kind, body)
    try:
        tag = await reader.readexactly(TAG_BYTES)
    except asyncio.IncompleteReadError as exc:
        raise AuthError(
            f"{kind.name} frame: connection closed inside its tag ({len(exc.partial)} of {TAG_BYTES} bytes)",
            claimed_device(kind, body),
        ) from exc
    return _verified(kind, body, tag, session)
