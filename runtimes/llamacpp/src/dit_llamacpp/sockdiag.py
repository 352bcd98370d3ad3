"""The TCP bytes through a listening port, from the kernel's per-socket counters (standard library only;
written beside ``node.py`` into the run directory).

rpc-server moves its traffic with ``send``/``recv``, which the per-process I/O counters
(``/proc/<pid>/io``'s ``rchar``/``wchar``) do not count, so its bytes are read from the sockets
themselves: a ``NETLINK_SOCK_DIAG`` dump (``SOCK_DIAG_BY_FAMILY`` with ``struct inet_diag_req_v2``,
the ``INET_DIAG_INFO`` extension) returns every TCP socket of this network namespace with its
``struct tcp_info``, whose ``tcpi_bytes_acked`` (bytes sent and acknowledged by the peer),
``tcpi_bytes_received`` (Linux 4.1/4.2) and ``tcpi_bytes_sent`` (sent including retransmissions,
Linux 4.19) are the socket's payload bytes since it was opened. This is what ``ss -ti`` prints.

:class:`PortTraffic` keeps the sockets whose local port (and address) is the server's, remembers the last
counters of each socket by its cookie (so a connection closed between two samples still counts) and sums
them. A closed connection's last counters would miss what it moved after the last sample, so it also
listens to the kernel's notices of destroyed TCP sockets (the sock_diag multicast groups
``SKNLGRP_INET_TCP_DESTROY``/``SKNLGRP_INET6_TCP_DESTROY``, which carry the socket's final ``tcp_info``):
with them a connection counts to its last byte (``tcp_final`` counts those sockets; where the groups
cannot be joined, ``tcp_final_error`` says why and the last sample's counters stand). Where the kernel
or platform has no sock_diag at all, the sample carries ``tcp_error`` with the reason instead of counters.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
INET_DIAG_INFO = 2
TCP_LISTEN = 10
TCP_TIME_WAIT = 6
TCP_SYN_RECV = 3
# every TCP state but LISTEN (1 .. 11): a closing connection still counts
STATES = sum(1 << s for s in range(1, 12) if s != TCP_LISTEN)

SKNLGRP_INET_TCP_DESTROY = 1  # the multicast groups of destroyed sockets' last state (linux/sock_diag.h)
SKNLGRP_INET6_TCP_DESTROY = 3
NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
REQ_V2 = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states; then the 48-byte sockid
SOCKID_LEN = 48
DIAG_MSG_LEN = 72  # struct inet_diag_msg
RTATTR = struct.Struct("=HH")  # len, type
# struct tcp_info offsets (linux/tcp.h)
BYTES_ACKED, BYTES_RECEIVED, BYTES_SENT = 120, 128, 200


class SockDiagError(OSError):
    """sock_diag cannot give the counters here; the message says why."""


@dataclass(frozen=True)
class TcpSocket:
    family: int
    state: int
    local: tuple[str, int]
    remote: tuple[str, int]
    cookie: int
    inode: int
    bytes_acked: int | None  # None: no tcp_info for this socket (time-wait, request) or too old a kernel
    bytes_received: int | None
    bytes_sent: int | None  # None also on kernels before 4.19


def _align(n: int) -> int:
    return (n + 3) & ~3


def request(family: int, seq: int) -> bytes:
    """A dump request for every non-listening TCP socket of ``family`` with its ``tcp_info``."""
    body = REQ_V2.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, STATES) + bytes(SOCKID_LEN)
    header = NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
    return header + body


def _address(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    return socket.inet_ntop(socket.AF_INET6, raw[:16])


def _u64(data: bytes, offset: int) -> int | None:
    return int(struct.unpack_from("=Q", data, offset)[0]) if len(data) >= offset + 8 else None


def parse_socket(payload: bytes) -> TcpSocket:
    """One ``SOCK_DIAG_BY_FAMILY`` answer: ``struct inet_diag_msg`` then its attributes."""
    if len(payload) < DIAG_MSG_LEN:
        raise SockDiagError(
            errno.EPROTO, f"sock_diag: a socket of {len(payload)} bytes, expected {DIAG_MSG_LEN}"
        )
    family, state = payload[0], payload[1]
    sport, dport = struct.unpack_from(">HH", payload, 4)
    src, dst = payload[8:24], payload[24:40]
    cookie_lo, cookie_hi = struct.unpack_from("=II", payload, 44)
    (inode,) = struct.unpack_from("=I", payload, 68)
    info = b""
    offset = DIAG_MSG_LEN
    while offset + RTATTR.size <= len(payload):
        length, kind = RTATTR.unpack_from(payload, offset)
        if length < RTATTR.size:
            break
        if kind == INET_DIAG_INFO:
            info = payload[offset + RTATTR.size : offset + length]
        offset += _align(length)
    return TcpSocket(
        family=family,
        state=state,
        local=(_address(family, src), sport),
        remote=(_address(family, dst), dport),
        cookie=cookie_lo | cookie_hi << 32,
        inode=inode,
        bytes_acked=_u64(info, BYTES_ACKED),
        bytes_received=_u64(info, BYTES_RECEIVED),
        bytes_sent=_u64(info, BYTES_SENT),
    )


def parse_messages(data: bytes, seq: int) -> tuple[list[TcpSocket], bool]:
    """The sockets in one netlink read of the dump with ``seq``, and whether it ended (``NLMSG_DONE``);
    an ``NLMSG_ERROR`` raises :class:`SockDiagError` with the kernel's errno."""
    sockets: list[TcpSocket] = []
    offset = 0
    while offset + NLMSGHDR.size <= len(data):
        length, kind, _flags, got_seq, _pid = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size or offset + length > len(data):
            raise SockDiagError(errno.EPROTO, f"sock_diag: a truncated netlink message ({length} bytes)")
        payload = data[offset + NLMSGHDR.size : offset + length]
        offset += _align(length)
        if got_seq != seq:
            continue
        if kind == NLMSG_DONE:
            return sockets, True
        if kind == NLMSG_ERROR:
            code = -int(struct.unpack_from("=i", payload, 0)[0]) if len(payload) >= 4 else errno.EPROTO
            if code == 0:  # an acknowledgement, not an error
                continue
            raise SockDiagError(code, f"sock_diag: the kernel refused the dump: {os.strerror(code)}")
        if kind == SOCK_DIAG_BY_FAMILY:
            sockets.append(parse_socket(payload))
    return sockets, False


