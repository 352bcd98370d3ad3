#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read-only facts of a dit node for the run metadata and the preflight gates."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dit_facts
version_added: "0.1.0"
short_description: Read a node's kernel, CPU, memory, board and clock facts (changes nothing)
description:
  - Reads what the run metadata records per node before anything changes, and the clock offset
    the preflight NTP gate checks (from C(chronyc -c tracking) when chrony is installed).
  - In local mode every node shares one clock, so the offset is recorded as 0 with source C(local).
options:
  local_mode:
    description: Nodes are directories on the controller.
    type: bool
    default: false
  shared_clock:
    description:
      - The node runs on the controller's own clock (a network namespace or container on the controller),
        so its offset is 0 by construction and recorded with source C(shared).
    type: bool
    default: false
  sysfs_root:
    description: The directory standing for C(/sys) (a fake tree in local mode).
    type: path
    default: /sys
  runtime_python:
    description:
      - The interpreter of the node's runtime venv (C(dit_python)); the name and version of every package
        installed there is recorded (C(importlib.metadata), run isolated with C(-I)). Omitted, nothing is
        recorded.
    type: path
  runtime_env:
    description:
      - The venv of the scenario's external runtime (C(<runtimes dir>/<name>-<pin12>), installed by the
        C(runtime_env) role). Recorded as C(runtime_env) - whether it is installed, its interpreter, its
        stamp (name, pin, requirements SHA-256) and every package in it. Omitted, nothing is recorded.
    type: path
  checkpoints:
    description:
      - Checkpoint files of the runtime's scenario block; each one's SHA-256 and size is recorded as
        C(checkpoints) (or the error reading it). A relative path is relative to C(checkpoint_dir).
    type: list
    elements: str
    default: []
  checkpoint_dir:
    description: The directory relative checkpoint paths are resolved against.
    type: path
    default: /opt/dit/checkpoints
  runtime_facts:
    description:
      - Custom facts of the scenario's runtime (its C(node_facts)) - fact name to the absolute path of a
        JSON file on the node (for llamacpp-rpc, the C(build.json) of its build cache). Each one is
        recorded under C(runtime_facts) as C(path) and C(content), or C(path) and C(error) when the file
        is missing, unreadable, larger than 1 MiB or not JSON.
    type: dict
    default: {}
  ping_targets:
    description:
      - The node's links to ping before anything is shaped (the netem check's unshaped baseline), each
        C(target) (the other node's inventory name), C(address), optional C(tcp_port). They are pinged
        while the facts are read, in the same module call (preflight used to spend a second module call,
        C(dit_ping), on it). Returned as C(pings); empty, nothing is pinged.
    type: list
    elements: dict
    default: []
  ping_count:
    description: Echo requests per target of O(ping_targets).
    type: int
    default: 10
  lease_path:
    description:
      - The node's lease file (C(<dit directory>/lease.json)), read as C(dit_lease)'s plan mode reads it
        and returned as RV(lease), so that the C(dit_lease) task after this one decides on it without a
        module call of its own (C(dit_lease)'s C(seen)). Its directory, and every directory above it, must be
        root's and writable by no one else (the task fails, naming the directory, otherwise).
    type: path
extends_documentation_fragment:
  - dit.linux
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; it runs unchanged in check mode.
  diff_mode:
    support: none
    details: The module changes nothing.
author: The dit developers
"""

EXAMPLES = r"""
- name: Read node facts
  dit_facts:
    local_mode: "{{ dit_local_mode | default(false) }}"
    sysfs_root: "{{ sysfs_root | default('/sys') }}"
"""

RETURN = r"""
dit_facts:
  description: >-
    kernel, machine, cpu_model, cpu_count, mem_total_bytes, python, board_model, ntp {source, offset_ms},
    memory_controller (C(v2), C(v1) or C(disabled)) and memory_cgroup_root (where memory cgroups are created);
    cpu_controller and cpu_cgroup_root (the same for CPU quotas: the cpu controller with CFS bandwidth);
    hardware facts board_revision and board_serial (C(/proc/cpuinfo)), cpu_max_khz, kernel_build, sd_card
    (C(/sys/block/mmcblk0/device) name, serial, oemid, manfid, date, size_bytes, where readable), and
    runtime {python, prefix, packages {name: version}} of C(runtime_python);
    runtime_env {venv, installed, python, stamp, packages [{name, version}]} of C(runtime_env);
    checkpoints [{path, sha256, size} or {path, error}] of C(checkpoints);
    runtime_facts {name: {path, content} or {path, error}} of C(runtime_facts);
    netem {available (true, false or null when nothing tells), source or reason} for the netem preflight gate;
    nfqueue {available, source or reason, iptables} for the network condition's userspace backend.
  returned: always
  type: dict
lease:
  description: The content of O(lease_path) when this module read it (null when there is no lease).
  returned: when O(lease_path) is set
  type: str
pings:
  description: One link record per target of O(ping_targets) (target, address, method, sent, received, rtt_ns).
  returned: when O(ping_targets) is not empty
  type: list
  elements: dict
"""

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.dit_lease_file import check_directory, read_text
from ansible.module_utils.dit_ping import ping_all
from ansible.module_utils.dit_trusted import UntrustedPath


def _read(path: str, default: str = "") -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip("\x00\n ")
    except OSError:
        return default


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware"):
            return value.strip()
    return platform.processor()


def _ntp(local_mode: bool, shared_clock: bool = False) -> dict[str, Any]:
    if local_mode:
        return {"source": "local", "offset_ms": 0.0}
    if shared_clock:
        return {"source": "shared", "offset_ms": 0.0}
    chronyc = shutil.which("chronyc")
    if not chronyc:
        return {"source": "none", "offset_ms": None, "error": "chronyc not found"}
    try:
        proc = subprocess.run(
            [chronyc, "-c", "tracking"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"source": "none", "offset_ms": None, "error": str(exc)}
    fields = proc.stdout.strip().split(",")
    if proc.returncode != 0 or len(fields) < 5:
        return {"source": "none", "offset_ms": None, "error": (proc.stderr or proc.stdout).strip()}
    try:
        offset_s = float(fields[4])
    except ValueError:
        return {
            "source": "none",
            "offset_ms": None,
            "error": f"unparsable chronyc output: {proc.stdout.strip()}",
        }
    return {"source": "chrony", "reference": fields[1], "stratum": fields[2], "offset_ms": offset_s * 1000.0}


def _cpuinfo_field(name: str) -> str | None:
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def _sys_dir(sysfs_root: str) -> str:
    return "/sys" if sysfs_root in ("", "/") else sysfs_root


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def _sd_card(sys_dir: str) -> dict[str, Any] | None:
    """The SD card's CID fields (Raspberry Pi: mmcblk0), or None where there is none."""
    device = os.path.join(sys_dir, "block/mmcblk0/device")
    if not os.path.isdir(device):
        return None
    card: dict[str, Any] = {
        key: _read(os.path.join(device, key)) or None for key in ("name", "serial", "oemid", "manfid", "date")
    }
    sectors = _int_or_none(_read(os.path.join(sys_dir, "block/mmcblk0/size")))
    card["size_bytes"] = sectors * 512 if sectors is not None else None
    return card


RUNTIME_SCRIPT = (
    "import importlib.metadata as m, json, sys\n"
    "pkgs = {}\n"
    "for d in m.distributions():\n"
    "    pkgs.setdefault(d.metadata['Name'], d.version)\n"
    "print(json.dumps({'python': sys.version.split()[0], 'prefix': sys.prefix, 'packages': dict(sorted(pkgs.items()))}))\n"
)


def _runtime(python: str) -> dict[str, Any]:
    """Every package of the runtime venv, read by its own interpreter (isolated: no PYTHONPATH, no user site)."""
    try:
        proc = subprocess.run(
            [python, "-I", "-c", RUNTIME_SCRIPT], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"python_executable": python, "error": str(exc)}
    if proc.returncode != 0:
        return {"python_executable": python, "error": proc.stderr.strip()[-500:]}
    try:
        out: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        return {"python_executable": python, "error": f"unparsable output: {proc.stdout[:200]!r}"}
    out["python_executable"] = python
    return out


def _runtime_env(venv: str) -> dict[str, Any]:
    """An external runtime's venv: installed (its interpreter exists), its stamp and its packages."""
    python = os.path.join(venv, "bin", "python")
    out: dict[str, Any] = {"venv": venv, "installed": os.path.exists(python), "python": python}
    if not out["installed"]:
        return out
    out["stamp"] = _read(os.path.join(venv, ".dit-runtime")) or None
    found = _runtime(python)
    if "error" in found:
        out["error"] = found["error"]
        return out
    packages = found.get("packages") or {}
    out["packages"] = [{"name": name, "version": version} for name, version in sorted(packages.items())]
    return out


def _checkpoint(path: str, base: str) -> dict[str, Any]:
    full = path if os.path.isabs(path) else os.path.join(base, path)
    digest = hashlib.sha256()
    try:
        with open(full, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        size = os.path.getsize(full)
    except OSError as exc:
        return {"path": full, "error": exc.strerror or str(exc)}
    return {"path": full, "sha256": digest.hexdigest(), "size": size}


RUNTIME_FACT_MAX_BYTES = 1 << 20  # a build record or a stamp, not a data file


def _runtime_fact(path: str) -> dict[str, Any]:
    """A runtime's custom fact: the JSON content of ``path``, or why it cannot be read."""
    if not os.path.isabs(path):
        return {"path": path, "error": "not an absolute path"}
    try:
        with open(path, "rb") as handle:
            data = handle.read(RUNTIME_FACT_MAX_BYTES + 1)
    except OSError as exc:
        return {"path": path, "error": exc.strerror or str(exc)}
    if len(data) > RUNTIME_FACT_MAX_BYTES:
        return {"path": path, "error": f"larger than {RUNTIME_FACT_MAX_BYTES} bytes"}
    try:
        return {"path": path, "content": json.loads(data.decode("utf-8"))}
    except ValueError as exc:
        return {"path": path, "error": f"not JSON: {exc}"}


def _memory_controller(base: str = "/sys/fs/cgroup") -> dict[str, Any]:
    """The memory cgroup controller: v2 (in the unified root), v1 (its own hierarchy) or disabled."""
    if "memory" in _read(os.path.join(base, "cgroup.controllers")).split():
        return {"memory_controller": "v2", "memory_cgroup_root": base}
    v1 = os.path.join(base, "memory")
    if os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
        return {"memory_controller": "v1", "memory_cgroup_root": v1}
    return {"memory_controller": "disabled", "memory_cgroup_root": None}


def _cpu_controller(base: str = "/sys/fs/cgroup") -> dict[str, Any]:
    """The cpu cgroup controller with CFS bandwidth (quota): v2 (unified root), v1 (its hierarchy) or disabled."""
    if "cpu" in _read(os.path.join(base, "cgroup.controllers")).split():
        return {"cpu_controller": "v2", "cpu_cgroup_root": base}
    for name in ("cpu", "cpu,cpuacct"):
        v1 = os.path.join(base, name)
        if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
            return {"cpu_controller": "v1", "cpu_cgroup_root": v1}
    return {"cpu_controller": "disabled", "cpu_cgroup_root": None}


def _kernel_config(release: str) -> str | None:
    """The kernel's build configuration (C(/proc/config.gz), else C(/boot/config-<release>)), or None."""
    try:
        import gzip

        with gzip.open("/proc/config.gz", "rt", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        pass
    return _read(f"/boot/config-{release}") or None


def _netem(release: str, modules: str = "/lib/modules", sys_module: str = "/sys/module") -> dict[str, Any]:
    """Whether this kernel can run the netem qdisc, read without loading anything.

    C(available) is true (loaded, built in, or a module file exists), false (the kernel config
    leaves it out, or it is a module whose file is not installed), or None when nothing tells.
    """
    if os.path.isdir(os.path.join(sys_module, "sch_netem")):
        return {"available": True, "source": "loaded"}
    base = os.path.join(modules, release)
    if "/sch_netem.ko" in _read(os.path.join(base, "modules.builtin"), ""):
        return {"available": True, "source": "built-in"}
    if "/sch_netem.ko" in _read(os.path.join(base, "modules.dep"), ""):
        return {"available": True, "source": "module"}
    config = _kernel_config(release)
    setting = None
    for line in (config or "").splitlines():
        if line.startswith("CONFIG_NET_SCH_NETEM="):
            setting = line.split("=", 1)[1].strip()
        elif line.startswith("# CONFIG_NET_SCH_NETEM is not set"):
            setting = "n"
    if setting == "y":
        return {"available": True, "source": "built-in (kernel config)"}
    if setting == "n":
        return {"available": False, "reason": "CONFIG_NET_SCH_NETEM is not set in the kernel config"}
    if setting == "m":
        return {
            "available": False,
            "reason": f"sch_netem is a module but {base} does not list it (install the kernel's extra modules)",
        }
    if os.path.isdir(base):
        return {"available": False, "reason": f"no sch_netem in {base} and no kernel config to tell"}
    return {"available": None, "reason": "no module tree and no kernel config to tell"}


def _nfqueue(
    release: str, proc: str = "/proc/net/netfilter/nfnetlink_queue", sys_module: str = "/sys/module"
) -> dict[str, Any]:
    """Whether the network condition's userspace backend can run here: nfnetlink_queue in the kernel
    (its proc file, a loaded module, or the kernel config) and an C(iptables) program.
    """
    iptables = shutil.which("iptables") or next(
        (p for p in ("/usr/sbin/iptables", "/sbin/iptables") if os.access(p, os.X_OK)), None
    )
    kernel = None
    if os.path.exists(proc):
        kernel = "nfnetlink_queue loaded"
    elif os.path.isdir(os.path.join(sys_module, "nfnetlink_queue")):
        kernel = "nfnetlink_queue module loaded"
    else:
        for line in (_kernel_config(release) or "").splitlines():
            if line.startswith("CONFIG_NETFILTER_NETLINK_QUEUE=") and line.split("=", 1)[1].strip() in (
                "y",
                "m",
            ):
                kernel = "CONFIG_NETFILTER_NETLINK_QUEUE=" + line.split("=", 1)[1].strip()
    if kernel is None:
        return {"available": False, "iptables": iptables, "reason": "no nfnetlink_queue in this kernel"}
    if iptables is None:
        return {
            "available": False,
            "source": kernel,
            "reason": "iptables is not installed (provisioning installs it)",
        }
    if os.geteuid() != 0:
        # iptables and binding a queue need CAP_NET_ADMIN: a local-mode run as a user records instead
        return {
            "available": False,
            "source": kernel,
            "iptables": iptables,
            "reason": "not root (iptables and NFQUEUE need CAP_NET_ADMIN)",
        }
    return {"available": True, "source": kernel, "iptables": iptables}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "local_mode": {"type": "bool", "default": False},
            "shared_clock": {"type": "bool", "default": False},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "runtime_python": {"type": "path", "default": None},
            "runtime_env": {"type": "path", "default": None},
            "checkpoints": {"type": "list", "elements": "str", "default": []},
            "checkpoint_dir": {"type": "path", "default": "/opt/dit/checkpoints"},
            "runtime_facts": {"type": "dict", "default": {}},
            "ping_targets": {"type": "list", "elements": "dict", "default": []},
            "ping_count": {"type": "int", "default": 10},
            "lease_path": {"type": "path", "default": None},
        },
        supports_check_mode=True,
    )
    targets = module.params["ping_targets"]
    for index, item in enumerate(targets):
        if not item.get("address"):
            module.fail_json(msg=f"ping_targets[{index}]: no address")
    if targets and not 1 <= module.params["ping_count"] <= 1000:
        module.fail_json(msg="ping_count: {} is outside 1..1000".format(module.params["ping_count"]))
    extra: dict[str, Any] = {}
    if module.params["lease_path"]:
        try:  # before the lease is read, as dit_lease checks it: a lease another user put there decides nothing
            check_directory(module.params["lease_path"])
        except UntrustedPath as exc:
            module.fail_json(msg=str(exc))
        extra["lease"] = read_text(module.params["lease_path"])
    # The pings take count x 0.2 s of waiting: they run while the facts are read.
    pinged: list[list[dict[str, Any]]] = []
    pinger = threading.Thread(target=lambda: pinged.append(ping_all(targets, module.params["ping_count"])))
    if targets:
        pinger.start()
    mem = _meminfo()
    uname = platform.uname()
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "kernel": uname.release,
        "os": _read("/etc/os-release").split("\n")[0] if os.path.exists("/etc/os-release") else uname.system,
        "machine": uname.machine,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": mem.get("MemTotal"),
        "mem_available_bytes": mem.get("MemAvailable"),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "board_model": _read("/proc/device-tree/model") or None,
        "ntp": _ntp(module.params["local_mode"], module.params["shared_clock"]),
    }
    facts.update(_memory_controller())
    facts.update(_cpu_controller())
    facts["netem"] = _netem(uname.release)
    facts["nfqueue"] = _nfqueue(uname.release)
    sys_dir = _sys_dir(module.params["sysfs_root"])
    facts.update(
        {
            "board_revision": _cpuinfo_field("Revision"),
            "board_serial": _cpuinfo_field("Serial"),
            "cpu_max_khz": _int_or_none(
                _read(os.path.join(sys_dir, "devices/system/cpu/cpufreq/policy0/cpuinfo_max_freq"))
            ),
            "kernel_build": uname.version,
            "sd_card": _sd_card(sys_dir),
        }
    )
    if module.params["runtime_python"]:
        facts["runtime"] = _runtime(module.params["runtime_python"])
    if module.params["runtime_env"]:
        facts["runtime_env"] = _runtime_env(module.params["runtime_env"])
    if module.params["checkpoints"]:
        facts["checkpoints"] = [
            _checkpoint(p, module.params["checkpoint_dir"]) for p in module.params["checkpoints"]
        ]
    if module.params["runtime_facts"]:
        facts["runtime_facts"] = {
            str(name): _runtime_fact(str(path))
            for name, path in sorted(module.params["runtime_facts"].items())
        }
    if not targets:
        module.exit_json(changed=False, dit_facts=facts, **extra)
    pinger.join()
    module.exit_json(changed=False, dit_facts=facts, pings=pinged[0] if pinged else [], **extra)


if __name__ == "__main__":
    main()
