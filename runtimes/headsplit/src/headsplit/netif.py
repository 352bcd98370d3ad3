"""Where the RPC stack listens (stdlib only: imports without torch).

torch.distributed.rpc is **unauthenticated pickle**: whoever reaches one of its ports can have the
process unpickle what they send, i.e. run code as the user of the worker or controller. So every
listener of a HeadSplit process is bound to the node's inference address, never to the wildcard, and
:func:`check_bind` refuses an address that would not pin it there.

A HeadSplit process has three listeners:

* the rendezvous (torch's ``TCPStore``, on the controller at ``address:port``). torch's server binds the
  wildcard whatever host it is given, so :func:`listen_socket` binds the socket itself and torch only
  listens on it (``master_listen_fd``; :mod:`headsplit.rpc`);
* TensorPipe (the calls) and the Gloo process group that ``init_rpc`` builds for its barriers. Both take
  the address of the hostname by default. On the rack the hostname may name the management network,
  and on the emulated rack every node is a network namespace of one machine whose hostname resolves to
  127.0.0.1 -- each node's *own* loopback -- so Gloo's full-mesh connect is refused ("Gloo
  connectFullMesh failed ... Connection refused"). Both follow an interface name instead
  (``TP_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``): :func:`bind_interface` pins them to the interface of
  the address.

In local mode every node is this machine and each device has a loopback address of its own,
``127.A.B.C`` (the testbed's ``LaunchContext.source_addresses``: the userspace link emulator selects a
device's packets by it). No interface holds that address -- the loopback's is 127.0.0.1, so naming the
interface would pin 127.0.0.1 -- so :func:`pin` gives the process a UTS namespace of its own whose
hostname *is* the address: TensorPipe and Gloo, with no interface named, resolve the hostname and listen
there, and every packet they send on a connection made to them leaves from it.

:func:`listeners` reads back what a process really listens on, so that the controller and the workers
check the result (:func:`stray_listeners`) instead of trusting torch's choice of address.
"""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Collection, MutableMapping
from pathlib import Path

SIOCGIFADDR = 0x8915
CLONE_NEWUTS = 0x04000000  # <linux/sched.h>
IFNAME_VARIABLES = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


class BindRefused(ValueError):
    """A HeadSplit process would listen outside the node's inference address; the message says why."""


def interface_of(address: str) -> str | None:
    """The network interface holding IPv4 ``address`` (Linux ioctl SIOCGIFADDR), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def check_bind(address: str, where: str = "address") -> str:
    """The interface every listener may bind ``address`` on, or :class:`BindRefused` naming ``where``.

    ``address`` must be one IPv4 address that an interface of this node holds: the wildcard (``0.0.0.0``,
    ``::``), an empty value, a host name, a multicast or broadcast address would expose the
    unauthenticated RPC elsewhere, or cannot be bound at all.
    """
    if not address.strip():
        raise BindRefused(
            f"{where}: empty; HeadSplit binds its RPC (unauthenticated) to the node's inference address only"
        )
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise BindRefused(
            f"{where}: {address!r} is not an IP address; give the node's inference address "
            "(a host name may resolve to another network)"
        ) from None
    if ip.is_unspecified:
        raise BindRefused(
            f"{where}: {address} is the wildcard, which would expose torch RPC (unauthenticated pickle) on "
            "every interface; give the node's inference address"
        )
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise BindRefused(f"{where}: {address} is not a unicast address; give the node's inference address")
    name = interface_of(address) if ip.version == 4 else None
    if name is None:
        raise BindRefused(
            f"{where}: {address} is not an IPv4 address of any interface of this node; give the node's "
            "inference address"
        )
    return name


def bind_interface(address: str, env: MutableMapping[str, str] | None = None, where: str = "address") -> str:
    """Point TensorPipe and Gloo at the interface of ``address`` (:func:`check_bind`); returns it.

    A variable already set to another interface is refused: the listeners would follow it, away from
    the inference address."""
    target = os.environ if env is None else env
    name = check_bind(address, where)
    for variable in IFNAME_VARIABLES:
        current = target.get(variable)
        if current and current != name:
            raise BindRefused(
                f"{variable}={current} would bind torch RPC to another interface than {where} {address} "
                f"({name}); unset it"
            )
        target[variable] = name
    return name


def own_hostname(address: str) -> None:
    """Give this process (and the threads and children it starts from here on) a UTS namespace of its
    own whose hostname is ``address``; :class:`OSError` when the kernel refuses (CAP_SYS_ADMIN needed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUTS) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWUTS): {os.strerror(errno)}")
    socket.sethostname(address)


