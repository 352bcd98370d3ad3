"""Network shaping as data: a scenario's ``network.<device>`` block → the exact ``tc`` argv lists.

Pure: nothing here touches a host. :func:`build_tree` turns one device's block into the ordered
list of :class:`TcObject` (qdiscs, classes, filters) that the ``dit_tc`` module creates, each with
the argv that creates it, the argv that changes it in place, and ``expect``: the part of the
kernel's report (``tc -j qdisc show``, parsed ``tc class show`` / ``tc filter show``) that must
match for the object to count as present, which is how a second apply finds nothing to do.

Trees (``IF`` is the device's inference interface, never the management one):

- **netem only** (delay, jitter, loss and its correlation)::

    tc qdisc replace dev IF root handle 1: netem delay 20ms 5ms loss 1%
    tc qdisc replace dev IF root handle 1: netem loss 10% 50%        (loss_correlation_pct: 50)

- **rate only**: a token bucket at the root, no netem at all (so a rate cap also works on a kernel
  without ``sch_netem``, such as the CI machine)::

    tc qdisc replace dev IF root handle 1: tbf rate 10mbit burst 12500 latency 50ms

- **netem + rate**: netem at the root, a ``tbf`` child for the cap::

    tc qdisc replace dev IF root handle 1: netem delay 20ms
    tc qdisc replace dev IF parent 1:1 handle 10: tbf rate 10mbit burst 12500 latency 50ms

  Why ``tbf`` and not netem's own ``rate``: the article and the issue ask for a token-bucket cap.
  netem's ``rate`` models serialisation delay packet by packet inside netem's delay queue (every
  packet is delayed by size/rate on top of the added delay, with no burst allowance), which is a
  link emulation, not a policer/shaper of the kind the delay model's measured rate assumes; a
  ``tbf`` child shapes the already-delayed stream with an explicit bucket (``burst``: 10 ms of
  tokens, at least two full frames) and a bounded queue (``latency 50ms``), and the same ``tbf``
  line is the rate-only profile, so both paths share one, testable, implementation.

- **per-destination profiles**: an ``htb`` root whose default class carries the device's main
  profile, plus one class, netem leaf and ``u32`` filter per destination. A class's rate is its
  cap (htb is a token bucket too); a class without a cap gets :data:`UNSHAPED_MBIT`::

    tc qdisc replace dev IF root handle 1: htb default 1
    tc class add dev IF parent 1: classid 1:1 htb rate 10gbit ceil 10gbit burst ... quantum 1514
    tc qdisc replace dev IF parent 1:1 handle 10: netem delay 20ms          (main profile, if any)
    tc class add dev IF parent 1: classid 1:11 htb rate 5mbit ceil 5mbit burst 6250 cburst 6250 quantum 1514
    tc qdisc replace dev IF parent 1:11 handle 11: netem delay 40ms
    tc filter add dev IF parent 1: protocol ip prio 1 u32 match ip dst 10.0.0.5/32 flowid 1:11

  Destinations are ordered most specific first (longest prefix, then address), one filter
  priority each, so an address inside two CIDRs gets the narrower profile.

Teardown is not built here: only the node knows the tree that was there before, so the module
reads it (``tc -j qdisc show``, ``tc class show``, ``tc filter show``) and journals the argv that
restore it (delete the root the run created; re-create a prior non-default tree) before it
changes anything.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dit.device.netem_vary import PLACEHOLDER, format_ms, schedule

ROOT_HANDLE = "1:"
MAIN_CLASS = "1:1"
MAIN_LEAF = "10:"
UNSHAPED_MBIT = 10_000  # the rate of an htb class without a cap: far above any Wi-Fi link
TBF_LATENCY_MS = 50  # bound of the tbf queue (limit = rate * latency + burst)
BUCKET_S = 0.01  # the bucket holds 10 ms of tokens ...
MIN_BURST_BYTES = 3200  # ... and never less than two full Ethernet frames
HTB_QUANTUM = 1514  # one full frame per DRR round between sibling classes
NETEM_KEYS = ("delay_ms", "jitter_ms", "loss_pct", "loss_correlation_pct")


class NetemError(ValueError):
    """A network block that cannot be shaped; the message names the scenario path."""


@dataclass(frozen=True)
class Profile:
    """One netem/rate profile: the device's main one or one destination's."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_mbit: float | None = None
    # netem's ``loss P% C%``: each loss draw is C * the previous draw + (1 - C) * a fresh one
    # (tc-netem(8); the mean loss stays P only at 50 %, see dit.device.link_emulator.expected_loss)
    loss_correlation_pct: float = 0.0

    @classmethod
    def of(cls, block: Mapping[str, Any]) -> Profile:
        rate = block.get("rate_mbit")
        return cls(
            delay_ms=float(block.get("delay_ms") or 0.0),
            jitter_ms=float(block.get("jitter_ms") or 0.0),
            loss_pct=float(block.get("loss_pct") or 0.0),
            rate_mbit=None if rate is None else float(rate),
            loss_correlation_pct=float(block.get("loss_correlation_pct") or 0.0),
        )

    @property
    def has_netem(self) -> bool:
        return self.delay_ms > 0 or self.jitter_ms > 0 or self.loss_pct > 0

    @property
    def empty(self) -> bool:
        return not self.has_netem and self.rate_mbit is None


