#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Shape an interface with a tc tree (qdiscs, classes, filters) built by dit.conditions.netem.tc (journaled)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_tc
version_added: "0.1.0"
short_description: Apply a tc qdisc/class/filter tree to an interface, restorable from the journal
description:
  - O(objects) is the desired tree as built by C(dit.conditions.netem.tc.build_tree) on the controller,
    in creation order; each object carries the argv that creates it, the argv that changes it in place, and
    C(expect), the fields the kernel must report for it.
  - Reads the current tree (C(tc -j qdisc show dev IF), C(tc -d class show dev IF),
    C(tc filter show dev IF parent ...)) and compares. When every object is present with the
    expected values and nothing else is attached, nothing is done (C(changed=false)). When only
    options differ, only those objects are changed in place (C(tc qdisc change) / C(tc class change)).
    Otherwise the tree is rebuilt (the current root is deleted first unless it is the kernel's
    default qdisc, handle C(0:)).
  - Journaled through the C(dit_tc) action plugin. With O(_dit_plan) the module returns the journal
    records that restore the tree it found, newest last, as C(command) records for C(dit_restore),
    and changes nothing. Restoring a kernel default root is C(tc qdisc del dev IF root); a prior
    non-default tree (qdiscs C(tbf), C(pfifo), C(bfifo), C(pfifo_fast), C(htb), C(netem); C(htb)
    classes; C(u32) filters) is deleted and re-created with its handles and options. A prior tree
    with anything else is refused before any change, so a tree dit cannot restore is never touched.
  - Refuses to shape O(protected_interfaces) and the interface(s) of the default route.
  - With O(dry_run) nothing is executed. Every argv is appended to the JSON-lines O(log), the tree
    that would be in place is kept in a state file next to it (so a second apply is idempotent), and
    the undo records carry C(dry_run) and C(log) too, so teardown records instead of executing.
options:
  dev:
    description: Interface to shape.
    type: str
    required: true
  netns:
    description: Network namespace of the interface (C(tc -n NS)); empty for the current one.
    type: str
    default: ""
  objects:
    description: The desired tree (type, id, argv, change_argv, expect per object).
    type: list
    elements: dict
    required: true
  dry_run:
    description: Record argv in O(log) instead of running them.
    type: bool
    default: false
  log:
    description: JSON-lines log of recorded argv (required with O(dry_run)).
    type: path
  protected_interfaces:
    description: Interfaces never shaped (the management interface).
    type: list
    elements: str
    default: []
  tc:
    description: The tc executable.
    type: str
    default: tc
extends_documentation_fragment:
  - dit
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the current tree and returns the commands that would run and the undo records; runs none.
  diff_mode:
    support: full
    details: The tree before and after, one line per qdisc, class and filter.
author: The dit developers
"""

EXAMPLES = r"""
- name: Shape wlan0 (tree built by dit.conditions.netem.tc)
  dit_tc:
    dev: wlan0
    objects:
      - type: qdisc
        id: "1:"
        argv: [tc, qdisc, replace, dev, wlan0, root, handle, "1:", netem, delay, 20ms]
        change_argv: [tc, qdisc, change, dev, wlan0, root, handle, "1:", netem, delay, 20ms]
        expect: {handle: "1:", parent: root, kind: netem, options: {delay: {delay: 0.02, jitter: 0.0}}}
    protected_interfaces: [eth0]
"""

RETURN = r"""
commands:
  description: The argv run (or recorded with dry_run), in order.
  returned: always
  type: list
prior:
  description: The tree found (normalised qdiscs, classes, filters).
  returned: always
  type: dict
journal:
  description: With _dit_plan, the change records whose undo restores the prior tree.
  returned: with _dit_plan
  type: list
diff:
  description: The tree before and after, one line per object.
  returned: always
  type: dict
