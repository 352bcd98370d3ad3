"""A topology drawn on a map as a network: distance → synthetic link latency → netem.

The latency of a link between two nodes comes from the distance rule (:class:`DelayRule`), by default
``5 ms + 1 ms per km`` of their distance; the researcher sets its base and per-metre terms, or no rule
at all (the map then gives no delay), as the inventory's ``dit_delay_rule``. Distances are great-circle
(haversine on a sphere of radius :data:`EARTH_RADIUS_KM`) between nodes on a world map, straight-line
between nodes on a floor plan (metres from the plan's scale; across a room the rule gives 5 ms plus
a few microseconds, i.e. the base latency of a link). A scenario carries it as per-destination
netem profiles: ``network.<device>.destinations.<peer>.delay_ms``, the delay added to the device's
traffic towards that peer (the edge server by its inventory name, or another device). Only devices
shape their egress (the schema has no network block for the edge server), so a device↔edge link
adds its latency once per round trip and a device↔device link, shaped at both ends, twice.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EARTH_RADIUS_KM = 6371.0088  # mean Earth radius (IUGG)
BASE_MS = 5.0
MS_PER_KM = 1.0
RULE_VAR = "dit_delay_rule"
"""The inventory variable (group ``all``) holding the distance rule the researcher set."""
MAX_BASE_MS = 10_000.0
MAX_MS_PER_M = 1_000.0


class RuleError(ValueError):
    """A distance rule that cannot be used: ``field`` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class DelayRule:
    """A link's synthetic one-way latency from its distance: ``base_ms + ms_per_m * metres``.

    The default (5 ms + 1 ms per km) suits a world map; across a room it gives every link ~5.00 ms,
    so a floor plan's researcher sets their own terms (issue 49, item 5).
    """

    base_ms: float = BASE_MS
    ms_per_m: float = MS_PER_KM / 1000

    def latency_ms(self, distance_km: float) -> float:
        """Rounded to microseconds."""
        return round(self.base_ms + self.ms_per_m * distance_km * 1000, 3)

    def text(self) -> str:
        """``5 ms + 1 ms/km`` (a world map's scale) or ``0.1 ms + 0.05 ms/m`` (a room's)."""
        if self.ms_per_m == 0:
            return f"{self.base_ms:g} ms whatever the distance"
        per = f"{self.ms_per_m * 1000:g} ms/km" if self.ms_per_m < 0.01 else f"{self.ms_per_m:g} ms/m"
        return f"{self.base_ms:g} ms + {per}"

    def to_json(self) -> dict[str, Any]:
        return {"base_ms": self.base_ms, "ms_per_m": self.ms_per_m, "text": self.text()}


DEFAULT_RULE = DelayRule()


def _term(body: Mapping[str, Any], key: str, top: float) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RuleError(key, "a number of milliseconds" + (" per metre" if key == "ms_per_m" else ""))
    if not 0 <= value <= top:
        raise RuleError(key, f"must lie in [0, {top:g}]")
    return float(value)


def rule_from(body: Mapping[str, Any] | None) -> DelayRule | None:
    """The rule of ``{base_ms, ms_per_m}`` or ``{none: true}`` (no rule: None); :class:`RuleError`
    names the key that is wrong."""
    if body is None:
        return DEFAULT_RULE
    if body.get("none") is True:
        return None
    return DelayRule(_term(body, "base_ms", MAX_BASE_MS), _term(body, "ms_per_m", MAX_MS_PER_M))


def rule_of(variables: Mapping[str, Any]) -> DelayRule | None:
    """The rule stored in the inventory (the default when none is stored or it cannot be read)."""
    stored = variables.get(RULE_VAR)
    try:
        return rule_from(stored if isinstance(stored, Mapping) else None)
    except RuleError:
        return DEFAULT_RULE


@dataclass(frozen=True)
class Point:
    """A node on the map: its inventory name, role (``edge`` | ``device``) and coordinates."""

    name: str
    role: str
    lat: float = 0.0
    lon: float = 0.0
    x_m: float | None = None  # on a floor plan: metres from its left edge
    y_m: float | None = None  # and from its top edge

    @property
    def planar(self) -> bool:
        return self.x_m is not None and self.y_m is not None


def haversine_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in kilometres between two (latitude, longitude) points in degrees."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(a)))


def distance_km(a: Point, b: Point) -> float:
    """Straight-line distance of two points on a floor plan, great-circle distance on a world map."""
    if a.planar and b.planar:
        return math.hypot(float(a.x_m or 0) - float(b.x_m or 0), float(a.y_m or 0) - float(b.y_m or 0)) / 1000
    return haversine_km(a.lat, a.lon, b.lat, b.lon)


