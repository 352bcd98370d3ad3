"""The address plan and radio builders of roles/access_point (issue 35 item 1): pure, and every bad
field of a plan named at once, with the host it belongs to."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO


def load() -> ModuleType:
    path = REPO / "roles/access_point/filter_plugins/access_point.py"
    spec = importlib.util.spec_from_file_location("access_point_filters", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ap = load()
NETWORK = "10.43.0.0/24"


def station(name: str, mac: str, address: str) -> dict[str, str]:
    return {"name": name, "mac": mac, "address": address}


def problems(stations: list[dict[str, Any]], network: str = NETWORK, own: str = "10.43.0.1") -> list[str]:
    with pytest.raises(ap.PlanError) as caught:
        ap.leases(stations, network, own, "edgeserver")
    return list(caught.value.problems)


def test_the_rack_example_gives_one_lease_per_board_in_inventory_order() -> None:
    hostvars = {
        "device1": {"dit_inference_mac": "DC:A6:32:00:00:11", "dit_inference_address": "10.43.0.11"},
        "device2": {"dit_inference_mac": "dc-a6-32-00-00-12", "dit_inference_address": "10.43.0.12"},
    }
    clients = ap.clients(["device2", "device1"], hostvars)
    assert ap.leases(clients, NETWORK, "10.43.0.1", "edgeserver") == [
        {"name": "device2", "mac": "dc:a6:32:00:00:12", "address": "10.43.0.12"},
        {"name": "device1", "mac": "dc:a6:32:00:00:11", "address": "10.43.0.11"},
    ]


def test_a_host_without_mac_or_address_is_named() -> None:
    clients = ap.clients(["device3"], {"device3": {"ansible_host": "10.42.0.13"}})
    assert clients == [{"name": "device3", "mac": "", "address": ""}]
    found = problems(clients)
    assert found[0].startswith("device3.dit_inference_mac: missing: six colon-separated hex pairs")
    assert found[1].startswith("device3.dit_inference_address: missing")


def test_duplicate_mac_and_address_name_both_hosts() -> None:
    found = problems(
        [
            station("device1", "dc:a6:32:00:00:11", "10.43.0.11"),
            station("device2", "DC:A6:32:00:00:11", "10.43.0.11"),
        ]
    )
    assert found == [
        "device2.dit_inference_mac: dc:a6:32:00:00:11 is device1's too: each board needs its own adapter's MAC",
        "device2.dit_inference_address: 10.43.0.11 is device1's too",
    ]


def test_addresses_outside_the_subnet_or_the_access_points_own_are_refused() -> None:
    found = problems(
        [
            station("device1", "dc:a6:32:00:00:11", "10.44.0.11"),
            station("device2", "dc:a6:32:00:00:12", "10.43.0.1"),
            station("device3", "dc:a6:32:00:00:13", "10.43.0.255"),
            station("device4", "dc:a6:32:00:00:14", "10.43.0.300"),
        ]
    )
    assert found == [
        "device1.dit_inference_address: 10.44.0.11 is outside the inference network 10.43.0.0/24",
        "device2.dit_inference_address: 10.43.0.1 is the access point's own address (edgeserver)",
        "device3.dit_inference_address: 10.43.0.255 is the network's or its broadcast address, "
        "not a host of 10.43.0.0/24",
        "device4.dit_inference_address: '10.43.0.300' is not an IPv4 address (e.g. 10.43.0.11)",
    ]


def test_malformed_and_multicast_macs_are_refused() -> None:
    found = problems(
        [
            station("device1", "dc:a6:32:00:00", "10.43.0.11"),
            station("device2", "01:00:5e:00:00:01", "10.43.0.12"),
        ]
    )
    assert found[0].startswith("device1.dit_inference_mac: 'dc:a6:32:00:00' is not a MAC address")
    assert found[1].startswith("device2.dit_inference_mac: 01:00:5e:00:00:01 is a multicast address")


def test_the_access_points_own_address_and_the_network_are_checked() -> None:
    found = problems([], own="10.42.0.1")
    assert found == [
        "edgeserver.dit_inference_address (access_point_address): 10.42.0.1 is outside the inference "
        "network 10.43.0.0/24"
    ]
    assert problems([], network="10.43.0.1/24")[0].startswith(
        "access_point_network: '10.43.0.1/24' is not a network in CIDR notation"
    )
    assert ap.subnet(NETWORK) == {"network": "10.43.0.0", "netmask": "255.255.255.0", "prefixlen": 24}


@pytest.mark.parametrize(
    ("channel", "width", "expected"),
    [
        (36, 80, {"ht_capab": "[HT40+]", "vht_oper_chwidth": 1, "vht_oper_centr_freq_seg0_idx": 42}),
        (48, 80, {"ht_capab": "[HT40-]", "vht_oper_chwidth": 1, "vht_oper_centr_freq_seg0_idx": 42}),
        (149, 80, {"ht_capab": "[HT40+]", "vht_oper_chwidth": 1, "vht_oper_centr_freq_seg0_idx": 155}),
        (104, 40, {"ht_capab": "[HT40-]", "vht_oper_chwidth": 0, "vht_oper_centr_freq_seg0_idx": None}),
        (165, 20, {"ht_capab": "", "vht_oper_chwidth": 0, "vht_oper_centr_freq_seg0_idx": None}),
    ],
)
def test_radio_settings_of_a_channel(channel: int, width: int, expected: dict[str, Any]) -> None:
    assert ap.radio(channel, width) == expected


@pytest.mark.parametrize(
    ("channel", "width", "message"),
    [
        (6, 80, "access_point_channel: 6 is not a 5 GHz channel"),
        (165, 80, "access_point_channel: 165 has no 80 MHz pair"),
        (36, 160, "access_point_channel_width_mhz: 160 is not 20, 40 or 80"),
    ],
)
def test_impossible_radio_settings_are_refused(channel: int, width: int, message: str) -> None:
    with pytest.raises(ap.PlanError, match=message):
        ap.radio(channel, width)


def test_keyfile_values_keep_backslashes_and_leading_spaces() -> None:
    assert ap.keyfile_value(r"a\b") == r"a\\b"
    assert ap.keyfile_value(" lead") == r"\slead"
    assert ap.keyfile_value("plain pass") == "plain pass"


def test_the_filter_turns_problems_into_one_ansible_error() -> None:
    from ansible.errors import AnsibleFilterError

    leases = ap.FilterModule().filters()["access_point_leases"]
    with pytest.raises(AnsibleFilterError, match=r"access_point: device1.dit_inference_mac: missing"):
        leases([station("device1", "", "10.43.0.11")], NETWORK, "10.43.0.1", "edgeserver")
