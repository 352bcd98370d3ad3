"""Facts recorded per node before a run changes anything (issue 6, part 5): the runtime venv's packages
and the hardware (board revision, CPU, SD card) read by library/dit_facts.py."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from tests.ansible_modules import library_module

REPO = Path(__file__).resolve().parents[2]


def _facts_module() -> ModuleType:
    return library_module("dit_facts", "dit_facts_under_test")


def _main(args: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """dit_facts' ``main`` with ``args``, in this process: the JSON it exits with."""
    facts = _facts_module()
    with patch_module_args(args), pytest.raises(SystemExit):
        facts.main()
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_the_links_are_pinged_in_the_same_module_call_as_the_facts_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Preflight's one module call per node: the facts and the unshaped ping baseline together."""
    got = _main(
        {"local_mode": True, "sysfs_root": str(tmp_path), "ping_count": 2,
         "ping_targets": [{"target": "edge", "address": "127.0.0.1"}]},
        capsys,
    )  # fmt: skip
    assert got["changed"] is False and "failed" not in got, got
    assert got["dit_facts"]["ntp"]["source"] == "local"
    (link,) = got["pings"]
    assert (link["target"], link["address"], link["sent"]) == ("edge", "127.0.0.1", 2)
    assert link["method"] in ("icmp", "none") and len(link["rtt_ns"]) == link["received"]
    without = _main({"local_mode": True, "sysfs_root": str(tmp_path)}, capsys)
    assert "pings" not in without and without["dit_facts"]["ntp"]["source"] == "local"
    refused = _main({"local_mode": True, "ping_targets": [{"target": "edge"}]}, capsys)
    assert refused["failed"] is True and refused["msg"] == "ping_targets[0]: no address"


def test_runtime_lists_every_package_of_the_interpreter_with_its_version() -> None:
    facts = _facts_module()
    runtime = facts._runtime(sys.executable)
    assert "error" not in runtime, runtime
    assert runtime["python"] == sys.version.split()[0]
    assert runtime["prefix"] == sys.prefix and runtime["python_executable"] == sys.executable
    assert runtime["packages"]["pytest"] == importlib.metadata.version("pytest")
    assert runtime["packages"]["PyYAML"] == importlib.metadata.version("PyYAML")
    broken = facts._runtime("/nonexistent/python")
    assert broken["python_executable"] == "/nonexistent/python" and "error" in broken


def test_sd_card_and_cpufreq_are_read_from_the_sysfs_root(tmp_path: Path) -> None:
    facts = _facts_module()
    device = tmp_path / "block/mmcblk0/device"
    device.mkdir(parents=True)
    for key, value in {
        "name": "SN32G",
        "serial": "0x1234abcd",
        "oemid": "0x5344",
        "manfid": "0x000003",
    }.items():
        (device / key).write_text(value + "\n")
    (device / "date").write_text("03/2023\n")
    (tmp_path / "block/mmcblk0/size").write_text("62333952\n")
    card = facts._sd_card(str(tmp_path))
    assert card == {
        "name": "SN32G",
        "serial": "0x1234abcd",
        "oemid": "0x5344",
        "manfid": "0x000003",
        "date": "03/2023",
        "size_bytes": 62333952 * 512,
    }
    assert facts._sd_card(str(tmp_path / "nothing")) is None
    assert facts._sys_dir("/") == "/sys" and facts._sys_dir(str(tmp_path)) == str(tmp_path)


def test_module_records_runtime_and_hardware_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sysfs = tmp_path / "sys"
    policy = sysfs / "devices/system/cpu/cpufreq/policy0"
    policy.mkdir(parents=True)
    (policy / "cpuinfo_max_freq").write_text("1800000\n")
    result = _main({"local_mode": True, "sysfs_root": str(sysfs), "runtime_python": sys.executable}, capsys)
    assert result["changed"] is False
    node = result["dit_facts"]
    assert node["cpu_max_khz"] == 1800000
    assert node["runtime"]["packages"]["pytest"] == importlib.metadata.version("pytest")
    for key in (
        "board_revision",
        "board_serial",
        "kernel",
        "kernel_build",
        "sd_card",
        "mem_total_bytes",
        "cpu_model",
    ):
        assert key in node


