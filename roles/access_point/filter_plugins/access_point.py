"""Pure builders of roles/access_point: the inference network's address plan and the radio's channel.

The address plan is checked here, before any file is written, because a wrong plan fails silently on the
rack: dnsmasq takes a duplicate MAC or an address outside its range without a word and the board simply
never gets its address. Every problem is reported at once, each naming the inventory host and the field
to fix (``device3.dit_inference_mac: ...``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
# The first channel of each 80 MHz block of the 5 GHz band (ETSI and FCC), centre = first + 6.
BLOCKS_80 = (36, 52, 100, 116, 132, 149)
CHANNELS_5GHZ = (*range(36, 65, 4), *range(100, 145, 4), *range(149, 166, 4))
MAC_HINT = (
    "six colon-separated hex pairs of the board's Wi-Fi adapter, e.g. dc:a6:32:12:34:56 (ip link show wlan0)"
)


class PlanError(ValueError):
    """Every problem of an address plan or a radio setting, each naming its field."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def clients(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> list[dict[str, str]]:
    """The stations of the inference network as the inventory names them: each host's
    ``dit_inference_mac`` and ``dit_inference_address`` ('' where the host has none)."""
    out = []
    for host in hosts:
        values = hostvars[host]
        out.append(
            {
                "name": str(host),
                "mac": str(values.get("dit_inference_mac", "") or ""),
                "address": str(values.get("dit_inference_address", "") or ""),
            }
        )
    return out


def _network(network: str) -> ipaddress.IPv4Network:
    try:
        parsed = ipaddress.ip_network(str(network), strict=True)
    except ValueError as exc:
        raise PlanError(
            [
                f"access_point_network: {network!r} is not a network in CIDR notation, e.g. 10.43.0.0/24 ({exc})"
            ]
        ) from None
    if not isinstance(parsed, ipaddress.IPv4Network) or parsed.prefixlen > 30:
        raise PlanError(
            [
                f"access_point_network: {network!r} must be an IPv4 network of at least 4 addresses (/30 or larger)"
            ]
        )
    return parsed


def subnet(network: str) -> dict[str, Any]:
    """The inference network's address, netmask and prefix length (for dnsmasq and ifupdown)."""
    parsed = _network(network)
    return {
        "network": str(parsed.network_address),
        "netmask": str(parsed.netmask),
        "prefixlen": parsed.prefixlen,
    }


def _address(
    value: str, field: str, network: ipaddress.IPv4Network
) -> tuple[ipaddress.IPv4Address | None, str]:
    """The parsed address of ``field``, or None and the problem with it."""
    if not value:
        return None, f"{field}: missing: every node on the inference network needs its address in {network}"
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        return None, f"{field}: {value!r} is not an IPv4 address (e.g. {network.network_address + 11})"
    if address not in network:
        return None, f"{field}: {address} is outside the inference network {network}"
    if address in (network.network_address, network.broadcast_address):
        return None, f"{field}: {address} is the network's or its broadcast address, not a host of {network}"
    return address, ""


