"""``dit rack up`` / ``status`` / ``down``: run the plan of :mod:`dit.rack.plan` on this machine.

Every step is appended to ``<state dir>/journal.jsonl`` (the run journal's format,
:mod:`dit.journal`) *before* it is taken, so ``rack down`` undoes everything newest first even
after ``rack up`` was killed half-way; undoing a step that never happened is harmless.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dit.journal import Journal
from dit.localmode import make_fake_sysfs
from dit.rack.plan import (
    DEFAULT_SUBNET,
    SSHD,
    CgroupLayout,
    Node,
    RackError,
    RackSpec,
    Step,
    cgroup_steps,
    client_key,
    inventory_yaml,
    keys_dir,
    known_hosts,
    network_steps,
    node_dir,
    nodes,
    process_cgroup,
    procs_files,
    sshd_argv,
    sshd_config,
)

JOURNAL = "journal.jsonl"
STATE = "rack.json"
INVENTORY = "inventory.yml"
SOURCE = "dit rack"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SSHD_PRIVSEP = Path("/run/sshd")


def journal_of(state_dir: Path) -> Journal:
    return Journal(state_dir / JOURNAL)


def detect_layout(root: Path = CGROUP_ROOT) -> CgroupLayout:
    """cgroup v2 when the unified root offers cpu and memory, else v1's per-controller directories."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and {"cpu", "memory"} <= set(controllers.read_text().split()):
        return CgroupLayout(2, root)
    if (root / "cpu" / "cpu.cfs_quota_us").exists() and (root / "memory").is_dir():
        return CgroupLayout(1, root)
    raise RackError(f"no usable cgroup hierarchy under {root} (needs the cpu, memory and cpuset controllers)")


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def host_spec(
    state_dir: Path, devices: int, cpu_share_pct: int, memory_mb: int, name: str, subnet: str = DEFAULT_SUBNET
) -> RackSpec:
    """The spec for this machine: the edge gets CPU 0, the devices the others (like local mode)."""
    from dit.inventory import local_cpu_split

    available = sorted(os.sched_getaffinity(0))
    edge_cpus, device_cpus = local_cpu_split()
    return RackSpec(
        state_dir=state_dir.resolve(),
        devices=devices,
        cpu_share_pct=cpu_share_pct,
        memory_mb=memory_mb,
        name=name,
        subnet=subnet,
        cpus=_cpu_list(device_cpus or available),
        all_cpus=_cpu_list(edge_cpus or available),
        host_cpus=len(available),
    )