"""

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule

INGRESS_PARENTS = ("ffff:fff1", "ffff:fff2", "ffff:fff3")
IMPLICIT_CLASS_KINDS = ("tbf", "netem", "prio", "mq", "multiq", "fq_codel", "sfq", "pfifo_fast")
CLASSFUL_IMPLICIT = ("tbf", "netem", "prio", "mq", "multiq")
RATE_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
SIZE_UNITS = {"b": 1, "Kb": 1024, "Mb": 1024**2, "Gb": 1024**3}
REL_TOL = 0.01  # tc prints rates and times rounded; numeric fields match within 1 %
ABS_TOL = 2e-6  # netem times are reported in seconds: a few microseconds of tick rounding


class TcError(Exception):
    pass


class Unsupported(Exception):
    pass


# -- running tc ------------------------------------------------------------------------------------


def _prefix(tc: str, netns: str) -> list[str]:
    return [tc, "-n", netns] if netns else [tc]


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and proc.returncode != 0:
        raise TcError(
            "{} failed ({}): {}".format(" ".join(argv), proc.returncode, (proc.stderr or proc.stdout).strip())
        )
    return proc


# -- parsing the current tree ----------------------------------------------------------------------


def parse_rate(text: str) -> int:
    """``5Mbit`` / ``1500Kbit`` / ``10Gbit`` / ``800bit`` (also ``Mibit``) -> bytes/s."""
    match = re.fullmatch(r"([0-9.]+)([KMGT]?)(i?)bit", text)
    if not match:
        raise ValueError(f"not a rate: {text}")
    base = 1024 if match.group(3) else 1000
    power = " KMGT".index(match.group(2) or " ") if match.group(2) else 0
    scale: int = base**power
    return round(float(match.group(1)) * scale / 8)


def parse_size(text: str) -> int:
    """``1600b`` / ``15Kb`` / ``1600b/1`` -> bytes."""
    text = text.split("/", maxsplit=1)[0]
    match = re.fullmatch(r"([0-9.]+)(b|Kb|Mb|Gb)?", text)
    if not match:
        raise ValueError(f"not a size: {text}")
    return round(float(match.group(1)) * SIZE_UNITS[match.group(2) or "b"])


def normalise_qdiscs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        parent = "root" if entry.get("root") else entry.get("parent", "")
        if parent in INGRESS_PARENTS or entry.get("kind") in ("ingress", "clsact"):
            continue
        out.append(
            {
                "kind": entry.get("kind"),
                "handle": entry.get("handle"),
                "parent": parent,
                "options": entry.get("options") or {},
            }
        )
    return out


def parse_classes(text: str) -> list[dict[str, Any]]:
    """``tc -d class show`` lines -> dicts (htb fields in bytes/s and bytes)."""
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) < 3 or tokens[0] != "class":
            continue
        item: dict[str, Any] = {"kind": tokens[1], "classid": tokens[2], "raw": line.strip()}
        rest = tokens[3:]
        i = 0
        while i < len(rest):
            key = rest[i]
            if key == "root":
                item["parent"] = "root"
                i += 1
                continue
            if i + 1 >= len(rest):
                break
            value = rest[i + 1]
            if key == "parent":
                item["parent"] = value
            elif key == "leaf":
                item["leaf"] = value
            elif key in ("rate", "ceil"):
                item[key] = parse_rate(value)
            elif key in ("burst", "cburst"):
                item[key] = parse_size(value)
            elif key in ("prio", "quantum", "level"):
                with contextlib.suppress(ValueError):
                    item[key] = int(value)
            elif key in ("mpu", "linklayer", "overhead"):
                item.setdefault("extra", {})[key] = value
            i += 2
        out.append(item)
    return out


def _field(line: str, name: str, pattern: str = r"(\S+)") -> str | None:
    match = re.search(r"(?:^|\s)\*?" + name + r" " + pattern, line)
    return match.group(1) if match else None


def parse_filters(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """``tc filter show`` output -> u32 nodes (dicts with keys), u32 hash tables, other filters."""
    nodes: list[dict[str, Any]] = []
    tables: list[dict[str, Any]] = []
    others: list[str] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("filter "):
            current = None
            kind = re.search(r" pref \d+ (\S+)", line)
            fh = _field(line, "fh")
            if not kind or kind.group(1) != "u32":
                others.append(line.strip())
            elif fh is None:
                continue  # the priority header line
            elif "::" in fh:
                current = {
                    "parent": _field(line, "parent"),
                    "protocol": _field(line, "protocol"),
                    "pref": int(_field(line, "pref") or 0),
                    "kind": "u32",
                    "fh": fh,
                    "flowid": _field(line, "flowid") or _field(line, "classid"),
                    "keys": [],
                    "extra": [
                        k for k in ("link", "offset", "hashkey", "action", "police") if _field(line, k)
                    ],
                    "raw": line.strip(),
                }
                nodes.append(current)
            else:
                tables.append({"fh": fh, "divisor": _field(line, "ht divisor", r"(\d+)")})
        elif current is not None:
            stripped = line.strip()
            match = re.fullmatch(r"match ([0-9a-f]+)/([0-9a-f]+) at (-?[0-9]+)", stripped)
            if match:
                current["keys"].append(
                    [int(match.group(1), 16), int(match.group(2), 16), int(match.group(3))]
                )
            else:
                current.setdefault("unparsed", []).append(stripped)
    return nodes, tables, others


def read_tree(tc: str, netns: str, dev: str) -> dict[str, Any]:
    """The interface's egress tree: qdiscs, classes and filters, normalised."""
    pre = _prefix(tc, netns)
    proc = _run([*pre, "-j", "qdisc", "show", "dev", dev])
    qdiscs = normalise_qdiscs(json.loads(proc.stdout or "[]"))
    classes = parse_classes(_run([*pre, "-d", "class", "show", "dev", dev]).stdout)
    parents = [q["handle"] for q in qdiscs if q["parent"] == "root" and q["handle"] != "0:"]
    parents += [c["classid"] for c in classes if c["kind"] == "htb"]
    filters: list[dict[str, Any]] = []
    tables: list[dict[str, Any]] = []
    others: list[str] = []
    for parent in parents:
        text = _run([*pre, "filter", "show", "dev", dev, "parent", parent]).stdout
        nodes, tabs, rest = parse_filters(text)
        for node in nodes:
            node["parent"] = node["parent"] or parent  # tc omits the parent it was asked for
        filters += nodes
        tables += tabs
        others += rest
    return {
        "qdiscs": qdiscs,
        "classes": classes,
        "filters": filters,
        "tables": tables,
        "other_filters": others,
    }


