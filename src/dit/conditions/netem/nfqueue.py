"""The userspace backend of the network condition as data: iptables rules and the emulator's queues.

Pure: nothing here touches a host. Where the kernel has no ``sch_netem``, a device's delay, jitter
and loss are applied by the link emulator (:mod:`dit.device.link_emulator`) to the packets that
iptables sends to NFQUEUE; rate caps stay on tbf/htb (:func:`rate_only`, the same
:func:`dit.conditions.netem.tc.build_tree` without the netem fields). The selection is the tc tree's,
rule for filter, one queue per profile::

    iptables -w -t mangle -N DIT-1a2b3c4d5e                   (the run's chain on this node)
    iptables -w -t mangle -A DIT-1a2b3c4d5e -d 10.0.0.5/32 -j NFQUEUE --queue-num 4113   (destination)
    iptables -w -t mangle -A DIT-1a2b3c4d5e -d 10.0.0.6/32 -j RETURN                      (rate only)
    iptables -w -t mangle -A DIT-1a2b3c4d5e -j NFQUEUE --queue-num 4112                  (main profile)
    iptables -w -t mangle -I POSTROUTING 1 -o IF -j DIT-1a2b3c4d5e

Destinations come most specific first, as the tc filters' priorities order them. The rules carry
no ``--queue-bypass``: while no emulator listens, the shaped traffic is dropped (fail closed), never
passed undelayed. The chain and the queue numbers are named after the run and the host, so two runs
(or two local-mode devices) never share them and the undo scope can tell the run's chain from any
other. Egress only, as netem: a device delays what it sends; the far end delays its own replies
when it has a ``network`` block of its own. IPv4 only (``iptables``); an IPv6 destination is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
from collections.abc import Mapping
from typing import Any

from dit.conditions.netem.tc import NETEM_KEYS, NetemError, Profile, parse_network
from dit.device.netem_vary import schedule

TABLE = "mangle"
HOOK = "POSTROUTING"
CHAIN_PREFIX = "DIT-"
QUEUE_FIRST = 1024  # below: left to the node's own NFQUEUE users
QUEUE_SLOTS = 4032  # 1024 + 4032 * 16 = 65536: every base fits the 16-bit queue number
QUEUES_PER_NODE = 16  # the main profile and up to 15 destinations
BACKENDS = ("auto", "netem", "userspace")
EMULATOR_TAG = "link-emulator"


def chain_name(run_id: str, host: str) -> str:
    """The run's iptables chain on ``host`` (at most 28 characters, iptables' limit)."""
    return CHAIN_PREFIX + hashlib.sha256(f"{run_id}:{host}".encode()).hexdigest()[:12]


def queue_base(run_id: str, host: str) -> int:
    """The first of the :data:`QUEUES_PER_NODE` queue numbers of ``host`` in this run."""
    digest = int(hashlib.sha256(f"nfqueue:{run_id}:{host}".encode()).hexdigest()[:8], 16)
    return QUEUE_FIRST + (digest % QUEUE_SLOTS) * QUEUES_PER_NODE


def iptables_prefix(netns: str | None = None) -> list[str]:
    """``iptables -w -t mangle`` (through ``ip netns exec NS`` inside a network namespace)."""
    base = ["iptables", "-w", "-t", TABLE]
    return ["ip", "netns", "exec", netns, *base] if netns else base


def rate_only(block: Mapping[str, Any]) -> dict[str, Any]:
    """``block`` without what netem does (delay, jitter, loss, variation): what tbf/htb still shape."""
    out = {k: v for k, v in block.items() if k not in (*NETEM_KEYS, "variation", "destinations")}
    dests = {
        key: {k: v for k, v in conf.items() if k not in NETEM_KEYS}
        for key, conf in (block.get("destinations") or {}).items()
    }
    # Destinations keep their (unshaped) classes while some rate is capped, so traffic to them
    # escapes the main cap as under netem; with no cap at all there is no tc tree.
    if dests and any(conf.get("rate_mbit") is not None for conf in (out, *dests.values())):
        out["destinations"] = dests
    return out


def build_userspace(
    block: Mapping[str, Any],
    dev: str,
    *,
    device: str,
    run_id: str,
    seed: int | str = 0,
    destinations: Mapping[str, str] | None = None,
    netns: str | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """The rules and queues of ``network.<device>`` for the userspace backend.

    ``source`` (local mode: the device's own loopback address) confines the chain to the packets
    the device sends from it: every local device's chain hangs off the same ``-o lo``, so the
    chain's first rule returns every packet from another address.

    Returns ``{"chain", "dev", "netns", "rules", "jump", "queues"}``: ``rules`` are the chain's rule
    specifications in order (what ``iptables -S CHAIN`` prints after ``-A CHAIN``), ``jump`` the
    hook's rule, ``queues`` the emulator's profiles (``queue``, ``name``, ``delay_ms``,
    ``jitter_ms``, ``loss_pct``, ``loss_correlation_pct``), the main profile first (its delay is the one that varies).
    """
    where = f"network.{device}"
    chain = chain_name(run_id, device)
    base = queue_base(run_id, device)
    main = Profile.of(block)
    variation = dict(block.get("variation") or {})
    varying = variation.get("kind", "constant") != "constant"
    entries = []
    for key, conf in (block.get("destinations") or {}).items():
        resolved = (destinations or {}).get(key)
        if resolved is None:
            raise NetemError(f"{where}.destinations.{key}: no address resolved for this destination")
        network = parse_network(resolved, f"{where}.destinations.{key}")
        if network.version != 4:
            raise NetemError(
                f"{where}.destinations.{key}: {network} is IPv6; the userspace backend (iptables) shapes "
                "IPv4 only: give an IPv4 address, or use network_backend: netem on a kernel with sch_netem"
            )
        entries.append((network, key, Profile.of(conf)))
    if len(entries) > QUEUES_PER_NODE - 1:
        raise NetemError(
            f"{where}.destinations: {len(entries)} destinations; the userspace backend takes at most "
            f"{QUEUES_PER_NODE - 1}"
        )
    entries.sort(key=lambda e: (-e[0].prefixlen, int(e[0].network_address), e[1]))
    # A varying delay starts at its schedule's first step, as the tc tree's netem does.
    main_delay = schedule(variation, seed, device, 1)[0].delay_ms if varying else main.delay_ms
    queues: list[dict[str, Any]] = []
    if main.has_netem or varying:
        queues.append(_queue(base, "main", dataclasses.replace(main, delay_ms=main_delay)))
    rules: list[list[str]] = []
    if source:
        sender = parse_network(source, f"{where}: the device's source address")
        if sender.version != 4 or sender.num_addresses != 1:
            raise NetemError(f"{where}: source address {source!r} is not one IPv4 address")
        rules.append(["!", "-s", _cidr(sender), "-j", "RETURN"])
    for index, (network, key, profile) in enumerate(entries):
        if profile.has_netem:
            queue = base + 1 + index
            queues.append(_queue(queue, key, profile))
            rules.append(["-d", _cidr(network), "-j", "NFQUEUE", "--queue-num", str(queue)])
        else:
            rules.append(["-d", _cidr(network), "-j", "RETURN"])
    if main.has_netem or varying:
        rules.append(["-j", "NFQUEUE", "--queue-num", str(base)])
    return {
        "chain": chain,
        "dev": dev,
        "netns": netns or "",
        "rules": rules,
        "jump": ["-o", dev, "-j", chain],
        "queues": queues,
    }


def _cidr(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    return f"{network.network_address}/{network.prefixlen}"


def _queue(queue: int, name: str, profile: Profile) -> dict[str, Any]:
    return {
        "queue": queue,
        "name": name,
        "delay_ms": profile.delay_ms,
        "jitter_ms": profile.jitter_ms,
        "loss_pct": profile.loss_pct,
        "loss_correlation_pct": profile.loss_correlation_pct,
    }


def requested_backend(block: Mapping[str, Any], hostvars: Mapping[str, Any], where: str) -> str:
    """``network.<device>.network_backend``, else the inventory's ``dit_network_backend``, else auto."""
    value = block.get("network_backend") or hostvars.get("dit_network_backend") or "auto"
    if value not in BACKENDS:
        raise NetemError(f"{where}.network_backend: {value!r} is not one of {', '.join(BACKENDS)}")
    return str(value)


def choose_backend(requested: str, node: Mapping[str, Any], local: bool = False) -> tuple[str, str]:
    """``(backend, why)`` for a device whose profile needs netem, from its preflight facts.

    ``auto`` takes netem where the kernel has it (or nothing says it lacks it) and the userspace
    backend where it lacks it and NFQUEUE and iptables are there; otherwise netem (whose gate then
    refuses or records, as before). In local mode (``local``) ``auto`` takes the userspace backend
    wherever it can run, sch_netem or not: a tc tree on the shared loopback cannot tell one device's
    packets from another's, the emulator's rules select each device's source address.
    """
    netem: Mapping[str, Any] = node.get("netem") or {}
    nfqueue: Mapping[str, Any] = node.get("nfqueue") or {}
    netem = netem if isinstance(netem, Mapping) else {}
    nfqueue = nfqueue if isinstance(nfqueue, Mapping) else {}
    if requested != "auto":
        return requested, f"network_backend: {requested}"
    if local:
        if nfqueue.get("available"):
            return (
                "userspace",
                "local mode: each device's own loopback address, NFQUEUE and iptables are there",
            )
        return "netem", f"local mode records the netem commands ({nfqueue.get('reason', 'no NFQUEUE facts')})"
    if netem.get("available") is not False:
        return "netem", "the kernel has sch_netem"
    if nfqueue.get("available"):
        return (
            "userspace",
            f"no sch_netem ({netem.get('reason', 'not found')}); NFQUEUE and iptables are there",
        )
    return "netem", f"no sch_netem and no userspace backend ({nfqueue.get('reason', 'no NFQUEUE facts')})"
