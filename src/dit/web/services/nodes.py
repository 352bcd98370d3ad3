"""The NNPM-managed inventory: an Ansible YAML inventory file whose hosts NNPM places on a map.

The file is an ordinary Ansible inventory (``dit run -i FILE`` uses it as is): the edge server in group
``edge``, the boards in group ``devices``, each host with ``ansible_host`` (its address), ``dit_lat`` /
``dit_lon`` (its place on a world map) and/or ``dit_plan_x`` / ``dit_plan_y`` (its place on the floor
plan, in image pixels; see :mod:`dit.web.services.floorplan`), optionally ``dit_inference_address``
and ``dit_board`` (board facts: ``model``, ``memory_mb``, ``cores``, ``max_mhz``). NNPM edits only those
host entries; groups, variables and hosts it does not manage are kept as written. A directory inventory (e.g.
``inventories/rack.example/``) or any non-YAML source is read through ``ansible-inventory --list``
and shown, but not edited.
"""

from __future__ import annotations

import math
import os
import re
import threading
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.ansible_data import UnsafeText, load_unsafe_yaml, marked_yaml
from dit.run.inventory import InventoryError, list_inventory
from dit.web.services.topology import Point

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}\Z")
ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}\Z")
ROLES = ("edge", "device")
GROUP_OF = {"edge": "edge", "device": "devices"}
PLAN_RANGE = (("x", 0.0, 20_000.0), ("y", 0.0, 20_000.0))  # image pixels (floorplan.MAX_SIDE)
BOARD_KEYS = {"model": str, "memory_mb": int, "cores": int, "max_mhz": int}
HEADER = "# The NNPM-managed inventory (dit web): hosts placed on the map. dit run -i uses it as is.\n"


class NodeError(ValueError):
    """A node that cannot be saved; ``field`` names the offending field, ``problems`` every one found
    (``(field, message)``, the first being ``field``'s), so a form shows them all at once."""

    def __init__(
        self, field_name: str, message: str, status: int = 422, also: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.field = field_name
        self.status = status
        self.problems = ((field_name, message), *also)


@dataclass(frozen=True)
class Node:
    name: str
    role: str  # edge | device
    address: str
    lat: float | None
    lon: float | None
    board: dict[str, Any] = field(default_factory=dict)
    inference_address: str | None = None
    hostvars: dict[str, Any] = field(default_factory=dict)  # every variable of the host, merged
    x: float | None = None  # on the floor plan: image pixels from the left
    y: float | None = None  # and from the top

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "address": self.address,
            "lat": self.lat,
            "lon": self.lon,
            "x": self.x,
            "y": self.y,
            "board": self.board,
            "inference_address": self.inference_address,
            "ssh_port": int(self.hostvars.get("ansible_port") or 22),
            "connection": str(self.hostvars.get("ansible_connection") or "ssh"),
        }

    @property
    def point(self) -> Point | None:
        if self.lat is None or self.lon is None:
            return None
        return Point(self.name, self.role, self.lat, self.lon)

    def plan_point(self, metres_per_px: float) -> Point | None:
        """The node on the floor plan, in metres from its top-left corner (None when not placed)."""
        if self.x is None or self.y is None:
            return None
        return Point(self.name, self.role, x_m=self.x * metres_per_px, y_m=self.y * metres_per_px)