def pin(
    address: str,
    source: str | None,
    env: MutableMapping[str, str] | None = None,
    where: str = "address",
    source_where: str = "source_address",
) -> tuple[str, str | None]:
    """Where this process's TensorPipe and Gloo listen, pinned before ``init_rpc``: ``(address, note)``.

    Without ``source``: ``address``, through its interface (:func:`bind_interface`). With ``source`` (the
    node's own source address; local mode: the device's loopback address ``127.A.B.C``): an interface
    holding it is named as for ``address``; a loopback address no interface holds becomes this process's
    hostname in a UTS namespace of its own (:func:`own_hostname`), and TensorPipe and Gloo, with no
    interface variable set, resolve the hostname and listen on it. Where the kernel refuses that (not
    root), ``address`` as without ``source``, and ``note`` says why: the link emulator, which selects
    the device's packets by ``source``, would not see this process's (it needs root too)."""
    if not source:
        bind_interface(address, env, where)
        return address, None
    target = os.environ if env is None else env
    try:
        ip = ipaddress.ip_address(source)
    except ValueError:
        raise BindRefused(f"{source_where}: {source!r} is not an IP address") from None
    if ip.version == 4 and interface_of(source) is not None:
        bind_interface(source, env, source_where)
        return source, None
    if not (ip.version == 4 and ip.is_loopback):
        raise BindRefused(
            f"{source_where}: {source} is neither an IPv4 address of an interface of this node nor a loopback "
            "address; give the node's own address"
        )
    for variable in IFNAME_VARIABLES:
        if target.get(variable):
            raise BindRefused(
                f"{variable}={target[variable]} would bind torch RPC to that interface's address, not to "
                f"{source_where} {source}; unset it"
            )
    try:
        own_hostname(source)
    except OSError as exc:
        bind_interface(address, env, where)
        return address, (
            f"listening on {where} {address}, not on {source_where} {source} ({exc.strerror or exc}): "
            "local mode's link emulator, which selects the device's packets by that address, "
            "will not delay this process's"
        )
    return source, None


def listen_socket(address: str, port: int) -> socket.socket:
    """A TCP socket listening on ``address:port`` only (the rendezvous's, handed to torch)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # as torch's own store server: a restarted controller need not wait out TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


def _socket_inodes(pid: int | str) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc/net/tcp6: four 32-bit words, each in host (little-endian) byte order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listeners(pid: int | str = "self") -> list[tuple[str, int]]:
    """The TCP (v4 and v6) addresses and ports process ``pid`` listens on, from ``/proc``."""
    inodes = _socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and fields[9] in inodes:
                host, port = fields[1].rsplit(":", 1)
                found.append((_address(host), int(port, 16)))
    return sorted(found)


def stray_listeners(address: str | Collection[str], found: list[tuple[str, int]]) -> list[str]:
    """Each of ``found`` that is not on ``address`` (or one of them; the wildcard included), as
    ``host:port``."""
    want = {ipaddress.ip_address(a) for a in ([address] if isinstance(address, str) else address)}
    stray = []
    for host, port in found:
        ip = ipaddress.ip_address(host)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a v6 socket bound to ::ffff:a.b.c.d listens on a.b.c.d only
        if ip not in want:
            stray.append(f"{host}:{port}")
    return stray