def leases(
    stations: Sequence[Mapping[str, Any]], network: str, own_address: str, own_name: str
) -> list[dict[str, str]]:
    """The static DHCP leases of the inference network, one per station (``name``, ``mac``,
    ``address``), after checking the whole plan: the access point's own address and every station's
    MAC and address (well-formed, unicast, inside ``network``, none shared, none the access point's)."""
    subnet = _network(network)
    problems: list[str] = []
    own, problem = _address(
        str(own_address or ""), f"{own_name}.dit_inference_address (access_point_address)", subnet
    )
    if problem:
        problems.append(problem)
    macs: dict[str, str] = {}
    addresses: dict[ipaddress.IPv4Address, str] = {}
    out = []
    for station in stations:
        name = str(station.get("name", "") or "")
        if not name:
            problems.append(f"access_point_clients: an entry without a name: {dict(station)!r}")
            continue
        mac = str(station.get("mac", "") or "").strip().lower().replace("-", ":")
        if not mac:
            problems.append(f"{name}.dit_inference_mac: missing: {MAC_HINT}")
        elif not MAC.match(mac):
            problems.append(
                f"{name}.dit_inference_mac: {station.get('mac')!r} is not a MAC address: {MAC_HINT}"
            )
        elif int(mac[:2], 16) & 1:
            problems.append(
                f"{name}.dit_inference_mac: {mac} is a multicast address, not an adapter's: {MAC_HINT}"
            )
        elif mac in macs:
            problems.append(
                f"{name}.dit_inference_mac: {mac} is {macs[mac]}'s too: each board needs its own adapter's MAC"
            )
        else:
            macs[mac] = name
        address, problem = _address(
            str(station.get("address", "") or ""), f"{name}.dit_inference_address", subnet
        )
        if problem:
            problems.append(problem)
        elif address is not None and own is not None and address == own:
            problems.append(
                f"{name}.dit_inference_address: {address} is the access point's own address ({own_name})"
            )
        elif address is not None and address in addresses:
            problems.append(f"{name}.dit_inference_address: {address} is {addresses[address]}'s too")
        elif address is not None:
            addresses[address] = name
        out.append({"name": name, "mac": mac, "address": str(address)})
    if problems:
        raise PlanError(problems)
    return out


def radio(channel: int, width_mhz: int) -> dict[str, Any]:
    """hostapd's 802.11n/ac channel settings for a 5 GHz ``channel`` ``width_mhz`` wide: ``ht_capab``
    (the side of the secondary 20 MHz channel), ``vht_oper_chwidth`` and the 80 MHz block's centre."""
    try:
        channel, width_mhz = int(channel), int(width_mhz)
    except (TypeError, ValueError):
        raise PlanError(
            [
                f"access_point_channel / access_point_channel_width_mhz: {channel!r} / {width_mhz!r} are not numbers"
            ]
        ) from None
    if channel not in CHANNELS_5GHZ:
        raise PlanError(
            [
                f"access_point_channel: {channel} is not a 5 GHz channel (36-64, 100-144 or 149-165, in steps of 4)"
            ]
        )
    if width_mhz not in (20, 40, 80):
        raise PlanError([f"access_point_channel_width_mhz: {width_mhz} is not 20, 40 or 80"])
    if width_mhz == 20:
        return {"ht_capab": "", "vht_oper_chwidth": 0, "vht_oper_centr_freq_seg0_idx": None}
    if channel == 165:
        raise PlanError(
            [f"access_point_channel: 165 has no {width_mhz} MHz pair; use 20 MHz or another channel"]
        )
    first = 149 if channel >= 149 else 36
    lower = ((channel - first) // 4) % 2 == 0
    ht = "[HT40+]" if lower else "[HT40-]"
    if width_mhz == 40:
        return {"ht_capab": ht, "vht_oper_chwidth": 0, "vht_oper_centr_freq_seg0_idx": None}
    block = max(b for b in BLOCKS_80 if b <= channel)
    return {"ht_capab": ht, "vht_oper_chwidth": 1, "vht_oper_centr_freq_seg0_idx": block + 6}


def keyfile_value(value: str) -> str:
    """``value`` escaped for a GLib key file (NetworkManager's keyfile): backslash, line breaks, tab
    and a leading space would otherwise change the value NetworkManager reads."""
    text = str(value).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return "\\s" + text[1:] if text.startswith(" ") else text


def _filter(function: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except PlanError as exc:
            raise AnsibleFilterError("access_point: " + "; ".join(exc.problems)) from None

    return wrapped


class FilterModule:
    """Filters of roles/access_point."""

    def filters(self) -> dict[str, Any]:
        return {
            "access_point_clients": _filter(clients),
            "access_point_leases": _filter(leases),
            "access_point_radio": _filter(radio),
            "access_point_subnet": _filter(subnet),
            "access_point_keyfile_value": keyfile_value,
        }