def default_tree() -> dict[str, Any]:
    return {
        "qdiscs": [{"kind": "noqueue", "handle": "0:", "parent": "root", "options": {}}],
        "classes": [],
        "filters": [],
        "tables": [],
        "other_filters": [],
    }


def is_default(tree: dict[str, Any]) -> bool:
    roots = [q for q in tree["qdiscs"] if q["parent"] == "root"]
    return not roots or all(q["handle"] == "0:" for q in roots)


# -- comparing -------------------------------------------------------------------------------------


def matches(expect: Any, actual: Any) -> bool:
    """``expect`` is a subset of ``actual`` (numbers within tolerance; None means absent)."""
    if expect is None:
        return actual is None
    if isinstance(expect, dict):
        if not isinstance(actual, dict):
            return False
        for key, value in expect.items():
            if value is None:
                if actual.get(key) is not None:
                    return False
            elif key not in actual or not matches(value, actual[key]):
                return False
        return True
    if isinstance(expect, list):
        return (
            isinstance(actual, list)
            and len(expect) == len(actual)
            and all(matches(e, a) for e, a in zip(expect, actual, strict=False))
        )
    if isinstance(expect, bool) or isinstance(actual, bool):
        return bool(expect == actual)
    if isinstance(expect, (int, float)) and isinstance(actual, (int, float)):
        return bool(abs(expect - actual) <= max(ABS_TOL, REL_TOL * abs(expect)))
    return bool(expect == actual)


