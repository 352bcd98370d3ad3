"""aggregate_network on a hand-assembled run; the netem fact of dit_facts; the gate's dry-run hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dit.conditions.netem.check import aggregate_network
from dit.conditions.netem.tc import netem_gate
from tests.ansible_modules import library_module

REPO = Path(__file__).resolve().parents[2]


def write_run(run: Path) -> None:
    scenario = {
        "name": "n",
        "devices": ["device1", "device2", "device3"],
        "network": {
            "device1": {"delay_ms": 20, "destinations": {"edge": {"delay_ms": 35}}},
            "device2": {
                "delay_ms": 5,
                "variation": {"kind": "square", "low_ms": 10, "high_ms": 30, "period_s": 2},
                "destinations": {"10.0.0.0/8": {"delay_ms": 50}},
            },
        },
    }
    (run / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    (run / "metadata.json").write_text(
        json.dumps({"mode": "inventory", "conditions": {"device1": {"netem": {"netem_dry_run": False}}}})
    )
    for device, rtts, address in (
        ("device1", [36_000_000, 37_000_000, 35_500_000], "192.168.50.1"),
        ("device2", [21_000_000, 19_000_000], "192.168.50.1"),
        ("device3", [1_000_000], "192.168.50.1"),
    ):
        raw = run / "raw" / device
        raw.mkdir(parents=True)
        ping = {"target": "edge", "address": address, "rtt_ns": rtts, "sent": 10, "received": len(rtts)}
        (raw / f"{device}_ping.json").write_text(json.dumps(ping))
        (raw / f"{device}_origin.json").write_text(json.dumps({"origin_mono_ns": 1_000_000_000}))
    baseline = {"target": "edge", "rtt_ns": [1_500_000, 2_500_000]}
    (run / "raw" / "device1" / "device1_ping_baseline.json").write_text(json.dumps(baseline))
    (run / "raw" / "device2" / "device2_netem_changes.csv").write_text(
        "step,t_mono_ns,delay_ms,ok,dry_run,error\n"
        "0,900000000,10,1,0,\n"
        "1,1900000000,30,1,0,\n"
        "2,2900000000,10,0,0,RTNETLINK answers: No such file or directory\n"
    )


def test_self_check_and_changes_on_the_origin(tmp_path: Path) -> None:
    write_run(tmp_path)
    summary = aggregate_network(tmp_path)
    assert (summary.check_rows, summary.change_rows) == (2, 3)
    check = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv").set_index("device")
    one = check.loc["device1"]
    # The edge has its own destination profile: 35 ms intended; measured 36.167, baseline 2.0.
    assert one["intended_delay_ms"] == 35 and one["shaping"] == "applied" and one["pings"] == 3
    assert one["measured_rtt_ms"] == pytest.approx(36.1666667)
    assert one["baseline_rtt_ms"] == pytest.approx(2.0)
    assert one["difference_ms"] == pytest.approx(36.1666667 - 2.0 - 35)
    two = check.loc["device2"]
    # 192.168.50.1 is outside 10.0.0.0/8: the main, square-varying profile, mean of low and high.
    assert two["intended_delay_ms"] == 20 and two["variation"] == "square"
    assert pd.isna(two["baseline_rtt_ms"]) and two["difference_ms"] == pytest.approx(0.0)
    assert two["shaping"] == "none"
    changes = pd.read_csv(tmp_path / "aggregate" / "netem_changes.csv")
    assert list(changes["t_ns"]) == [-100_000_000, 900_000_000, 1_900_000_000]
    assert list(changes["delay_ms"]) == [10, 30, 10] and list(changes["ok"]) == [1, 1, 0]


def test_the_netem_fact_reads_without_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    facts = library_module("dit_facts", "dit_facts_module")  # its module_utils imports resolved
    sys_module, modules = tmp_path / "sys", tmp_path / "lib"
    (sys_module / "sch_netem").mkdir(parents=True)
    assert facts._netem("6.1.0-rpi7", str(modules), str(sys_module)) == {
        "available": True,
        "source": "loaded",
    }
    (sys_module / "sch_netem").rmdir()
    base = modules / "6.1.0-rpi7"
    base.mkdir(parents=True)
    (base / "modules.dep").write_text("kernel/net/sched/sch_netem.ko.xz:\nkernel/net/sched/sch_tbf.ko.xz:\n")
    assert facts._netem("6.1.0-rpi7", str(modules), str(sys_module))["source"] == "module"
    (base / "modules.dep").write_text("kernel/net/sched/sch_tbf.ko.xz:\n")

    def netem(config: str | None, release: str = "6.1.0-rpi7") -> dict[str, object]:
        monkeypatch.setattr(facts, "_kernel_config", lambda _release: config)
        result: dict[str, object] = facts._netem(release, str(modules), str(sys_module))
        return result

    assert netem("CONFIG_NET_SCH_NETEM=y\n")["available"] is True
    assert netem("# CONFIG_NET_SCH_NETEM is not set\n") == {
        "available": False,
        "reason": "CONFIG_NET_SCH_NETEM is not set in the kernel config",
    }
    assert "install the kernel's extra modules" in str(netem("CONFIG_NET_SCH_NETEM=m\n")["reason"])
    assert netem(None)["available"] is False  # a module tree without it
    assert netem(None, "other-release")["available"] is None  # nothing tells


def test_the_gate_passes_devices_that_only_record() -> None:
    facts = {"device1": {"kernel": "k", "netem": {"available": False, "reason": "r"}}}
    network = {"device1": {"delay_ms": 5}}
    assert netem_gate(network, facts)
    assert netem_gate(network, facts, {"device1": {"dit_tc_dry_run": True}}) == []
    assert netem_gate(network, {"device1": {"netem": {"available": None}}}) == []


def write_links_run(run: Path, dry_run: bool = False) -> None:
    """Two shaped devices and an unshaped one, each pinging the edge and the other devices."""
    scenario = {
        "name": "links",
        "devices": ["device1", "device2", "device3"],
        "network": {
            "device1": {"delay_ms": 10},
            "device2": {"delay_ms": 4, "destinations": {"device1": {"delay_ms": 30}}},
        },
    }
    (run / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    conditions = {d: {"netem": {"netem_dry_run": dry_run}} for d in ("device1", "device2")}
    (run / "metadata.json").write_text(json.dumps({"mode": "inventory", "conditions": conditions}))
    addresses = {"edge": "10.1.0.1", "device1": "10.1.0.11", "device2": "10.1.0.12", "device3": "10.1.0.13"}
    measured = {  # mean RTTs in ms per link
        ("device1", "edge"): 10.6,
        ("device1", "device2"): 41.0,  # 10 out, 30 back (device2's destination profile for device1)
        ("device1", "device3"): 10.4,
        ("device2", "edge"): 4.5,
        ("device2", "device1"): 52.0,  # 30 out + 10 back = 40 intended: fails
        ("device2", "device3"): 4.5,
    }
    for device in scenario["devices"]:
        raw = run / "raw" / device
        raw.mkdir(parents=True)
        pings, base = [], []
        for target in ["edge", *(d for d in scenario["devices"] if d != device)]:
            ms = measured.get((device, target), 0.5)
            pings.append({"target": target, "address": addresses[target], "rtt_ns": [round(ms * 1e6)] * 10})
            base.append({"target": target, "address": addresses[target], "rtt_ns": [500_000] * 10})
        (raw / f"{device}_ping.json").write_text(json.dumps(pings))
        (raw / f"{device}_ping_baseline.json").write_text(json.dumps(base))


def test_every_link_is_checked_against_its_baseline_with_a_tolerance(tmp_path: Path) -> None:
    write_links_run(tmp_path)
    aggregate_network(tmp_path)
    check = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv")
    rows = {(r.device, r.target): r for r in check.itertuples(index=False)}
    assert sorted(rows) == [
        ("device1", "device2"),
        ("device1", "device3"),
        ("device1", "edge"),
        ("device2", "device1"),
        ("device2", "device3"),
        ("device2", "edge"),
    ]  # device3 has no network block: nothing intended to check
    d1_d2 = rows[("device1", "device2")]
    assert d1_d2.intended_delay_ms == 40 and d1_d2.baseline_rtt_ms == pytest.approx(0.5)
    assert d1_d2.difference_ms == pytest.approx(41.0 - 0.5 - 40)
    assert d1_d2.tolerance_ms == pytest.approx(4.0)
    frame = check.set_index(["device", "target"])
    assert frame.loc[("device1", "device2"), "pass"] == True  # noqa: E712 - a CSV boolean
    assert frame.loc[("device1", "edge"), "tolerance_ms"] == pytest.approx(1.0)  # 10 % of 10 ms < 1 ms
    assert frame.loc[("device1", "edge"), "pass"] == True  # noqa: E712
    assert frame.loc[("device2", "device1"), "intended_delay_ms"] == 40
    assert frame.loc[("device2", "device1"), "pass"] == False  # noqa: E712 - 11.5 ms off, tolerance 4 ms
    assert frame.loc[("device2", "device3"), "intended_delay_ms"] == 4


def test_a_recorded_tree_neither_passes_nor_fails(tmp_path: Path) -> None:
    write_links_run(tmp_path, dry_run=True)
    aggregate_network(tmp_path)
    check = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv")
    assert set(check["shaping"]) == {"recorded"} and check["pass"].isna().all()


def test_the_tolerance_of_a_varying_delay_covers_half_its_range() -> None:
    from dit.conditions.netem.check import tolerance_ms

    assert tolerance_ms({}, 5.0) == 1.0
    assert tolerance_ms({}, 50.0) == pytest.approx(5.0)
    square = {"variation": {"kind": "square", "low_ms": 10, "high_ms": 30}}
    assert tolerance_ms(square, 20.0) == pytest.approx(10.0)


def test_link_targets_name_the_edge_then_the_other_devices() -> None:
    from dit.run.collect import link_targets

    addresses = {"edge": "10.0.0.1", "device1": "10.0.0.11", "device2": "10.0.0.12"}
    assert link_targets(("device1", "device2"), addresses, "edge") == {
        "device1": [{"target": "edge", "address": "10.0.0.1"}, {"target": "device2", "address": "10.0.0.12"}],
        "device2": [{"target": "edge", "address": "10.0.0.1"}, {"target": "device1", "address": "10.0.0.11"}],
    }


def test_a_device_with_its_own_source_address_pings_from_it() -> None:
    """Local mode: a device's pings leave from its own loopback address, which its network
    condition's rules select, so the measured RTT carries its delay."""
    from dit.run.collect import link_targets
    from tests.ansible_modules import module_util

    addresses = {"edge": "127.0.0.1", "device1": "127.0.0.1", "device2": "127.0.0.1"}
    targets = link_targets(("device1", "device2"), addresses, "edge", {"device1": "127.7.7.2"})
    assert targets["device1"][0] == {"target": "edge", "address": "127.0.0.1", "source": "127.7.7.2"}
    assert targets["device2"] == [
        {"target": "edge", "address": "127.0.0.1"},
        {"target": "device1", "address": "127.7.7.2"},  # at its own address: not the edge's rule
    ]
    (record,) = module_util("dit_ping").ping_all(targets["device1"][:1], 1)
    assert record["source"] == "127.7.7.2"
    if record["method"] == "icmp":
        assert record["argv"][-3:] == ["-I", "127.7.7.2", "127.0.0.1"] and record["received"] == 1