def test_runtime_facts_option_is_documented_and_read_as_json(tmp_path: Path) -> None:
    facts = _facts_module()
    assert "runtime_facts" in facts.DOCUMENTATION and "runtime_facts" in facts.RETURN
    (tmp_path / "r.json").write_text(json.dumps({"wall_s": 1.5}))
    assert facts._runtime_fact(str(tmp_path / "r.json")) == {
        "path": str(tmp_path / "r.json"),
        "content": {"wall_s": 1.5},
    }
    (tmp_path / "big.json").write_bytes(b" " * (facts.RUNTIME_FACT_MAX_BYTES + 1))
    assert facts._runtime_fact(str(tmp_path / "big.json"))["error"].startswith("larger than")
    assert facts._runtime_fact(str(tmp_path / "none.json"))["error"] == "No such file or directory"
    (tmp_path / "bad.json").write_text("{not json")
    assert facts._runtime_fact(str(tmp_path / "bad.json"))["error"].startswith("not JSON")
    assert facts._runtime_fact("build.json") == {"path": "build.json", "error": "not an absolute path"}


def test_nfqueue_needs_the_kernel_queue_and_iptables(tmp_path: Path, monkeypatch: Any) -> None:
    facts = _facts_module()
    proc = tmp_path / "nfnetlink_queue"
    monkeypatch.setattr(facts, "_kernel_config", lambda release: "CONFIG_NETFILTER_NETLINK_QUEUE=n\n")
    missing = facts._nfqueue("0-test", str(tmp_path / "absent"), str(tmp_path))
    assert missing["available"] is False and "no nfnetlink_queue" in missing["reason"]
    proc.write_text("")
    monkeypatch.setattr(facts.shutil, "which", lambda name: "/usr/sbin/iptables")
    monkeypatch.setattr(facts.os, "geteuid", lambda: 0)
    found = facts._nfqueue("0-test", str(proc), str(tmp_path))
    assert found == {"available": True, "source": "nfnetlink_queue loaded", "iptables": "/usr/sbin/iptables"}
    # local mode as a user: iptables and the queue need CAP_NET_ADMIN, so auto records instead
    monkeypatch.setattr(facts.os, "geteuid", lambda: 1000)
    user = facts._nfqueue("0-test", str(proc), str(tmp_path))
    assert user["available"] is False and user["reason"].startswith("not root")
    monkeypatch.setattr(facts.shutil, "which", lambda name: None)
    monkeypatch.setattr(facts.os, "access", lambda path, mode: False)
    no_tool = facts._nfqueue("0-test", str(proc), str(tmp_path))
    assert no_tool["available"] is False and "iptables is not installed" in no_tool["reason"]


def test_the_lease_is_read_with_the_facts_after_the_same_directory_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Preflight reads the lease in the facts call, so dit_lease needs no plan call of its own; a lease
    directory another user could write is refused before the lease is read, as dit_lease refuses it."""
    leases = tmp_path / "dit"
    leases.mkdir(mode=0o755)
    path = leases / "lease.json"
    none = _main({"local_mode": True, "sysfs_root": str(tmp_path), "lease_path": str(path)}, capsys)
    assert "failed" not in none and none["lease"] is None, none
    path.write_text('{"run_id": "other"}')
    held = _main({"local_mode": True, "sysfs_root": str(tmp_path), "lease_path": str(path)}, capsys)
    assert held["lease"] == '{"run_id": "other"}' and held["changed"] is False
    assert "lease" not in _main({"local_mode": True, "sysfs_root": str(tmp_path)}, capsys)
    leases.chmod(0o777)
    refused = _main({"local_mode": True, "sysfs_root": str(tmp_path), "lease_path": str(path)}, capsys)
    assert refused["failed"] is True and str(leases) in refused["msg"] and "lease" not in refused