def link_latency_ms(distance_km: float, rule: DelayRule = DEFAULT_RULE) -> float:
    """The synthetic one-way latency of a link under ``rule`` (5 ms + 1 ms per km by default)."""
    return rule.latency_ms(distance_km)


def links(points: Iterable[Point], rule: DelayRule | None = DEFAULT_RULE) -> list[dict[str, Any]]:
    """Every pair of nodes once, with its distance (km) and latency (ms) under ``rule`` (None without
    a rule), in name order."""
    ordered = sorted(points, key=lambda p: p.name)
    out: list[dict[str, Any]] = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            km = distance_km(a, b)
            out.append(
                {
                    "a": a.name,
                    "b": b.name,
                    "km": round(km, 6),
                    "m": round(km * 1000, 2),
                    "delay_ms": None if rule is None else rule.latency_ms(km),
                }
            )
    return out


def topology_delays(
    nodes: Iterable[Point], rule: DelayRule | None = DEFAULT_RULE
) -> dict[str, dict[str, float]]:
    """``{device: {peer: delay_ms}}``: every device's latency to every other node (edge and devices)
    under ``rule``; empty without a rule (the map then writes no delay)."""
    points = list(nodes)
    out: dict[str, dict[str, float]] = {}
    if rule is None:
        return out
    for dev in sorted((p for p in points if p.role == "device"), key=lambda p: p.name):
        out[dev.name] = {
            peer.name: rule.latency_ms(distance_km(dev, peer))
            for peer in sorted(points, key=lambda p: p.name)
            if peer.name != dev.name
        }
    return out


def network_block(
    delays: Mapping[str, Mapping[str, float]],
    devices: Sequence[str],
    edge: str | None,
    device_links: bool = False,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The scenario's ``network`` block with the topology's per-destination delays merged in
    (:func:`apply_map_delays` without its account of what it kept and changed)."""
    return apply_map_delays(delays, devices, edge, device_links, base)[0]


def apply_map_delays(
    delays: Mapping[str, Mapping[str, float]],
    devices: Sequence[str],
    edge: str | None,
    device_links: bool = False,
    base: Mapping[str, Any] | None = None,
    from_map: Collection[tuple[str, str]] = (),
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``network`` block with the map's per-destination delays merged in, and one note per link.

    For each of ``devices`` (those the topology knows): its link to ``edge`` and, with
    ``device_links``, to the scenario's other devices. ``base`` (the scenario's existing ``network``
    block) is kept: other fields stay, and so do destinations the topology does not name.
    The map only fills a delay the user did not type (issue 36: a typed value is never overridden
    silently). A destination's ``delay_ms`` is kept unless its link is in ``from_map`` (``(device,
    peer)`` pairs whose delay the map wrote before, as the editor knows: those follow the map). A
    device whose block has a typed ``delay_ms`` and no profile for the link keeps it too: a
    destination delay would override it there, so the map's value is not written.
    Notes: ``{"device", "peer", "delay_ms", "map_ms", "source"}`` — ``source`` ``typed`` (kept;
    ``where`` says which field: the device's or the destination's), ``map`` (written;
    ``previous_ms`` when it replaced an earlier map value).
    """
    refresh = set(from_map)
    out: dict[str, Any] = {k: dict(v) for k, v in (base or {}).items() if isinstance(v, Mapping)}
    notes: list[dict[str, Any]] = []
    for dev in devices:
        peers = delays.get(dev)
        if not peers:
            continue
        wanted = [p for p in peers if p == edge or (device_links and p in devices)]
        if not wanted:
            continue
        block = out.setdefault(dev, {})
        typed = block.get("delay_ms")
        dests = dict(block.get("destinations") or {})
        for peer in wanted:
            profile = dict(dests.get(peer) or {})
            map_ms = peers[peer]
            note: dict[str, Any] = {"device": dev, "peer": peer, "map_ms": map_ms}
            previous = profile.get("delay_ms")
            if previous is not None and (dev, peer) not in refresh:
                where = f"network.{dev}.destinations.{peer}.delay_ms"
                notes.append({**note, "delay_ms": previous, "source": "typed", "where": where})
                continue
            if typed is not None and not profile:
                notes.append(
                    {**note, "delay_ms": typed, "source": "typed", "where": f"network.{dev}.delay_ms"}
                )
                continue
            if previous is not None and previous != map_ms:
                note["previous_ms"] = previous
            profile["delay_ms"] = map_ms
            dests[peer] = profile
            notes.append({**note, "delay_ms": map_ms, "source": "map"})
        if dests:
            block["destinations"] = dests
        elif not block:
            del out[dev]
    return out, notes