def _run(argv: Sequence[str]) -> None:
    result = subprocess.run(list(argv), check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RackError(f"{' '.join(argv)}: {result.stderr.strip() or f'exit {result.returncode}'}")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise RackError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from None


def _preflight() -> None:
    if os.geteuid() != 0:
        raise RackError("dit rack needs root (network namespaces, cgroups, sshd)")
    tools = ((SSHD, "openssh-server"), ("ip", "iproute2"), ("nsenter", "util-linux"), ("tc", "iproute2"))
    for tool, package in tools:
        hint = f"apt-get install {package}"
        if shutil.which(tool) is None:
            raise RackError(f"{tool} not found ({hint})")
    if shutil.which("ssh-keygen") is None:
        raise RackError("ssh-keygen not found (apt-get install openssh-client)")


def _mems(layout: CgroupLayout) -> str:
    path = layout.root / ("cpuset.mems.effective" if layout.version == 2 else "cpuset/cpuset.mems")
    try:
        return path.read_text().strip() or "0"
    except OSError:
        return "0"


def _join_cgroup(files: list[Path]) -> Callable[[], None]:
    def join() -> None:  # runs in the child before exec: sshd and all it starts inherit the cgroup
        for path in files:
            with path.open("w") as handle:
                handle.write(str(os.getpid()))

    return join


def _netem_available(node: Node) -> tuple[bool, str]:
    """Whether this kernel runs a netem qdisc: tried for real on the node's loopback."""
    add = [
        "ip",
        "netns",
        "exec",
        node.netns,
        "tc",
        "qdisc",
        "add",
        "dev",
        "lo",
        "root",
        "netem",
        "delay",
        "1ms",
    ]
    result = subprocess.run(add, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        return False, result.stderr.strip() or f"tc exited {result.returncode}"
    subprocess.run(
        ["ip", "netns", "exec", node.netns, "tc", "qdisc", "del", "dev", "lo", "root"],
        check=False,
        capture_output=True,
    )
    return True, ""


def _wait_ssh(address: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((address, 22), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RackError(f"sshd on {address} did not come up: {exc}") from None
            time.sleep(0.1)


class Rack:
    def __init__(self, spec: RackSpec, layout: CgroupLayout | None = None) -> None:
        self.spec = spec
        self.layout = layout
        self.journal = journal_of(spec.state_dir)

    def _take(self, step: Step) -> None:
        if step.op != "noop":
            self.journal.record_changes(step.host, [{"op": step.op, "undo": step.undo}], SOURCE)
        if step.op == "cgroup":
            for directory in step.undo["dirs"]:
                Path(directory).mkdir(exist_ok=True)
        if step.argv:
            _run(step.argv)
        for write in step.writes:
            if not (write.optional and not write.path.exists()):
                _write(write.path, write.value)

    def up(self, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
        spec = self.spec
        spec.validate()
        _preflight()
        if journal_of(spec.state_dir).pending():
            raise RackError(f"a rack is already up in {spec.state_dir}: `dit rack down` first")
        layout = self.layout = self.layout or detect_layout()
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        self._keys()
        if not SSHD_PRIVSEP.is_dir():  # sshd's privilege-separation directory (Debian's sshd needs it)
            self.journal.record_changes(
                "controller", [{"op": "dir", "undo": {"rmdir": str(SSHD_PRIVSEP)}}], SOURCE
            )
            SSHD_PRIVSEP.mkdir(mode=0o755)
        progress("network: bridge, namespaces, veths")
        for step in network_steps(spec):
            self._take(step)
        progress(f"cgroups (v{layout.version}): cpu quota, memory limit, cpuset")
        for step in cgroup_steps(spec, layout, _mems(layout)):
            self._take(step)
        all_nodes = nodes(spec)
        netem, netem_reason = _netem_available(all_nodes[0])
        for node in all_nodes:
            self._sshd(node)
        for node in all_nodes:
            _wait_ssh(node.address)
        progress(f"sshd up on {len(all_nodes)} nodes")
        inventory = inventory_yaml(spec, sys.executable, netem_dry_run=not netem, layout=layout)
        (spec.state_dir / INVENTORY).write_text(inventory)
        state = {
            "spec": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(spec).items()},
            "cgroup_version": layout.version,
            "netem": {"available": netem, "reason": netem_reason},
            "nodes": {
                n.name: {"address": n.address, "netns": n.netns, "cgroup": n.cgroup} for n in all_nodes
            },
            "inventory": str(spec.state_dir / INVENTORY),
            "up_wall_ns": time.time_ns(),
        }
        (spec.state_dir / STATE).write_text(json.dumps(state, indent=2) + "\n")
        return state

    def _keys(self) -> None:
        keys = keys_dir(self.spec)
        keys.mkdir(mode=0o700, exist_ok=True)
        host_key, client = keys / "host_ed25519", client_key(self.spec)
        for path in (host_key, client):
            if not path.exists():
                _run(
                    [
                        "ssh-keygen",
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        f"dit-rack-{path.stem}",
                        "-f",
                        str(path),
                    ]
                )
        authorized = keys / "authorized_keys"
        authorized.write_text(Path(f"{client}.pub").read_text())
        authorized.chmod(0o600)
        (self.spec.state_dir / "known_hosts").write_text(
            known_hosts(self.spec, Path(f"{host_key}.pub").read_text())
        )

    def _sshd(self, node: Node) -> None:
        assert self.layout is not None
        directory = node_dir(self.spec, node)
        (directory / "root").mkdir(parents=True, exist_ok=True)
        make_fake_sysfs(directory / "sys", node.role)
        config = directory / "sshd_config"
        config.write_text(sshd_config(self.spec, node))
        procs = procs_files(self.layout, process_cgroup(self.layout, node.cgroup))
        self.journal.record_changes(
            node.name,
            [
                {
                    "op": "sshd",
                    "undo": {"pidfile": str(directory / "sshd.pid"), "procs": [str(p) for p in procs]},
                }
            ],
            SOURCE,
        )
        with (directory / "sshd.log").open("ab") as log:
            subprocess.Popen(
                sshd_argv(node, config),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                # `dit rack up` runs no threads, so a preexec_fn is safe here.
                preexec_fn=_join_cgroup(procs),  # noqa: PLW1509
                start_new_session=True,  # outlives `dit rack up`
            )


# -- down ----------------------------------------------------------------------------------------


def _pids_in(procs: Path) -> set[int]:
    try:
        return {int(p) for p in procs.read_text().split()}
    except (OSError, ValueError):
        return set()


def _kill(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _empty_cgroup(procs: Path, timeout_s: float = 10.0) -> None:
    """Kill every process of a cgroup (TERM, then KILL) and wait until it is empty."""
    pids = _pids_in(procs)
    _kill(pids, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pids := _pids_in(procs):
        if time.monotonic() > deadline - timeout_s / 2:
            _kill(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RackError(f"processes {sorted(pids)} in {procs.parent} do not exit")
        time.sleep(0.05)


def _netns_exists(netns: str) -> bool:
    return Path("/run/netns", netns).exists()


def _link_exists(link: str) -> bool:
    return Path("/sys/class/net", link).exists()


def undo(op: str, data: Mapping[str, Any]) -> None:
    """Undo one journaled step; a step that never happened (a crash before it) is a no-op."""
    if op == "sshd":
        # sshd joined the node's cgroup before it was exec'd, so emptying the cgroup ends it and
        # everything it started; its pid file is not used (the pid may belong to another process
        # by now).
        for procs in data.get("procs", []):
            _empty_cgroup(Path(procs))
    elif op == "cgroup":
        for directory in map(Path, data.get("dirs", [])):
            if directory.is_dir():
                # Children first (a crashed run's cgroup nested in the node's): rmdir needs them gone.
                for sub, _, _ in sorted(os.walk(directory), key=lambda w: -w[0].count("/")):
                    _empty_cgroup(Path(sub) / "cgroup.procs")
                    Path(sub).rmdir()
    elif op == "netns":
        netns = str(data["netns"])
        if _netns_exists(netns):
            pids = subprocess.run(
                ["ip", "netns", "pids", netns], check=False, capture_output=True, text=True
            ).stdout.split()
            _kill({int(p) for p in pids}, signal.SIGKILL)
            _run(["ip", "netns", "del", netns])
    elif op == "link":
        if _link_exists(str(data["link"])):
            _run(["ip", "link", "del", str(data["link"])])
    elif op == "dir":
        path = Path(data["rmdir"])
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    else:
        raise RackError(f"journal: unknown rack step {op!r}")


def down(state_dir: Path) -> int:
    """Undo every pending step newest first, then remove the state dir; returns the steps undone."""
    if os.geteuid() != 0:
        raise RackError("dit rack down needs root")
    journal = journal_of(state_dir)
    pending = journal.pending()
    for change in pending:
        undo(change.op, change.undo)
        journal.mark_undone([change.id])
    if state_dir.is_dir():
        shutil.rmtree(state_dir)
    return len(pending)


# -- status --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStatus:
    name: str
    address: str
    netns: bool
    cgroup: bool
    sshd: bool  # something accepts connections on the node's port 22
    processes: int  # in the node's cgroup


def status(state_dir: Path) -> tuple[dict[str, Any], list[NodeStatus]]:
    path = state_dir / STATE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        pending = journal_of(state_dir).pending()
        detail = f" ({len(pending)} leftover steps: `dit rack down` removes them)" if pending else ""
        raise RackError(f"no rack in {state_dir}{detail}") from None
    except (OSError, ValueError) as exc:
        raise RackError(f"{path}: unreadable ({exc})") from None
    layout = CgroupLayout(int(state["cgroup_version"]))
    rows: list[NodeStatus] = []
    for name, node in state["nodes"].items():
        procs = procs_files(layout, process_cgroup(layout, node["cgroup"]))
        try:
            with socket.create_connection((node["address"], 22), timeout=1.0):
                sshd = True
        except OSError:
            sshd = False
        rows.append(
            NodeStatus(
                name=name,
                address=node["address"],
                netns=_netns_exists(node["netns"]),
                cgroup=all(p.parent.is_dir() for p in procs),
                sshd=sshd,
                processes=len(_pids_in(procs[0])),
            )
        )
    return state, rows