def test_ping_all_pings_every_target_at_once_in_order() -> None:
    from tests.ansible_modules import module_util

    ping = module_util("dit_ping")
    records = ping.ping_all(
        [{"target": "edge", "address": "127.0.0.1"}, {"target": "device2", "address": "127.0.0.1"}], 2
    )
    assert [r["target"] for r in records] == ["edge", "device2"]
    for record in records:
        assert record["sent"] == 2 and record["address"] == "127.0.0.1"
        if record["method"] == "icmp":
            assert record["received"] == 2 and all(isinstance(v, int) and v > 0 for v in record["rtt_ns"])


def iperf3_doc(mbit: float) -> str:
    return json.dumps({"end": {"sum_received": {"bits_per_second": mbit * 1e6}}})


def test_device_to_device_throughput_is_recorded_per_link(tmp_path: Path) -> None:
    from dit.analysis.links import device_link_rows

    write_links_run(tmp_path)
    raw = tmp_path / "raw" / "device1"
    (raw / "device1_iperf3.json").write_text(iperf3_doc(90.0))
    (raw / "device1_iperf3_device2.json").write_text(iperf3_doc(42.5))
    (raw / "device1_iperf3_device3.json").write_text(json.dumps({"error": "unable to connect"}))
    aggregate_network(tmp_path)
    check = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv").set_index(["device", "target"])
    assert check.loc[("device1", "edge"), "throughput_mbit"] == pytest.approx(90.0)
    assert check.loc[("device1", "device2"), "throughput_mbit"] == pytest.approx(42.5)
    assert pd.isna(check.loc[("device1", "device3"), "throughput_mbit"])  # iperf3 failed: no figure
    assert pd.isna(check.loc[("device2", "device1"), "throughput_mbit"])  # not measured

    scenario = yaml.safe_load((tmp_path / "scenario.yaml").read_text())
    rows, source = device_link_rows(tmp_path, scenario, "device1", None)
    links = {r["target"]: (r["rate_bps"], r["rate_source"]) for r in rows}
    assert source == "iperf3"
    assert links["device2"] == (pytest.approx(42.5e6), "iperf3")
    assert links["edge"] == (pytest.approx(90e6), "iperf3")
    # a failed device-to-device test falls back to the device's own link rate
    assert links["device3"] == (pytest.approx(90e6), "iperf3")
    rows, source = device_link_rows(tmp_path, scenario, "device2", None)
    assert source == "default" and {r["rate_source"] for r in rows} == {"default"}


