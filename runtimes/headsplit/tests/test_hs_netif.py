"""The RPC stack's interface choice (headsplit.netif): TensorPipe *and* Gloo follow the inference address.

Pure Python (no torch): runs in CI's default phase. Before, only TP_SOCKET_IFNAME was set, so on the
emulated rack Gloo bound to the hostname's 127.0.0.1 and every ch6 run failed in connectFullMesh.
"""

from __future__ import annotations

from headsplit.netif import bind_interface, interface_of


def test_the_loopback_address_is_on_lo() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.123") is None  # TEST-NET-1: on no interface here


def test_both_tensorpipe_and_gloo_bind_to_the_address_s_interface() -> None:
    env: dict[str, str] = {}
    assert bind_interface("127.0.0.1", env) == "lo"
    assert env == {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def test_a_variable_set_already_is_kept_and_an_unknown_address_changes_nothing() -> None:
    env = {"GLOO_SOCKET_IFNAME": "eth7"}
    bind_interface("127.0.0.1", env)
    assert env == {"GLOO_SOCKET_IFNAME": "eth7", "TP_SOCKET_IFNAME": "lo"}
    untouched: dict[str, str] = {}
    assert bind_interface("192.0.2.123", untouched) is None and untouched == {}