@dataclass(frozen=True)
class TcObject:
    """One qdisc, class or filter of the desired tree."""

    type: str  # qdisc | class | filter
    id: str  # qdisc: handle; class: classid; filter: "<parent> <protocol> <prio>"
    argv: tuple[str, ...]  # creates it (qdisc replace, class add, filter add)
    change_argv: tuple[str, ...] | None  # changes its options in place (None: filters)
    expect: Mapping[str, Any]  # normalised fields the kernel must report (None: must be absent)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "id": self.id,
            "argv": list(self.argv),
            "change_argv": None if self.change_argv is None else list(self.change_argv),
            "expect": _plain(self.expect),
        }


@dataclass(frozen=True)
class Shaping:
    """Everything one device's block becomes."""

    interface: str
    objects: tuple[TcObject, ...]
    needs_netem: bool
    vary_qdisc: str | None = None  # handle of the netem qdisc whose delay varies
    vary_template: tuple[str, ...] | None = None  # its ``tc qdisc change`` argv with "{delay}"
    variation: Mapping[str, Any] = field(default_factory=dict)

    @property
    def argv(self) -> list[list[str]]:
        return [list(o.argv) for o in self.objects]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# -- formatting ------------------------------------------------------------------------------------


def format_rate(mbit: float) -> str:
    """A rate as ``tc`` reads it: ``10mbit``; a fractional one exactly in bit/s (``2500000bit``)."""
    if not mbit > 0 or not math.isfinite(mbit):
        raise NetemError(f"rate {mbit} Mbit/s is not positive")
    if float(mbit).is_integer():
        return f"{int(mbit)}mbit"
    return f"{round(mbit * 1e6)}bit"


def rate_bytes(mbit: float) -> int:
    """The rate in bytes/s as the kernel stores it (``tc`` reads ``mbit`` as 10^6 bit/s)."""
    return round(mbit * 1e6 / 8)


def burst_bytes(mbit: float) -> int:
    """Bucket size: :data:`BUCKET_S` of tokens, at least :data:`MIN_BURST_BYTES`."""
    return max(MIN_BURST_BYTES, math.ceil(mbit * 1e6 / 8 * BUCKET_S))


def format_pct(pct: float, what: str = "loss") -> str:
    if not 0 <= pct <= 100:
        raise NetemError(f"{what} {pct} % is outside 0..100")
    return f"{pct:g}%"


def tc_prefix(netns: str | None = None) -> list[str]:
    """``tc`` (or ``tc -n NS`` inside a network namespace)."""
    return ["tc", "-n", netns] if netns else ["tc"]


