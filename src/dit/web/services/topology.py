"""A topology drawn on a map as a network: distance → synthetic link latency → netem.

The latency of a link between two nodes is ``5 ms + 1 ms per km`` of their distance: great-circle
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


def link_latency_ms(distance_km: float) -> float:
    """The synthetic one-way latency of a link: 5 ms + 1 ms per km, rounded to microseconds."""
    return round(BASE_MS + MS_PER_KM * distance_km, 3)


def links(points: Iterable[Point]) -> list[dict[str, Any]]:
    """Every pair of nodes once, with its distance (km) and latency (ms), in name order."""
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
                    "delay_ms": link_latency_ms(km),
                }
            )
    return out


def topology_delays(nodes: Iterable[Point]) -> dict[str, dict[str, float]]:
    """``{device: {peer: delay_ms}}``: every device's latency to every other node (edge and devices)."""
    points = list(nodes)
    out: dict[str, dict[str, float]] = {}
    for dev in sorted((p for p in points if p.role == "device"), key=lambda p: p.name):
        out[dev.name] = {
            peer.name: link_latency_ms(distance_km(dev, peer))
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