def _current_items(tree: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    items = {}
    for q in tree["qdiscs"]:
        items[("qdisc", q["handle"])] = q
    for c in tree["classes"]:
        if c["kind"] == "htb":
            items[("class", c["classid"])] = c
    for f in tree["filters"]:
        items[("filter", "{} {} {}".format(f["parent"], f["protocol"], f["pref"]))] = f
    return items


def compare(objects: list[dict[str, Any]], tree: dict[str, Any]) -> tuple[bool, list[dict[str, Any]], bool]:
    """``(present, differing, same_structure)`` of the desired ``objects`` against ``tree``."""
    items = _current_items(tree)
    wanted = {(o["type"], o["id"]) for o in objects}
    differing, same_structure = [], set(items) == wanted and not tree["other_filters"]
    for obj in objects:
        actual = items.get((obj["type"], obj["id"]))
        if actual is None:
            same_structure = False
            differing.append(obj)
            continue
        ident = {k: v for k, v in obj["expect"].items() if k in ("kind", "parent", "handle", "classid")}
        if not matches(ident, actual):
            same_structure = False
        if not matches(obj["expect"], actual):
            differing.append(obj)
            if obj["type"] == "filter" or not obj.get("change_argv"):
                same_structure = False
    return not differing and same_structure, differing, same_structure


def describe(tree: dict[str, Any]) -> str:
    lines = []
    for q in tree["qdiscs"]:
        lines.append(
            "qdisc {} {} {} {}".format(
                q["kind"], q["handle"], q["parent"], json.dumps(q["options"], sort_keys=True)
            )
        )
    for c in tree["classes"]:
        lines.append(c.get("raw") or "class {}".format(c.get("classid")))
    for f in tree["filters"]:
        lines.append(
            "{} {}".format(f.get("raw", ""), " ".join("{:08x}/{:08x}@{}".format(*k) for k in f["keys"]))
        )
    return "\n".join(lines) + "\n"


# -- restoring a prior tree ------------------------------------------------------------------------


def _us(seconds: float) -> str:
    return f"{round(seconds * 1e6)}us"


def _pct(fraction: float) -> str:
    return f"{round(fraction * 100, 6):g}%"


def render_qdisc_options(q: dict[str, Any]) -> list[str]:
    kind, opts = q["kind"], q["options"]
    if kind in ("pfifo", "bfifo"):
        return [kind, "limit", str(opts["limit"])] if "limit" in opts else [kind]
    if kind == "pfifo_fast":
        return [kind]
    if kind == "tbf":
        known = {"rate", "burst", "lat", "limit", "peakrate", "mtu", "linklayer"}
        if set(opts) - known:
            raise Unsupported(f"tbf options {sorted(set(opts) - known)}")
        burst = exact_size(int(opts["burst"]), int(opts["rate"]), _tick_in_usec())
        args = ["tbf", "rate", "{}bit".format(int(opts["rate"]) * 8), "burst", str(burst)]
        if "lat" in opts:
            args += ["latency", "{}us".format(int(opts["lat"]))]
        else:
            args += ["limit", str(opts["limit"])]
        if opts.get("peakrate"):
            args += ["peakrate", "{}bit".format(int(opts["peakrate"]) * 8), "mtu", str(opts.get("mtu", 1514))]
        return args
    if kind == "htb":
        known = {"r2q", "default", "direct_packets_stat", "direct_qlen", "offload"}
        if set(opts) - known:
            raise Unsupported(f"htb options {sorted(set(opts) - known)}")
        args = ["htb", "default", str(opts.get("default", "0"))]
        if "r2q" in opts:
            args += ["r2q", str(opts["r2q"])]
        if "direct_qlen" in opts:
            args += ["direct_qlen", str(opts["direct_qlen"])]
        return args
    if kind == "netem":
        known = {"limit", "delay", "loss-random", "duplicate", "reorder", "corrupt", "rate", "ecn", "gap"}
        if set(opts) - known:
            raise Unsupported(f"netem options {sorted(set(opts) - known)}")
        args = ["netem"]
        if "limit" in opts:
            args += ["limit", str(opts["limit"])]
        delay = opts.get("delay")
        if delay:
            args += ["delay", _us(delay.get("delay", 0.0))]
            if delay.get("jitter"):
                args.append(_us(delay["jitter"]))
                if delay.get("correlation"):
                    args.append(_pct(delay["correlation"]))
        for key, word in (
            ("loss-random", "loss"),
            ("duplicate", "duplicate"),
            ("reorder", "reorder"),
            ("corrupt", "corrupt"),
        ):
            section = opts.get(key)
            if section:
                value = section.get("loss" if key == "loss-random" else key, 0.0)
                args += [word, _pct(value)]
                if section.get("correlation"):
                    args.append(_pct(section["correlation"]))
        rate = opts.get("rate")
        if rate:
            if set(rate) - {"rate"}:
                raise Unsupported(f"netem rate options {sorted(rate)}")
            args += ["rate", "{}bit".format(int(rate["rate"]) * 8)]
        if opts.get("ecn"):
            args.append("ecn")
        if opts.get("gap"):
            args += ["gap", str(opts["gap"])]
        return args
    raise Unsupported(f"qdisc kind {kind}")


def _tick_in_usec() -> float | None:
    try:
        with open("/proc/net/psched", encoding="ascii") as handle:
            t2us, us2t = (int(x, 16) for x in handle.read().split()[:2])
        return t2us / us2t
    except (OSError, ValueError, ZeroDivisionError):
        return None


def exact_size(printed: int, rate: int, tick_in_usec: float | None) -> int:
    """A bucket size that tc stores so that it prints back as ``printed`` bytes at ``rate`` bytes/s.

    tc keeps a bucket as a transmission time in scheduler ticks, truncating twice on the way in
    (bytes -> us -> ticks) and once on the way out, so re-creating a class with the printed size
    can store a slightly smaller bucket. This replays tc's arithmetic (``tc_calc_xmittime`` /
    ``tc_calc_xmitsize``) to pick the smallest size that prints back the same.
    """
    if not tick_in_usec or not rate:
        return printed
    for size in range(printed, printed + 256):
        usec = int(1e6 * (size / rate))
        ticks = int(usec * tick_in_usec)
        back = int(rate * int(ticks / tick_in_usec) / 1e6)
        if back == printed:
            return size
        if back > printed:
            break
    return printed


def _major(handle: str) -> str:
    return handle.split(":", maxsplit=1)[0] + ":"


def restore_argv(tree: dict[str, Any], tc: str, netns: str, dev: str) -> list[list[str]]:
    """The argv that re-create ``tree`` after its root was deleted (empty for a default root)."""
    if is_default(tree):
        return []
    if tree.get("other_filters"):
        raise Unsupported("filters {}".format(tree["other_filters"]))
    for table in tree.get("tables", []):
        if table.get("fh") != "800:" or str(table.get("divisor", "1")) not in ("1", "None"):
            raise Unsupported("u32 hash table {}".format(table.get("fh")))
    pre = _prefix(tc, netns)
    ticks = _tick_in_usec()
    kinds = {q["handle"]: q["kind"] for q in tree["qdiscs"]}
    items = []
    for q in tree["qdiscs"]:
        where = ["root"] if q["parent"] == "root" else ["parent", q["parent"]]
        argv = [*pre, "qdisc", "add", "dev", dev, *where, "handle", q["handle"], *render_qdisc_options(q)]
        items.append((q["handle"], None if q["parent"] == "root" else q["parent"], argv))
    root_handle = next(q["handle"] for q in tree["qdiscs"] if q["parent"] == "root")
    for c in tree["classes"]:
        if c["kind"] in IMPLICIT_CLASS_KINDS and kinds.get(_major(c["classid"])) == c["kind"]:
            continue
        if c["kind"] != "htb":
            raise Unsupported("class kind {}".format(c["kind"]))
        parent = root_handle if c.get("parent", "root") == "root" else c["parent"]
        args = [
            "htb",
            "rate",
            "{}bit".format(c["rate"] * 8),
            "ceil",
            "{}bit".format(c.get("ceil", c["rate"]) * 8),
        ]
        if "burst" in c:
            args += ["burst", str(exact_size(c["burst"], c["rate"], ticks))]
        if "cburst" in c:
            args += ["cburst", str(exact_size(c["cburst"], c.get("ceil", c["rate"]), ticks))]
        if "prio" in c:
            args += ["prio", str(c["prio"])]
        if "quantum" in c:
            args += ["quantum", str(c["quantum"])]
        argv = [*pre, "class", "add", "dev", dev, "parent", parent, "classid", c["classid"], *args]
        items.append((c["classid"], parent, argv))
    for f in tree["filters"]:
        if f["extra"] or f.get("unparsed") or not f.get("flowid"):
            raise Unsupported("u32 filter {}".format(f.get("raw")))
        argv = [
            *pre,
            "filter",
            "add",
            "dev",
            dev,
            "parent",
            f["parent"],
            "protocol",
            f["protocol"],
            "prio",
            str(f["pref"]),
            "handle",
            f["fh"],
            "u32",
        ]
        for value, mask, off in f["keys"]:
            argv += ["match", "u32", f"0x{value:08x}", f"0x{mask:08x}", "at", str(off)]
        argv += ["flowid", f["flowid"]]
        items.append((None, f["parent"], argv))
    # Creation order: a parent (qdisc handle, class id, or a classful qdisc's implicit class)
    # before its children; filters last.
    created, ordered, pending = set(), [], list(items)
    while pending:
        progress = False
        for item in list(pending):
            ident, parent, argv = item
            ready = (
                parent is None
                or parent in created
                or (
                    parent.endswith(":") is False
                    and _major(parent) in created
                    and kinds.get(_major(parent)) in CLASSFUL_IMPLICIT
                )
            )
            if ident is None and any(p[0] is not None for p in pending):
                ready = False  # filters after every qdisc and class
            if ready:
                ordered.append(argv)
                if ident is not None:
                    created.add(ident)
                pending.remove(item)
                progress = True
        if not progress:
            raise Unsupported(f"tree with unresolved parents {[p[1] for p in pending]}")
    return ordered


def undo_records(
    tree: dict[str, Any], tc: str, netns: str, dev: str, dry_run: bool, log: str | None
) -> list[dict[str, Any]]:
    """Journal records (append order) whose newest-first replay restores ``tree``."""
    pre = _prefix(tc, netns)
    # Records restoring one prior tree are told apart from those restoring another (the journal
    # does not write a record identical to a pending one twice).
    digest = hashlib.sha256(json.dumps(tree, sort_keys=True).encode("utf-8")).hexdigest()[:16]

    def record(argv: list[str], step: int, ignore: bool = False) -> dict[str, Any]:
        undo: dict[str, Any] = {
            "argv": argv,
            "dry_run": dry_run,
            "log": log or "",
            "restores": f"{dev} {digest} {step}",
        }
        if ignore:
            undo["ignore_errors"] = True
        return {"op": "command", "undo": undo}

    recreate = restore_argv(tree, tc, netns, dev)
    delete = [*pre, "qdisc", "del", "dev", dev, "root"]
    # Replayed newest first: delete whatever root is there (it fails harmlessly when the default
    # is already back), then re-create the prior tree in creation order.
    records = [record(argv, step + 1) for step, argv in enumerate(recreate)]
    return [*reversed(records), record(delete, 0, ignore=True)]


# -- interfaces never shaped -----------------------------------------------------------------------


def default_route_interfaces(netns: str) -> list[str]:
    ip = shutil.which("ip")
    if not ip:
        return []
    devs: list[str] = []
    for family in ("-4", "-6"):
        argv = [ip] + (["-n", netns] if netns else []) + [family, "-j", "route", "show", "default"]
        proc = _run(argv, check=False)
        try:
            devs += [r.get("dev") for r in json.loads(proc.stdout or "[]") if r.get("dev")]
        except ValueError:
            continue
    return sorted(set(devs))


# -- dry run ---------------------------------------------------------------------------------------


def state_path(log: str, dev: str, netns: str) -> str:
    return "{}.{}{}.state.json".format(log, netns + "." if netns else "", dev)


def read_state(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def simulated_tree(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The tree the kernel would report after ``objects`` (their expectations are what it reports)."""
    tree: dict[str, list[Any]] = {
        "qdiscs": [],
        "classes": [],
        "filters": [],
        "tables": [],
        "other_filters": [],
    }
    for obj in objects:
        item = json.loads(json.dumps(obj["expect"]))
        if obj["type"] == "qdisc":
            item.setdefault("options", {})
            item["options"] = {k: v for k, v in item["options"].items() if v is not None}
            tree["qdiscs"].append(item)
        elif obj["type"] == "class":
            tree["classes"].append(item)
        else:
            item.setdefault("fh", "800::{:x}".format(0x800 + len(tree["filters"])))
            item.setdefault("extra", [])
            tree["filters"].append(item)
    return tree


def append_log(path: str, argv: list[str], **extra: Any) -> None:
    record: dict[str, Any] = {"argv": argv, "t_mono_ns": time.monotonic_ns()}
    record.update(extra)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def _check_argv(argv: list[str], tc: str, dev: str) -> None:
    if not argv or os.path.basename(argv[0]) != os.path.basename(tc) or "dev" not in argv:
        raise TcError(f"refusing argv that is not a tc command on {dev}: {argv}")
    if argv[argv.index("dev") + 1] != dev:
        raise TcError(f"argv targets another interface than {dev}: {argv}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dev": {"type": "str", "required": True},
            "netns": {"type": "str", "default": ""},
            "objects": {"type": "list", "elements": "dict", "required": True},
            "dry_run": {"type": "bool", "default": False},
            "log": {"type": "path"},
            "protected_interfaces": {"type": "list", "elements": "str", "default": []},
            "tc": {"type": "str", "default": "tc"},
            "_dit_plan": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    dev, netns, dry_run, tc = p["dev"], p["netns"] or "", p["dry_run"], p["tc"]
    objects = p["objects"]
    if dry_run and not p["log"]:
        module.fail_json(msg="dit_tc: log is required with dry_run")
    protected = sorted({i for i in p["protected_interfaces"] if i})
    routed = default_route_interfaces(netns)
    if dev in protected or dev in routed:
        module.fail_json(
            msg="dit_tc: refusing to shape {}: it is the management interface ({}); dit shapes only the "
            "inference interface".format(dev, "default route" if dev in routed else "protected"),
            protected=protected,
            default_route=routed,
        )
    try:
        for obj in objects:
            for key in ("argv", "change_argv"):
                if obj.get(key):
                    _check_argv(obj[key], tc, dev)
        state_file = state_path(p["log"], dev, netns) if dry_run else None
        state_text = read_state(state_file) if state_file else None
        note = None
        if state_text is not None:
            tree = json.loads(state_text)
        elif shutil.which(tc) is None and dry_run:
            tree, note = default_tree(), "tc not found here: prior tree assumed to be the kernel default"
        else:
            try:
                tree = read_tree(tc, netns, dev)
            except TcError as exc:
                if not dry_run:
                    raise
                tree, note = default_tree(), f"{exc}: prior tree assumed to be the kernel default"
        present, differing, same_structure = compare(objects, tree)
        if present:
            commands = []
        elif same_structure:
            commands = [obj["change_argv"] for obj in differing]
        else:
            commands = []
            if not is_default(tree):
                commands.append([*_prefix(tc, netns), "qdisc", "del", "dev", dev, "root"])
            commands += [obj["argv"] for obj in objects]
        diff = {"before": describe(tree), "after": describe(simulated_tree(objects))}
        result = {"changed": bool(commands), "commands": commands, "prior": tree, "diff": diff}
        if note:
            result["note"] = note
        if p["_dit_plan"] or module.check_mode:
            journal = []
            if commands:
                try:
                    journal = undo_records(tree, tc, netns, dev, dry_run, p["log"])
                except Unsupported as exc:
                    module.fail_json(
                        msg=f"dit_tc: {dev} carries a tree dit cannot restore exactly ({exc}); not touching it. "
                        "Remove it, or shape another interface",
                        prior=tree,
                    )
                if state_file:
                    journal.insert(0, {"op": "file", "undo": {"path": state_file, "prior": state_text}})
            result["journal"] = journal
            module.exit_json(**result)
        for argv in commands:
            if dry_run:
                append_log(p["log"], argv, source="dit_tc")
            else:
                _run(argv)
        if state_file is not None and commands:  # dry run
            with open(state_file + ".tmp", "w", encoding="utf-8") as handle:
                json.dump(simulated_tree(objects), handle, sort_keys=True)
            os.replace(state_file + ".tmp", state_file)
        module.exit_json(**result)
    except (TcError, ValueError, KeyError, OSError) as exc:
        module.fail_json(msg=f"dit_tc: {exc}")


if __name__ == "__main__":
    main()
