"""The RPC stack's addresses (headsplit.netif): TensorPipe *and* Gloo follow the inference address, and
an address that would expose torch RPC (unauthenticated pickle) beyond it is refused.

Pure Python (no torch): runs in CI's default phase. Before, only TP_SOCKET_IFNAME was set, so on the
emulated rack Gloo bound to the hostname's 127.0.0.1 and every ch6 run failed in connectFullMesh.
"""

from __future__ import annotations

import socket

import pytest

from headsplit.netif import (
    BindRefused,
    bind_interface,
    check_bind,
    interface_of,
    listen_socket,
    listeners,
    stray_listeners,
)


def test_the_loopback_address_is_on_lo() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.123") is None  # TEST-NET-1: on no interface here


def test_both_tensorpipe_and_gloo_bind_to_the_address_s_interface() -> None:
    env: dict[str, str] = {}
    assert bind_interface("127.0.0.1", env) == "lo"
    assert env == {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def test_a_variable_naming_another_interface_is_refused_and_the_same_one_kept() -> None:
    env = {"GLOO_SOCKET_IFNAME": "eth7"}
    with pytest.raises(BindRefused, match=r"GLOO_SOCKET_IFNAME=eth7 .* controller\.address 127\.0\.0\.1"):
        bind_interface("127.0.0.1", env, where="controller.address")
    same = {"GLOO_SOCKET_IFNAME": "lo"}
    assert bind_interface("127.0.0.1", same) == "lo"
    assert same == {"GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("0.0.0.0", "is the wildcard"),  # noqa: S104
        ("::", "is the wildcard"),
        ("", "empty"),
        ("  ", "empty"),
        ("localhost", "not an IP address"),
        ("224.0.0.1", "not a unicast address"),
        ("255.255.255.255", "not a unicast address"),
        ("192.0.2.123", "not an IPv4 address of any interface of this node"),
        ("::1", "not an IPv4 address of any interface of this node"),
    ],
)
def test_an_address_that_would_not_pin_the_listeners_is_refused(address: str, why: str) -> None:
    with pytest.raises(BindRefused, match=why) as refused:
        check_bind(address, "workers[0].address")
    assert str(refused.value).startswith("workers[0].address: ")
    env: dict[str, str] = {}
    with pytest.raises(BindRefused):
        bind_interface(address, env)
    assert env == {}  # nothing pinned to a refused address


def test_listeners_reads_back_this_process_s_listening_sockets() -> None:
    with listen_socket("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        found = listeners()
        assert ("127.0.0.1", port) in found
        assert stray_listeners("127.0.0.1", found) == []
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as wild:
            wild.bind(("::", 0))
            wild.listen()
            wild_port = wild.getsockname()[1]
            assert stray_listeners("127.0.0.1", listeners()) == [f":::{wild_port}"]
    assert ("127.0.0.1", port) not in listeners()


def test_a_v4_mapped_listener_is_on_its_v4_address() -> None:
    assert stray_listeners("127.0.0.1", [("::ffff:127.0.0.1", 5), ("0.0.0.0", 6)]) == ["0.0.0.0:6"]  # noqa: S104
