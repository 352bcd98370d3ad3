"""Facts recorded per node before a run changes anything (issue 6, part 5): the runtime venv's packages
and the hardware (board revision, CPU, SD card) read by library/dit_facts.py."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _facts_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dit_facts_under_test", REPO / "library" / "dit_facts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_module_records_runtime_and_hardware_facts(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    sysfs = tmp_path / "sys"
    policy = sysfs / "devices/system/cpu/cpufreq/policy0"
    policy.mkdir(parents=True)
    (policy / "cpuinfo_max_freq").write_text("1800000\n")
    args.write_text(
        json.dumps(
            {
                "ANSIBLE_MODULE_ARGS": {
                    "local_mode": True,
                    "sysfs_root": str(sysfs),
                    "runtime_python": sys.executable,
                }
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, str(REPO / "library" / "dit_facts.py"), str(args)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout)
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