def board_text(key: str, value: Any) -> str:
    """A free-text board fact: one line of 1..100 printable characters, outer blanks stripped.

    Markup characters (``<``, ``>``, ``&``, quotes) are kept: ``Pi 4 <8GB>`` is a real model name and
    every NNPM view shows values as text. Control and line-separator characters are refused: they
    would break the inventory's one-line value, the tables and the terminal.
    """
    if not isinstance(value, str):
        raise NodeError(f"board.{key}", "text (at most 100 characters)")
    text = value.strip()
    if not text or len(text) > 100:
        raise NodeError(f"board.{key}", "text of 1 to 100 characters")
    bad = next((c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if bad is not None:
        raise NodeError(f"board.{key}", f"no control characters (found U+{ord(bad):04X})")
    return text


def check_node(
    data: Mapping[str, Any], name: str | None = None, require: str | None = None
) -> dict[str, Any]:
    """A node from the API (``name`` fixed by the URL when given); :class:`NodeError` when invalid,
    naming every bad field (not only the first).

    Its position is ``lat``/``lon`` (a world map), ``x``/``y`` (the floor plan, image pixels) or both;
    ``require`` (``geo`` | ``plan``) names the pair that must be there.
    """
    out: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    name = name if name is not None else data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        problems.append(("name", "letters, digits, '_' and '-', starting with a letter (at most 63)"))
    out["name"] = name
    role = data.get("role", "device")
    if role not in ROLES:
        problems.append(("role", f"must be one of {', '.join(ROLES)}"))
    out["role"] = role
    address = data.get("address")
    if not isinstance(address, str) or not ADDRESS.match(address):
        problems.append(("address", "a host name or an IP address"))
    out["address"] = address
    pairs = {"geo": (("lat", -90.0, 90.0), ("lon", -180.0, 180.0)), "plan": PLAN_RANGE}
    placed = False
    for view, pair in pairs.items():
        given = any(data.get(key) is not None for key, _, _ in pair)
        if not given and view != require:
            continue
        placed = True
        for key, low, high in pair:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                problems.append((key, "a number"))
            elif not low <= value <= high:
                problems.append((key, f"must lie in {low:g}..{high:g}"))
            else:
                out[key] = round(float(value), 6 if view == "geo" else 2)
    if not placed:
        problems.append(("lat", "a position: lat and lon on the map, or x and y on the floor plan"))
    inference = data.get("inference_address")
    if inference not in (None, ""):
        if not isinstance(inference, str) or not ADDRESS.match(inference):
            problems.append(("inference_address", "an IP address"))
        out["inference_address"] = inference
    board_in = data.get("board") or {}
    if not isinstance(board_in, Mapping):
        problems.append(("board", "a mapping of board facts"))
        board_in = {}
    board: dict[str, Any] = {}
    for key, value in board_in.items():
        kind = BOARD_KEYS.get(key)
        if kind is None:
            problems.append((f"board.{key}", f"unknown board fact (known: {', '.join(BOARD_KEYS)})"))
            continue
        if value in (None, ""):
            continue
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append((f"board.{key}", "a positive integer"))
            else:
                board[key] = value
        else:
            try:
                board[key] = board_text(key, value)
            except NodeError as exc:
                problems.extend(exc.problems)
    if problems:
        (first, said), *rest = problems
        raise NodeError(first, said, also=tuple(rest))
    out["board"] = board
    return out


def _hosts_of(group: Any) -> dict[str, Any]:
    if not isinstance(group, dict):
        return {}
    hosts = group.get("hosts")
    return hosts if isinstance(hosts, dict) else {}


def _walk(
    group: Any, name: str, chain: list[str], inherited: Mapping[str, Any] | None = None
) -> Iterator[tuple[str, list[str], dict[str, Any], dict[str, Any]]]:
    """Every group below ``group`` (inclusive): name, ancestry, mapping and its variables (inherited)."""
    if not isinstance(group, dict):
        return
    own = group.get("vars")
    variables = {**(inherited or {}), **(own if isinstance(own, dict) else {})}
    yield name, chain, group, variables
    children = group.get("children")
    if isinstance(children, dict):
        for child, sub in children.items():
            yield from _walk(sub if isinstance(sub, dict) else {}, str(child), [*chain, name], variables)


class Inventory:
    """Reads and edits the NNPM-managed inventory file (thread-safe; every write is atomic)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    @property
    def editable(self) -> bool:
        return not self.path.is_dir() and self.path.suffix in (".yml", ".yaml")

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"all": {"children": {"edge": {"hosts": {}}, "devices": {"hosts": {}}}}}
        # load_unsafe_yaml: the values NNPM wrote unsafe stay so when the file is written again
        data = load_unsafe_yaml(self.path.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise NodeError(
                "inventory", f"{self.path}: not a YAML inventory (top level is not a mapping)", 500
            )
        return data

    def nodes(self) -> list[Node]:
        with self._lock:
            if not self.editable:
                return self._nodes_from_ansible()
            return self._nodes_from(self._load())

    def _nodes_from(self, data: dict[str, Any]) -> list[Node]:
        # host -> merged vars and groups; precedence: ancestors' vars < group vars < host vars
        groups: dict[str, set[str]] = {}
        merged: dict[str, dict[str, Any]] = {}
        for root_name, root in data.items():
            for gname, chain, group, variables in _walk(root, str(root_name), []):
                for host, hvars in _hosts_of(group).items():
                    groups.setdefault(str(host), set()).update([gname, *chain])
                    entry = merged.setdefault(str(host), {})
                    for key, value in variables.items():
                        entry.setdefault(key, value)
                    entry.update(hvars if isinstance(hvars, dict) else {})
        return [self._node(host, merged[host], groups[host]) for host in sorted(merged)]

    @staticmethod
    def _node(host: str, hv: Mapping[str, Any], groups: set[str]) -> Node:
        def num(key: str) -> float | None:
            value = hv.get(key)
            try:
                return None if value is None else float(value)
            except (TypeError, ValueError):
                return None

        board = hv.get("dit_board")
        return Node(
            name=host,
            role="edge" if "edge" in groups else "device",
            address=str(hv.get("ansible_host") or host),
            lat=num("dit_lat"),
            lon=num("dit_lon"),
            board=dict(board) if isinstance(board, Mapping) else {},
            inference_address=str(hv["dit_inference_address"]) if hv.get("dit_inference_address") else None,
            hostvars=dict(hv),
            x=num("dit_plan_x"),
            y=num("dit_plan_y"),
        )

    def _nodes_from_ansible(self) -> list[Node]:
        try:
            listing = list_inventory(str(self.path))
        except InventoryError as exc:
            raise NodeError("inventory", str(exc)[:700], 500) from None
        hostvars = listing.hostvars
        edge = set(listing.members("edge"))
        return [self._node(h, hostvars.get(h, {}), {"edge"} if h in edge else set()) for h in listing.hosts()]

    def _require_editable(self) -> None:
        if not self.editable:
            raise NodeError(
                "inventory",
                f"{self.path} is not a YAML inventory file NNPM can edit; start dit web with "
                "--inventory FILE.yml",
                409,
            )

    def _save(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        text = marked_yaml(data, sort_keys=False, default_flow_style=False)
        tmp.write_text(HEADER + text, encoding="utf-8")
        os.replace(tmp, self.path)

    @staticmethod
    def _find(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
        """Every ``hosts`` mapping that holds host ``name``."""
        found: list[dict[str, Any]] = []
        for root_name, root in data.items():
            for _g, _c, group, _v in _walk(root, str(root_name), []):
                hosts = _hosts_of(group)
                if name in hosts:
                    found.append(hosts)
        return found

    @staticmethod
    def _group(data: dict[str, Any], group: str) -> dict[str, Any]:
        root = data.setdefault("all", {})
        if not isinstance(root, dict):
            raise NodeError("inventory", "group 'all' is not a mapping", 500)
        children = root.setdefault("children", {})
        sub = children.get(group)
        if not isinstance(sub, dict):
            sub = children[group] = {}
        hosts = sub.get("hosts")
        if not isinstance(hosts, dict):
            hosts = {}
            sub["hosts"] = hosts
        out: dict[str, Any] = hosts
        return out

    def upsert(self, node: Mapping[str, Any], create: bool) -> Node:
        """Add (``create``) or replace the NNPM-managed fields of a node; the node as saved."""
        with self._lock:
            self._require_editable()
            data = self._load()
            name = str(node["name"])
            places = self._find(data, name)
            if create and places:
                raise NodeError("name", f"a node named {name} already exists", 409)
            if not create and not places:
                raise NodeError("name", f"no node named {name}", 404)
            existing = self._nodes_from(data)
            edges = [n.name for n in existing if n.role == "edge" and n.name != name]
            if node["role"] == "edge" and edges:
                raise NodeError("role", f"the inventory already has an edge server ({edges[0]})")
            hv: dict[str, Any] = {}
            for hosts in places:
                hv.update(hosts.get(name) or {})
            group_hosts = self._group(data, GROUP_OF[node["role"]])
            other = self._group(data, GROUP_OF["device" if node["role"] == "edge" else "edge"])
            other.pop(name, None)
            # what a request gave is data: written unsafe (UnsafeText), never an Ansible template
            hv["ansible_host"] = UnsafeText(node["address"])
            for key, var in (
                ("lat", "dit_lat"),
                ("lon", "dit_lon"),
                ("x", "dit_plan_x"),
                ("y", "dit_plan_y"),
            ):
                if key in node:  # a position in one view keeps the node's place in the other
                    hv[var] = node[key]
            if node.get("inference_address"):
                hv["dit_inference_address"] = UnsafeText(node["inference_address"])
            else:
                hv.pop("dit_inference_address", None)
            if node.get("board"):
                hv["dit_board"] = {
                    k: UnsafeText(v) if isinstance(v, str) else v for k, v in node["board"].items()
                }
            else:
                hv.pop("dit_board", None)
            for hosts in places:
                if hosts is not other and hosts is not group_hosts:
                    hosts[name] = hv
            group_hosts[name] = hv
            self._save(data)
            return next(n for n in self._nodes_from(data) if n.name == name)

    def move(self, name: str, lat: float, lon: float) -> Node:
        current = next((n for n in self.nodes() if n.name == name), None)
        if current is None:
            raise NodeError("name", f"no node named {name}", 404)
        data = {**current.to_json(), "lat": lat, "lon": lon}
        return self.upsert(check_node(data, name), create=False)

    def variables(self) -> dict[str, Any]:
        """The variables of group ``all`` (where the floor plan's ``dit_floorplan`` lives)."""
        with self._lock:
            if not self.editable:
                return {}
            root = self._load().get("all")
            found = root.get("vars") if isinstance(root, dict) else None
            return dict(found) if isinstance(found, dict) else {}

    def set_variable(self, key: str, value: Any) -> None:
        """Set one variable of group ``all`` (atomic, other content kept)."""
        with self._lock:
            self._require_editable()
            data = self._load()
            self._all_vars(data)[key] = value
            self._save(data)

    def set_variable_rescaling_plan(self, key: str, value: Any, fx: float, fy: float) -> int:
        """:meth:`set_variable` and every node's floor-plan position multiplied by ``(fx, fy)``, in one
        write (a new plan image of another size keeps each node where it was on the plan); the number
        of nodes moved."""
        with self._lock:
            self._require_editable()
            data = self._load()
            seen: set[int] = set()  # a host mapping shared by YAML anchors is moved once
            moved: set[str] = set()
            for root_name, root in data.items():
                for _g, _c, group, _v in _walk(root, str(root_name), []):
                    for host, hv in _hosts_of(group).items():
                        if not isinstance(hv, dict) or id(hv) in seen:
                            continue
                        seen.add(id(hv))
                        try:
                            x, y = float(hv["dit_plan_x"]), float(hv["dit_plan_y"])
                        except (KeyError, TypeError, ValueError):
                            continue
                        hv["dit_plan_x"], hv["dit_plan_y"] = round(x * fx, 2), round(y * fy, 2)
                        moved.add(str(host))
            self._all_vars(data)[key] = value
            self._save(data)
            return len(moved)

    @staticmethod
    def _all_vars(data: dict[str, Any]) -> dict[str, Any]:
        root = data.setdefault("all", {})
        if not isinstance(root, dict):
            raise NodeError("inventory", "group 'all' is not a mapping", 500)
        found = root.get("vars")
        if not isinstance(found, dict):
            found = root["vars"] = {}
        return found

    def beside(self, suffix: str) -> Path:
        """A file next to the inventory: ``inventories/nnpm.yml`` → ``inventories/nnpm<suffix>``."""
        return self.path.with_name(self.path.stem + suffix)

    def require_editable(self) -> None:
        self._require_editable()

    def delete(self, name: str) -> None:
        with self._lock:
            self._require_editable()
            data = self._load()
            places = self._find(data, name)
            if not places:
                raise NodeError("name", f"no node named {name}", 404)
            for hosts in places:
                hosts.pop(name, None)
            self._save(data)