def test_iperf3_device_links_give_each_target_one_server_port() -> None:
    from dit.run.collect import IPERF3_D2D_PORT_OFFSET, iperf3_device_links

    addresses = {"edge": "10.0.0.1", "device1": "10.0.0.11", "device2": "10.0.0.12", "device3": "10.0.0.13"}
    clients, servers = iperf3_device_links(
        ["device3", "device1"], ["device1", "device2", "device3"], addresses
    )
    off = IPERF3_D2D_PORT_OFFSET
    assert clients == {
        "device1": [
            {"target": "device2", "address": "10.0.0.12", "port_offset": off + 1},
            {"target": "device3", "address": "10.0.0.13", "port_offset": off + 2},
        ],
        "device3": [
            {"target": "device1", "address": "10.0.0.11", "port_offset": off},
            {"target": "device2", "address": "10.0.0.12", "port_offset": off + 1},
        ],
    }
    assert servers == {
        "device1": {"address": "10.0.0.11", "port_offset": off},
        "device2": {"address": "10.0.0.12", "port_offset": off + 1},
        "device3": {"address": "10.0.0.13", "port_offset": off + 2},
    }
    assert iperf3_device_links([], ["device1", "device2"], addresses) == ({}, {})


def test_a_userspace_link_is_checked_and_a_dead_emulator_fails_it(tmp_path: Path) -> None:
    write_run(tmp_path)
    conditions = {
        "device1": {"netem": {"netem_dry_run": False, "netem_backend": "userspace"}},
        "device2": {"netem": {"netem_dry_run": False, "netem_backend": "netem"}},
    }
    (tmp_path / "metadata.json").write_text(json.dumps({"mode": "inventory", "conditions": conditions}))
    stats = {"realtime": {"sched_fifo": 20}, "socket_overflows": 0, "kernel": {"4112": {"queue_dropped": 0}}}
    emulator_file = tmp_path / "raw" / "device1" / "device1_link_emulator.json"
    emulator_file.write_text(json.dumps(stats))
    aggregate_network(tmp_path)
    check = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv").set_index("device")
    one = check.loc["device1"]
    assert (one["backend"], one["shaping"], one["emulator"], bool(one["pass"])) == (
        "userspace",
        "applied",
        "ok",
        True,
    )
    assert check.loc["device2"]["backend"] == "netem" and pd.isna(check.loc["device2"]["emulator"])
    emulator_file.unlink()  # killed before teardown: no stats, its link dropped traffic
    aggregate_network(tmp_path)
    one = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv").set_index("device").loc["device1"]
    assert str(one["emulator"]).startswith("dead") and not bool(one["pass"])
    emulator_file.write_text(
        json.dumps(stats)
    )  # a snapshot from collect, but the process check found it dead
    processes = [{"tag": "link-emulator", "failed": True, "state": "exited", "exit_code": -9}]
    processes_file = tmp_path / "raw" / "device1" / "device1_processes.json"
    processes_file.write_text(json.dumps(processes))
    aggregate_network(tmp_path)
    one = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv").set_index("device").loc["device1"]
    assert str(one["emulator"]).startswith("dead: the collect stage found it exited") and not bool(
        one["pass"]
    )
    processes_file.unlink()
    stats["kernel"] = {"4112": {"queue_dropped": 7, "user_dropped": 1}}
    emulator_file.write_text(json.dumps(stats))
    aggregate_network(tmp_path)
    one = pd.read_csv(tmp_path / "aggregate" / "netem_check.csv").set_index("device").loc["device1"]
    assert str(one["emulator"]).startswith("overflow: 8 packets") and not bool(one["pass"])


def test_dit_show_names_the_backend_and_the_verdict_of_every_link(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dit.cli import app
    from dit.run.rundir import STATUS, write_json

    run = tmp_path / "20260101T000000Z-aa"
    (run / "aggregate").mkdir(parents=True)
    write_json(run / STATUS, {"state": "done", "label": "n"})
    pd.DataFrame(
        [{"device": "device1", "target": "edge", "backend": "userspace", "shaping": "applied",
          "intended_delay_ms": 20.0, "measured_rtt_ms": 20.4, "baseline_rtt_ms": 0.1, "pass": True,
          "emulator": "ok"}]
    ).to_csv(run / "aggregate" / "netem_check.csv", index=False)  # fmt: skip
    result = CliRunner().invoke(app, ["show", str(run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "network self-check" in result.output
    assert "userspace" in result.output and "20.00 ms" in result.output and "20.30 ms" in result.output
