"""library/dit_tc.py: parsing tc output, comparing trees, undo records, dry-run runs of the module."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dit.conditions.netem.tc import build_tree

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dit_tc_module", REPO / "library" / "dit_tc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tcm = _load()

# What iproute2 6.1 prints for an htb tree with a u32 filter (captured on this machine).
CLASSES = """\
class htb 1:11 parent 1:1 leaf 11: prio 0 quantum 62500 rate 5Mbit ceil 6Mbit linklayer ethernet burst 15Kb/1 mpu 0b cburst 1599b/1 mpu 0b level 0
class htb 1:1 root rate 7Mbit ceil 7Mbit linklayer ethernet burst 1598b/1 mpu 0b cburst 1598b/1 mpu 0b level 7
class tbf 2:1 parent 2: leaf 10:
"""  # noqa: E501
FILTERS = """\
filter protocol ip pref 3 u32 chain 0
filter protocol ip pref 3 u32 chain 0 fh 800: ht divisor 1
filter protocol ip pref 3 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:11 not_in_hw
  match 0ac90000/ffffff00 at 16
  match 00060000/00ff0000 at 8
filter protocol ip pref 3 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 *flowid 1:1 not_in_hw
  match 0a090000/ffff0000 at 16
"""


def htb_tree() -> dict[str, Any]:
    qdiscs = tcm.normalise_qdiscs(
        [
            {"kind": "htb", "handle": "1:", "root": True, "refcnt": 3,
             "options": {"r2q": 10, "default": "0x1", "direct_packets_stat": 0, "direct_qlen": 1000}},
            {"kind": "pfifo", "handle": "11:", "parent": "1:11", "options": {"limit": 33}},
            {"kind": "ingress", "handle": "ffff:", "parent": "ffff:fff1", "options": {}},
        ]
    )  # fmt: skip
    nodes, tables, others = tcm.parse_filters(FILTERS)
    for node in nodes:
        node["parent"] = node["parent"] or "1:"
    classes = [c for c in tcm.parse_classes(CLASSES) if c["kind"] == "htb"]
    return {"qdiscs": qdiscs, "classes": classes, "filters": nodes, "tables": tables, "other_filters": others}


def test_parsing_tc_output() -> None:
    classes = tcm.parse_classes(CLASSES)
    assert classes[0] | {"raw": ""} == {
        "kind": "htb", "classid": "1:11", "raw": "", "parent": "1:1", "leaf": "11:", "prio": 0,
        "quantum": 62500, "rate": 625_000, "ceil": 750_000, "burst": 15 * 1024, "cburst": 1599, "level": 0,
        "extra": {"linklayer": "ethernet", "mpu": "0b"},
    }  # fmt: skip
    assert classes[1]["parent"] == "root" and classes[1]["rate"] == 875_000
    assert classes[2] == {
        "kind": "tbf",
        "classid": "2:1",
        "raw": classes[2]["raw"],
        "parent": "2:",
        "leaf": "10:",
    }
    nodes, tables, others = tcm.parse_filters(FILTERS)
    assert tables == [{"fh": "800:", "divisor": "1"}] and others == []
    assert [(n["pref"], n["fh"], n["flowid"], n["keys"]) for n in nodes] == [
        (3, "800::800", "1:11", [[0x0AC90000, 0xFFFFFF00, 16], [0x00060000, 0x00FF0000, 8]]),
        (3, "800::801", "1:1", [[0x0A090000, 0xFFFF0000, 16]]),
    ]
    assert tcm.parse_rate("10Gbit") == 1_250_000_000 and tcm.parse_rate("800bit") == 100
    assert tcm.parse_size("15Kb") == 15360 and tcm.parse_size("1600b/1") == 1600


def test_a_prior_htb_tree_is_recreated_parents_first_with_exact_buckets() -> None:
    argv = [" ".join(a) for a in tcm.restore_argv(htb_tree(), "tc", "", "wlan0")]
    tick = tcm._tick_in_usec()
    burst_1598 = tcm.exact_size(1598, 875_000, tick)
    assert argv == [
        "tc qdisc add dev wlan0 root handle 1: htb default 0x1 r2q 10 direct_qlen 1000",
        f"tc class add dev wlan0 parent 1: classid 1:1 htb rate 7000000bit ceil 7000000bit burst {burst_1598} "
        f"cburst {burst_1598}",
        f"tc class add dev wlan0 parent 1:1 classid 1:11 htb rate 5000000bit ceil 6000000bit burst "
        f"{tcm.exact_size(15360, 625_000, tick)} cburst {tcm.exact_size(1599, 750_000, tick)} prio 0 quantum 62500",
        "tc qdisc add dev wlan0 parent 1:11 handle 11: pfifo limit 33",
        "tc filter add dev wlan0 parent 1: protocol ip prio 3 handle 800::800 u32 match u32 0x0ac90000 0xffffff00 "
        "at 16 match u32 0x00060000 0x00ff0000 at 8 flowid 1:11",
        "tc filter add dev wlan0 parent 1: protocol ip prio 3 handle 800::801 u32 match u32 0x0a090000 0xffff0000 "
        "at 16 flowid 1:1",
    ]


def test_exact_size_replays_tc_tick_rounding() -> None:
    # With this machine's 15.625 ticks/us, 1598 bytes at 7 Mbit/s would come back as 1596 bytes;
    # 1600 comes back as 1598.
    assert tcm.exact_size(1598, 875_000, 15.625) == 1600
    assert tcm.exact_size(12500, 1_250_000, 15.625) == 12500
    assert tcm.exact_size(1598, 875_000, None) == 1598


def test_undo_records_delete_then_recreate_when_replayed_newest_first() -> None:
    default = tcm.default_tree()
    (only,) = tcm.undo_records(default, "tc", "", "wlan0", False, None)
    assert only["op"] == "command"
    assert only["undo"]["argv"] == ["tc", "qdisc", "del", "dev", "wlan0", "root"]
    assert only["undo"]["ignore_errors"] is True
    records = tcm.undo_records(htb_tree(), "tc", "ns1", "wlan0", True, "/tmp/tc.jsonl")
    replay = [r["undo"]["argv"] for r in reversed(records)]  # dit_restore's order
    assert replay[0] == ["tc", "-n", "ns1", "qdisc", "del", "dev", "wlan0", "root"]
    assert replay[1][:8] == ["tc", "-n", "ns1", "qdisc", "add", "dev", "wlan0", "root"]
    assert all(r["undo"]["dry_run"] is True and r["undo"]["log"] == "/tmp/tc.jsonl" for r in records)
    assert len({r["undo"]["restores"] for r in records}) == len(records)


def test_a_prior_tree_dit_cannot_restore_is_refused() -> None:
    tree = tcm.default_tree()
    tree["qdiscs"] = [{"kind": "cake", "handle": "8001:", "parent": "root", "options": {"bandwidth": 1}}]
    with pytest.raises(tcm.Unsupported, match="qdisc kind cake"):
        tcm.restore_argv(tree, "tc", "", "wlan0")
    tree = htb_tree()
    tree["other_filters"] = ["filter protocol all pref 1 matchall chain 0"]
    with pytest.raises(tcm.Unsupported, match="filters"):
        tcm.restore_argv(tree, "tc", "", "wlan0")


def _objects(block: dict[str, Any], dev: str = "wlan0", **kw: Any) -> list[dict[str, Any]]:
    shaping = build_tree(block, dev, device="device1", **kw)
    assert shaping is not None
    return [o.to_dict() for o in shaping.objects]


def test_compare_present_change_only_and_rebuild() -> None:
    objects = _objects({"delay_ms": 20, "jitter_ms": 5, "rate_mbit": 10})
    shaped = tcm.simulated_tree(objects)
    assert tcm.compare(objects, shaped)[0]  # present: nothing to do
    # The kernel reports netem times in seconds with tick rounding: still present.
    shaped["qdiscs"][0]["options"]["delay"] = {"delay": 0.0200001, "jitter": 0.005, "correlation": 0}
    shaped["qdiscs"][0]["options"]["limit"] = 1000
    assert tcm.compare(objects, shaped)[0]
    # Another delay: the same structure, only the netem qdisc is changed in place.
    other = _objects({"delay_ms": 30, "jitter_ms": 5, "rate_mbit": 10})
    present, differing, same = tcm.compare(other, shaped)
    assert not present and same and [o["id"] for o in differing] == ["1:"]
    # Loss added where there was none: the expectation requires its absence, then its presence.
    lossy = _objects({"delay_ms": 20, "jitter_ms": 5, "rate_mbit": 10, "loss_pct": 1})
    assert [o["id"] for o in tcm.compare(lossy, shaped)[1]] == ["1:"]
    # A kernel default root, or a different tree: rebuild.
    assert tcm.compare(objects, tcm.default_tree()) == (False, objects, False)
    dest = _objects({"destinations": {"e": {"delay_ms": 5}}}, destinations={"e": "10.0.0.1"})
    assert not tcm.compare(dest, shaped)[2]
    assert tcm.compare(dest, tcm.simulated_tree(dest))[0]


def run_module(args: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [sys.executable, str(REPO / "library" / "dit_tc.py"), str(path)], capture_output=True, text=True
    )
    assert proc.stdout, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_dry_run_plans_records_and_is_idempotent(tmp_path: Path) -> None:
    log = tmp_path / "run.tc.jsonl"
    objects = _objects({"delay_ms": 20, "loss_pct": 1}, "lo")
    args = {"dev": "lo", "objects": objects, "dry_run": True, "log": str(log)}
    plan = run_module({**args, "_dit_plan": True}, tmp_path)
    assert plan.get("changed"), plan
    assert not log.exists()
    state_file = f"{log}.lo.state.json"
    assert plan["journal"][0] == {"op": "file", "undo": {"path": state_file, "prior": None}}
    (undo,) = [r["undo"] for r in plan["journal"][1:]]
    assert undo["argv"] == ["tc", "qdisc", "del", "dev", "lo", "root"] and undo["dry_run"] is True
    applied = run_module(args, tmp_path)
    assert applied["changed"] and applied["commands"] == [objects[0]["argv"]]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["argv"] for line in lines] == [["tc", "qdisc", "replace", "dev", "lo", "root", "handle", "1:",
                                                 "netem", "delay", "20ms", "loss", "1%"]]  # fmt: skip
    # The real lo is untouched.
    real = subprocess.run(["tc", "-j", "qdisc", "show", "dev", "lo"], capture_output=True, text=True)
    if real.returncode == 0:
        assert json.loads(real.stdout)[0]["kind"] != "netem"
    again = run_module({**args, "_dit_plan": True}, tmp_path)
    assert not again["changed"] and again["journal"] == []
    # A new delay changes the netem qdisc in place; its undo re-creates the recorded tree.
    changed = _objects({"delay_ms": 30, "loss_pct": 1}, "lo")
    plan2 = run_module({**args, "objects": changed, "_dit_plan": True}, tmp_path)
    assert plan2["commands"] == [changed[0]["change_argv"]]
    assert plan2["journal"][0]["undo"]["prior"] is not None


def test_the_module_refuses_protected_and_foreign_argv(tmp_path: Path) -> None:
    objects = _objects({"delay_ms": 20})
    res = run_module({"dev": "wlan0", "objects": objects, "protected_interfaces": ["wlan0"], "dry_run": True,
                      "log": str(tmp_path / "l")}, tmp_path)  # fmt: skip
    assert res["failed"] and "refusing to shape wlan0: it is the management interface" in res["msg"]
    bad = [{**objects[0], "argv": ["rm", "-rf", "/", "dev", "wlan0"]}]
    res = run_module({"dev": "wlan0", "objects": bad, "dry_run": True, "log": str(tmp_path / "l")}, tmp_path)
    assert res["failed"] and "not a tc command" in res["msg"]
    # The default-route interface is refused without being listed.
    routes = subprocess.run(["ip", "-4", "-j", "route", "show", "default"], capture_output=True, text=True)
    devs = [r["dev"] for r in json.loads(routes.stdout or "[]") if "dev" in r]
    if devs:
        objs = [o.to_dict() for o in build_tree({"delay_ms": 1}, devs[0], device="d").objects]  # type: ignore[union-attr]
        res = run_module(
            {"dev": devs[0], "objects": objs, "dry_run": True, "log": str(tmp_path / "l")}, tmp_path
        )
        assert res["failed"] and "(default route)" in res["msg"]