def netem_args(profile: Profile, delay_ms: float | str | None = None) -> list[str]:
    """The netem options of ``profile`` (``delay`` overridden by ``delay_ms``, maybe ``"{delay}"``)."""
    delay: float | str = profile.delay_ms if delay_ms is None else delay_ms
    args = ["netem"]
    has_delay = delay == PLACEHOLDER or (isinstance(delay, float | int) and delay > 0)
    if has_delay or profile.jitter_ms > 0:
        args += ["delay", delay if isinstance(delay, str) else format_ms(float(delay))]
        if profile.jitter_ms > 0:
            args.append(format_ms(profile.jitter_ms))
    if profile.loss_pct > 0:
        args += ["loss", format_pct(profile.loss_pct)]
        if profile.loss_correlation_pct > 0:  # tc's "loss PERCENT [CORRELATION]"
            args.append(format_pct(profile.loss_correlation_pct, "loss correlation"))
    return args


def netem_expect(profile: Profile, varying: bool = False) -> dict[str, Any]:
    """What ``tc -j qdisc show`` reports for :func:`netem_args` (seconds and fractions)."""
    options: dict[str, Any] = {}
    if not varying:
        if profile.delay_ms > 0 or profile.jitter_ms > 0:
            options["delay"] = {"delay": profile.delay_ms / 1000.0, "jitter": profile.jitter_ms / 1000.0}
        else:
            options["delay"] = None
    loss: dict[str, float] | None = None
    if profile.loss_pct > 0:
        loss = {"loss": profile.loss_pct / 100.0}
        if profile.loss_correlation_pct > 0:  # tc -j prints it as a fraction, as the loss
            loss["correlation"] = profile.loss_correlation_pct / 100.0
    options["loss-random"] = loss
    return {"kind": "netem", "options": options}


def tbf_args(mbit: float) -> list[str]:
    return [
        "tbf",
        "rate",
        format_rate(mbit),
        "burst",
        str(burst_bytes(mbit)),
        "latency",
        f"{TBF_LATENCY_MS}ms",
    ]


def tbf_expect(mbit: float) -> dict[str, Any]:
    options = {"rate": rate_bytes(mbit), "burst": burst_bytes(mbit), "lat": TBF_LATENCY_MS * 1000}
    return {"kind": "tbf", "options": options}


def htb_class_args(mbit: float | None) -> list[str]:
    rate = format_rate(UNSHAPED_MBIT if mbit is None else mbit)
    burst = str(burst_bytes(UNSHAPED_MBIT if mbit is None else mbit))
    return ["htb", "rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum", str(HTB_QUANTUM)]


def htb_class_expect(mbit: float | None) -> dict[str, Any]:
    bps = rate_bytes(UNSHAPED_MBIT if mbit is None else mbit)
    return {"kind": "htb", "rate": bps, "ceil": bps}


# -- objects ---------------------------------------------------------------------------------------


def _qdisc(
    prefix: list[str], dev: str, parent: str | None, handle: str, args: list[str], expect: dict[str, Any]
) -> TcObject:
    where = ["root"] if parent is None else ["parent", parent]
    tail = ["dev", dev, *where, "handle", handle, *args]
    return TcObject(
        type="qdisc",
        id=handle,
        argv=(*prefix, "qdisc", "replace", *tail),
        change_argv=(*prefix, "qdisc", "change", *tail),
        expect={"handle": handle, "parent": parent or "root", **expect},
    )


def _class(prefix: list[str], dev: str, classid: str, mbit: float | None) -> TcObject:
    tail = ["dev", dev, "parent", ROOT_HANDLE, "classid", classid, *htb_class_args(mbit)]
    return TcObject(
        type="class",
        id=classid,
        argv=(*prefix, "class", "add", *tail),
        change_argv=(*prefix, "class", "change", *tail),
        expect={"classid": classid, "parent": "root", **htb_class_expect(mbit)},
    )


