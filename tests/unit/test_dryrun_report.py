"""The dry-run report: what a check-mode result says it would change, as the user reads it."""

from __future__ import annotations

from typing import Any

from dit.run.ansible_exec import HostEvent
from dit.run.dryrun import DryRun, change_of


def event(action: str, result: dict[str, Any], task: str = "t") -> HostEvent:
    return HostEvent("device1", "ansible", "changed", task, action, result)


def test_sysfs_changes_read_as_path_before_after() -> None:
    diff = {"before": "/s/a: 600000\n/s/b: ondemand\n", "after": "/s/a: 1500000\n/s/b: performance\n"}
    change = change_of("apply", event("dit_sysfs", {"changed": True, "diff": diff}))
    assert change.kind == "sysfs"
    assert change.details == ("/s/a: 600000 -> 1500000", "/s/b: ondemand -> performance")


def test_looped_processes_list_every_item_that_would_start() -> None:
    items = [
        {"changed": True, "invocation": {"module_args": {"tag": "iperf3-a", "argv": ["iperf3", "-s"]}}},
        {"changed": False, "invocation": {"module_args": {"tag": "iperf3-b", "argv": ["iperf3", "-s"]}}},
        {"changed": True, "invocation": {"module_args": {"tag": "iperf3-c", "argv": ["iperf3", "-s"]}}},
    ]
    change = change_of("apply", event("ansible.legacy.dit_proc", {"changed": True, "results": items}))
    assert change.kind == "process"
    assert change.details == ("start 'iperf3-a': iperf3 -s", "start 'iperf3-c': iperf3 -s")


def test_tc_names_the_commands_and_whether_they_would_only_be_recorded() -> None:
    result = {
        "changed": True,
        "commands": [
            ["tc", "qdisc", "replace", "dev", "wlan0", "root", "handle", "1:", "netem", "delay", "5ms"]
        ],
        "diff": {"before": "qdisc noqueue 0: root {}\n", "after": "qdisc netem 1: root {}\n"},
        "invocation": {"module_args": {"dev": "wlan0", "dry_run": True}},
    }
    details = change_of("apply", event("dit_tc", result)).details
    assert details[0] == "tc qdisc replace dev wlan0 root handle 1: netem delay 5ms"
    assert "not run" in details[1]
    assert details[2:] == ("tree - qdisc noqueue 0: root {}", "tree + qdisc netem 1: root {}")


def test_the_userspace_backend_s_iptables_commands_are_listed() -> None:
    chain = "DIT-0123456789ab"
    result = {
        "changed": True,
        "commands": [["iptables", "-w", "-t", "mangle", "-N", chain], ["iptables", "-w", "-t", "mangle", "-I",
                     "POSTROUTING", "1", "-o", "wlan0", "-j", chain]],
        "diff": {"before": "\n", "after": f"-A {chain} -j NFQUEUE --queue-num 4112\n"},
    }  # fmt: skip
    change = change_of("apply", event("dit_nfqueue", result))
    assert change.kind == "iptables"
    assert change.details == (f"iptables -w -t mangle -N {chain}",
                              f"iptables -w -t mangle -I POSTROUTING 1 -o wlan0 -j {chain}")  # fmt: skip


def test_render_shortens_the_node_run_directory_and_says_when_nothing_changes() -> None:
    run = "/var/lib/dit/quickstart-x"
    report = DryRun("quickstart", "inventory", ["edge", "device1"], node_dirs={"edge": run})
    report.changes["edge"] = [
        change_of(
            "apply",
            event(
                "dit_proc",
                {"invocation": {"module_args": {"tag": "edge", "argv": ["py", f"{run}/dit-device.pyz"]}}},
            ),
        )
    ]
    text = report.render()
    assert "edge: 1 change(s) would be made" in text and f"($RUN = {run})" in text
    assert "start 'edge': py $RUN/dit-device.pyz" in text
    assert "device1: no change" in text
    assert report.to_json()["nodes"][1] == {"host": "device1", "node_dir": None, "changes": [], "notes": []}