def _netlink() -> socket.socket:
    netlink = getattr(socket, "AF_NETLINK", None)
    if netlink is None:
        raise SockDiagError(errno.EAFNOSUPPORT, "sock_diag: no netlink sockets on this platform")
    try:
        return socket.socket(netlink, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    except OSError as exc:
        code = exc.errno or errno.EPROTONOSUPPORT
        raise SockDiagError(code, f"sock_diag: no NETLINK_SOCK_DIAG socket: {exc}") from exc


def dump(family: int, timeout: float = 2.0) -> list[TcpSocket]:
    """Every non-listening TCP socket of ``family`` in this network namespace."""
    sock = _netlink()
    seq = 1
    found: list[TcpSocket] = []
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendall(request(family, seq))
            while True:
                data = sock.recv(1 << 17)
                if not data:
                    raise SockDiagError(errno.EPROTO, "sock_diag: the dump ended without NLMSG_DONE")
                sockets, done = parse_messages(data, seq)
                found += sockets
                if done:
                    return found
        except SockDiagError:
            raise
        except OSError as exc:
            raise SockDiagError(exc.errno or errno.EIO, f"sock_diag: {exc}") from exc


def destroy_notices() -> socket.socket:
    """A non-blocking netlink socket joined to the groups of destroyed TCP sockets (IPv4 and IPv6)."""
    sock = _netlink()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        groups = (1 << (SKNLGRP_INET_TCP_DESTROY - 1)) | (1 << (SKNLGRP_INET6_TCP_DESTROY - 1))
        sock.bind((0, groups))
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise SockDiagError(
            exc.errno or errno.EIO, f"sock_diag: cannot join the destroy notices: {exc}"
        ) from exc
    return sock


def _same_address(family: int, a: str, b: str) -> bool:
    try:
        return socket.inet_pton(family, a) == socket.inet_pton(family, b)
    except OSError:
        return False


class PortTraffic:
    """Running totals of the TCP payload bytes through the server sockets of local ``port`` (and local
    ``address`` when given): per socket the last counters seen, or its final ones from the kernel's
    destroy notice, so closed connections keep counting."""

    def __init__(self, port: int, address: str | None = None) -> None:
        self.port = port
        self.address = address
        self.last: dict[int, TcpSocket] = {}
        self.final: set[int] = set()  # cookies counted to their close (a destroy notice)
        self.notices: socket.socket | None = None
        self.notices_error = ""
        try:
            self.notices = destroy_notices()
        except SockDiagError as exc:
            self.notices_error = str(exc.strerror or exc)

    def close(self) -> None:
        if self.notices is not None:
            self.notices.close()
            self.notices = None

    def _families(self) -> tuple[int, ...]:
        if self.address is None:
            return (socket.AF_INET, socket.AF_INET6)
        return (socket.AF_INET6,) if ":" in self.address else (socket.AF_INET,)

    def _mine(self, s: TcpSocket) -> bool:
        if s.local[1] != self.port or s.state == TCP_LISTEN:  # the listener's own notice moved nothing
            return False
        return self.address is None or _same_address(s.family, s.local[0], self.address)

    def _keep(self, s: TcpSocket) -> None:
        if s.bytes_acked is None or s.bytes_received is None:
            if s.state in (TCP_TIME_WAIT, TCP_SYN_RECV):  # no tcp_info: nothing more to count
                return
            raise SockDiagError(
                errno.ENODATA,
                "sock_diag: no tcpi_bytes_acked/tcpi_bytes_received in this kernel's tcp_info (they need Linux 4.2)",
            )
        self.last[s.cookie] = s

    def drain(self) -> None:
        """Take the final counters of the port's sockets destroyed since the last call."""
        while self.notices is not None:
            try:
                data = self.notices.recv(1 << 17)
            except BlockingIOError:
                return
            except OSError as exc:  # ENOBUFS: some notices were dropped; their sockets keep their last sample
                if exc.errno == errno.ENOBUFS:
                    self.notices_error = "some destroy notices were dropped (ENOBUFS)"
                    continue
                self.notices_error = f"sock_diag: destroy notices: {exc}"
                self.close()
                return
            for s in parse_messages(data, 0)[0]:
                if self._mine(s):
                    self._keep(s)
                    self.final.add(s.cookie)

    def update(self) -> None:
        """Read the counters of the port's sockets now (raises :class:`SockDiagError`)."""
        for family in self._families():
            for s in dump(family):
                if self._mine(s) and s.cookie not in self.final:
                    self._keep(s)
        self.drain()

    def sample(self) -> dict[str, int | str]:
        """``tcp_acked``, ``tcp_received`` (and ``tcp_sent`` where the kernel has it) summed over every
        socket seen so far, ``tcp_sockets`` their count and ``tcp_final`` how many of them were counted
        to their close (``tcp_final_error`` where the destroy notices are not read); or ``tcp_error``
        saying why there are no counters."""
        try:
            self.update()
        except SockDiagError as exc:
            return {"tcp_error": str(exc.strerror or exc)}
        seen = list(self.last.values())
        row: dict[str, int | str] = {
            "tcp_acked": sum(s.bytes_acked or 0 for s in seen),
            "tcp_received": sum(s.bytes_received or 0 for s in seen),
            "tcp_sockets": len(seen),
            "tcp_final": len(self.final),
        }
        if all(s.bytes_sent is not None for s in seen):
            row["tcp_sent"] = sum(s.bytes_sent or 0 for s in seen)
        if self.notices_error:
            row["tcp_final_error"] = self.notices_error
        return row
