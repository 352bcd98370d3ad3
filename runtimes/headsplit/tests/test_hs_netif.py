"""The RPC stack's addresses (headsplit.netif): TensorPipe *and* Gloo follow the inference address, and
an address that would expose torch RPC (unauthenticated pickle) beyond it is refused.

Pure Python (no torch): runs in CI's default phase. Before, only TP_SOCKET_IFNAME was set, so on the
emulated rack Gloo bound to the hostname's 127.0.0.1 and every ch6 run failed in connectFullMesh.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from headsplit import netif
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


# -- a device's own address (local mode: its loopback address, which no interface holds)

PIN = (
    "import json, socket, sys\n"
    "from headsplit import netif\n"
    "env = {}\n"
    "own, note = netif.pin('127.0.0.1', sys.argv[1], env, 'workers[0].address', 'workers[0].source_address')\n"
    "print(json.dumps({'own': own, 'note': note, 'env': env, 'hostname': socket.gethostname()}))\n"
)


def test_a_device_s_loopback_address_becomes_the_process_s_own_hostname() -> None:
    """TensorPipe and Gloo listen on the hostname's address when no interface is named: a UTS namespace
    of the process's own makes the hostname the device's address (root), else the inference address is
    kept and the note says the link emulator will not see this process's packets. In a child process:
    the namespace is the process's for good."""
    before = socket.gethostname()
    done = subprocess.run(
        [sys.executable, "-c", PIN, "127.40.7.2"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    if os.geteuid() == 0:
        assert got == {"own": "127.40.7.2", "note": None, "env": {}, "hostname": "127.40.7.2"}
    else:
        assert got["own"] == "127.0.0.1" and got["env"] == {
            "TP_SOCKET_IFNAME": "lo",
            "GLOO_SOCKET_IFNAME": "lo",
        }
        assert "not on workers[0].source_address 127.40.7.2" in got["note"]
    assert socket.gethostname() == before  # this process's, and the machine's, untouched


def test_without_the_namespace_the_inference_address_is_kept_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(address: str) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(netif, "own_hostname", refused)
    env: dict[str, str] = {}
    own, note = netif.pin("127.0.0.1", "127.40.7.2", env, "workers[0].address", "workers[0].source_address")
    assert own == "127.0.0.1" and env == {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    assert note == (
        "listening on workers[0].address 127.0.0.1, not on workers[0].source_address 127.40.7.2 (Operation not "
        "permitted): local mode's link emulator, which selects the device's packets by that address, will not "
        "delay this process's"
    )


def test_a_source_address_is_pinned_or_refused_like_the_inference_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(netif, "own_hostname", lambda address: pytest.fail("no namespace for this one"))
    env: dict[str, str] = {}
    assert netif.pin("127.0.0.1", None, env) == ("127.0.0.1", None)  # no source: as before
    assert env == {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    held: dict[str, str] = {}
    assert netif.pin("10.9.9.9", "127.0.0.1", held) == ("127.0.0.1", None)  # an interface holds it: named
    assert held == {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    with pytest.raises(BindRefused, match=r"^workers\[1\]\.source_address: 192\.0\.2\.123 is neither"):
        netif.pin("127.0.0.1", "192.0.2.123", {}, source_where="workers[1].source_address")
    with pytest.raises(BindRefused, match=r"^workers\[1\]\.source_address: 'device1' is not an IP address"):
        netif.pin("127.0.0.1", "device1", {}, source_where="workers[1].source_address")
    with pytest.raises(
        BindRefused, match=r"TP_SOCKET_IFNAME=lo would bind torch RPC .* 127\.40\.7\.2; unset it"
    ):
        netif.pin("127.0.0.1", "127.40.7.2", {"TP_SOCKET_IFNAME": "lo"})


def test_a_listener_on_any_of_the_process_s_addresses_is_not_stray() -> None:
    found = [("127.40.7.4", 29500), ("127.0.0.1", 4000), ("0.0.0.0", 6)]  # noqa: S104
    assert stray_listeners(("127.40.7.4", "127.0.0.1"), found) == ["0.0.0.0:6"]
    assert stray_listeners("127.40.7.4", found) == ["127.0.0.1:4000", "0.0.0.0:6"]
