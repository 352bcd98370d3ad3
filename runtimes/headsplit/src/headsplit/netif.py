"""Which network interface the RPC stack binds to (stdlib only: imports without torch).

torch.distributed.rpc has two socket users: TensorPipe (the calls) and a Gloo process group that
``init_rpc`` builds for its barriers. Both take the address of the hostname by default. On the rack
the hostname may name the management network, and on the emulated rack every node is a network
namespace of one machine whose hostname resolves to 127.0.0.1 -- each node's *own* loopback -- so
Gloo's full-mesh connect is refused ("Gloo connectFullMesh failed ... Connection refused") and the
run fails before the first token. Pinning both to the interface of the configured (inference)
address fixes that: ``TP_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME``.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import MutableMapping

SIOCGIFADDR = 0x8915
IFNAME_VARIABLES = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


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


def bind_interface(address: str, env: MutableMapping[str, str] | None = None) -> str | None:
    """Point TensorPipe and Gloo at the interface of ``address`` (each unless its variable is set
    already); returns the interface, or None when no interface holds the address."""
    target = os.environ if env is None else env
    name = interface_of(address)
    if name:
        for variable in IFNAME_VARIABLES:
            target.setdefault(variable, name)
    return name