def u32_keys(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[list[int]]:
    """The ``[value, mask, offset]`` keys ``tc`` stores for ``match ip[6] dst NET`` (IP header)."""
    base = 16 if network.version == 4 else 24
    words = network.network_address.packed
    keys: list[list[int]] = []
    for index in range(len(words) // 4):
        bits = min(32, max(0, network.prefixlen - 32 * index))
        if bits == 0:
            continue
        mask = ((1 << bits) - 1) << (32 - bits)
        word = int.from_bytes(words[4 * index : 4 * index + 4], "big")
        keys.append([word & mask, mask, base + 4 * index])
    if not keys:  # /0: tc stores one all-zero key
        keys.append([0, 0, base])
    return keys


def _filter(prefix: list[str], dev: str, prio: int, network: Any, flowid: str) -> TcObject:
    proto, match = ("ip", "ip") if network.version == 4 else ("ipv6", "ip6")
    argv = (
        *prefix,
        "filter",
        "add",
        "dev",
        dev,
        "parent",
        ROOT_HANDLE,
        "protocol",
        proto,
        "prio",
        str(prio),
        "u32",
        "match",
        match,
        "dst",
        str(network),
        "flowid",
        flowid,
    )
    return TcObject(
        type="filter",
        id=f"{ROOT_HANDLE} {proto} {prio}",
        argv=argv,
        change_argv=None,
        expect={
            "parent": ROOT_HANDLE,
            "protocol": proto,
            "pref": prio,
            "kind": "u32",
            "flowid": flowid,
            "keys": u32_keys(network),
        },
    )


def parse_network(target: str, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(target, strict=False)
    except ValueError as exc:
        raise NetemError(f"{where}: {target!r} is not an IP address or CIDR") from exc


def needs_netem(block: Mapping[str, Any]) -> bool:
    """Whether ``block`` needs the ``sch_netem`` kernel module (a rate cap alone does not)."""
    if Profile.of(block).has_netem:
        return True
    if (block.get("variation") or {}).get("kind", "constant") != "constant":
        return True
    return any(Profile.of(p).has_netem for p in (block.get("destinations") or {}).values())


def build_tree(
    block: Mapping[str, Any],
    dev: str,
    *,
    device: str,
    seed: int | str = 0,
    destinations: Mapping[str, str] | None = None,
    netns: str | None = None,
) -> Shaping | None:
    """The tree for ``network.<device>`` on interface ``dev``; None when there is nothing to shape.

    ``destinations`` maps every key of ``block["destinations"]`` to an IP address or CIDR (the
    caller resolves host names to inference addresses). With a variation other than ``constant``
    the main netem starts at the schedule's first delay and :attr:`Shaping.vary_template` is the
    argv the ``netem-vary`` process changes it with.
    """
    where = f"network.{device}"
    prefix = tc_prefix(netns)
    main = Profile.of(block)
    variation = dict(block.get("variation") or {})
    kind = variation.get("kind", "constant")
    varying = kind != "constant"
    if varying:
        first = schedule(variation, seed, device, 1)[0].delay_ms
        main = Profile(first, main.jitter_ms, main.loss_pct, main.rate_mbit, main.loss_correlation_pct)
    dests = dict(block.get("destinations") or {})
    objects: list[TcObject] = []
    vary_qdisc: str | None = None
    vary_where: list[str] = []
    if dests:
        resolved = destinations or {}
        entries = []
        for key, conf in dests.items():
            if key not in resolved:
                raise NetemError(f"{where}.destinations.{key}: no address resolved for this destination")
            network = parse_network(resolved[key], f"{where}.destinations.{key}")
            entries.append((network, key, Profile.of(conf)))
        entries.sort(key=lambda e: (e[0].version, -e[0].prefixlen, int(e[0].network_address), e[1]))
        seen: dict[Any, str] = {}
        for network, key, _ in entries:
            if network in seen:
                raise NetemError(f"{where}.destinations.{key}: same address as destination {seen[network]}")
            seen[network] = key
        objects.append(
            _qdisc(prefix, dev, None, ROOT_HANDLE, ["htb", "default", "1"], {"kind": "htb", "options": {}})
        )
        objects.append(_class(prefix, dev, MAIN_CLASS, main.rate_mbit))
        if main.has_netem or varying:
            objects.append(
                _qdisc(prefix, dev, MAIN_CLASS, MAIN_LEAF, netem_args(main), netem_expect(main, varying))
            )
            vary_qdisc, vary_where = MAIN_LEAF, ["parent", MAIN_CLASS, "handle", MAIN_LEAF]
        for index, (_network, _key, profile) in enumerate(entries):
            minor = f"{0x11 + index:x}"
            classid = f"1:{minor}"
            objects.append(_class(prefix, dev, classid, profile.rate_mbit))
            if profile.has_netem:
                objects.append(
                    _qdisc(prefix, dev, classid, f"{minor}:", netem_args(profile), netem_expect(profile))
                )
        for index, (network, _key, _profile) in enumerate(entries):
            objects.append(_filter(prefix, dev, index + 1, network, f"1:{0x11 + index:x}"))
    elif main.has_netem or varying:
        objects.append(_qdisc(prefix, dev, None, ROOT_HANDLE, netem_args(main), netem_expect(main, varying)))
        vary_qdisc, vary_where = ROOT_HANDLE, ["root", "handle", ROOT_HANDLE]
        if main.rate_mbit is not None:
            objects.append(
                _qdisc(prefix, dev, "1:1", "10:", tbf_args(main.rate_mbit), tbf_expect(main.rate_mbit))
            )
    elif main.rate_mbit is not None:
        objects.append(
            _qdisc(prefix, dev, None, ROOT_HANDLE, tbf_args(main.rate_mbit), tbf_expect(main.rate_mbit))
        )
    else:
        return None
    template: tuple[str, ...] | None = None
    if varying:
        template = (*prefix, "qdisc", "change", "dev", dev, *vary_where, *netem_args(main, PLACEHOLDER))
    return Shaping(
        interface=dev,
        objects=tuple(objects),
        needs_netem=needs_netem(block),
        vary_qdisc=vary_qdisc if varying else None,
        vary_template=template,
        variation=variation if varying else {},
    )


def check_interface(dev: str, protected: Sequence[str], where: str) -> None:
    """Refuse to shape a management interface."""
    if not dev:
        raise NetemError(
            f"{where}.interface: no interface to shape: set it, or the inventory variable "
            "dit_inference_interface of the device"
        )
    if dev in {p for p in protected if p}:
        raise NetemError(
            f"{where}.interface: {dev} is the management interface of the device; "
            "dit shapes only the inference interface (dit_inference_interface)"
        )


def netem_gate(
    network: Mapping[str, Any],
    facts: Mapping[str, Mapping[str, Any]],
    hostvars: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """Preflight: the devices whose block needs ``sch_netem`` on a kernel that lacks it.

    A device whose inventory sets ``dit_tc_dry_run`` only records its tc commands and passes.
    """
    problems: list[str] = []
    for device, block in network.items():
        if not needs_netem(block) or (hostvars or {}).get(device, {}).get("dit_tc_dry_run"):
            continue
        netem = (facts.get(device) or {}).get("netem")
        if not isinstance(netem, Mapping) or netem.get("available") is not False:
            continue
        kernel = (facts.get(device) or {}).get("kernel", "?")
        problems.append(
            f"{device}: kernel {kernel} lacks sch_netem ({netem.get('reason', 'not found')}), but "
            f"network.{device} adds delay, jitter, loss or variation; install the kernel's netem module "
            "(CONFIG_NET_SCH_NETEM) or use a rate-only profile (tbf)"
        )
    return problems


def intended_delay_ms(
    block: Mapping[str, Any], address: str | None, destinations: Mapping[str, str]
) -> float:
    """The delay netem adds to packets towards ``address`` (the mean for a varying delay)."""
    if address is not None:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            ip = None
        best: tuple[int, Profile] | None = None
        for key, conf in (block.get("destinations") or {}).items():
            target = destinations.get(key)
            if ip is None or target is None:
                continue
            network = ipaddress.ip_network(target, strict=False)
            if (
                ip.version == network.version
                and ip in network
                and (best is None or network.prefixlen > best[0])
            ):
                best = (network.prefixlen, Profile.of(conf))
        if best is not None:
            return best[1].delay_ms
    variation = block.get("variation") or {}
    if variation.get("kind", "constant") != "constant":
        return (float(variation["low_ms"]) + float(variation["high_ms"])) / 2
    return float(block.get("delay_ms") or 0.0)
