"""The emulated rack as data: names, addresses, argv lists, cgroup files, sshd config, inventory.

Everything here is a pure function of a :class:`RackSpec` (and, for cgroups, of the hierarchy
layout the executor found), so the whole rack can be checked without a host. The executor
(:mod:`dit.rack.executor`) journals each :class:`Step` and then runs it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dit.ansible_data import unsafe_yaml
from dit.conditions.cpu_share import period_us, quota_us
from dit.rack import DEFAULT_STATE_DIR, DEFAULT_SUBNET

CFS_PERIOD_US = 100_000  # the kernel's default, kept for a node without a quota
CPU_SHARES_MAX_V1 = 262_144
CPU_WEIGHT_MAX_V2 = 10_000
#: The rack's real-time budget per second (cgroup v1 ``cpu.rt_runtime_us``): a v1 cpu group starts
#: with none, and then SCHED_FIFO is refused inside it, also for the agent's wait for the start.
RT_BUDGET_US = 200_000
RT_NODE_MIN_US = 4_000  # two 2 ms start spins a second
#: The least RT budget of the rack's link emulators (their own cgroup, :func:`links_cgroup`): they
#: spin at SCHED_FIFO for the last ``spin_us`` before each release.
RT_LINKS_MIN_US = 90_000
#: The rack's cgroup for the userspace link emulators, beside the nodes' (see :func:`links_cgroup`).
LINKS_LEAF = "links"
MAX_DEVICES = 200  # device addresses are .11 … .210 of one /24
EDGE = "edge"
INFERENCE_INTERFACE = "inf0"  # the veth end inside every node's namespace
#: cgroup v2's leaf under each node for sshd and what it starts: v2 lets a cgroup hand controllers
#: to children (a run's cgroups) only while it holds no processes itself ("no internal processes").
PROCESS_LEAF = "sshd"
V2_CONTROLLERS = "+cpu +cpuset +memory"
SSHD = "/usr/sbin/sshd"
#: What the host side of the bridge carries in its ``ifalias``: how a second rack names the first's
#: state dir when their subnets collide (the kernel keeps it with the link; nothing to go stale).
BRIDGE_ALIAS_PREFIX = "dit rack "
IFALIAS_MAX = 255
RACK_ID_HEX = 6  # dr-<id>-<index>: 3 + 6 + 1 + 3 = 13 characters, within IFNAMSIZ - 1 = 15
_NAME = re.compile(r"^[a-z][a-z0-9]{0,5}\Z")
_SUBNET = re.compile(r"^10\.(\d{1,3})\.(\d{1,3})\Z")


class RackError(Exception):
    """The rack cannot be built as asked (a bad option, a missing tool, a rack already up)."""


@dataclass(frozen=True)
class RackSpec:
    """What ``dit rack up`` builds. ``cpu_share_pct`` is a percentage of one CPU (100 = a core)."""

    state_dir: Path
    devices: int = 3
    cpu_share_pct: int = 100
    memory_mb: int = 1024
    name: str = "rack"  # prefixes namespaces, links and cgroups: several racks can coexist
    subnet: str = DEFAULT_SUBNET  # first three octets of the /24
    cpus: str = "0"  # the devices' cpuset (the edge gets every CPU in ``all_cpus``)
    all_cpus: str = "0"
    host_cpus: int = 1  # CPUs of this machine: the upper bound of cpu_share_pct is 100 times this

    @property
    def rack_id(self) -> str:
        return rack_id(self.state_dir)

    def _quotas(self) -> tuple[int, int, int] | None:
        """(CPUs the devices share, their quotas' sum in % of one CPU, the largest ``--cpu-share`` that
        fits) when the quotas add up to more than those CPUs; None when they fit."""
        ncpus = len(cpu_set(self.cpus))
        total = self.devices * self.cpu_share_pct
        return None if total <= 100 * ncpus else (ncpus, total, 100 * ncpus // self.devices)

    def oversubscription(self) -> str | None:
        """A warning when the devices' quotas add up to more than the CPUs they share (``cpus``): each
        device then gets its quota only while the others are idle, so its capacity while it
        profiles alone is not its capacity when every device computes, and the delay model, which
        takes each node's capacity from its profile, mispredicts. None when they fit."""
        over = self._quotas()
        if over is None:
            return None
        ncpus, total, fits = over
        return (
            f"--cpu-share {self.cpu_share_pct}: {self.devices} devices x {self.cpu_share_pct} % = {total} % "
            f"of one CPU, but the devices share {ncpus} CPU{'s' if ncpus > 1 else ''} ({self.cpus}): a "
            "device's capacity will depend on what the others do. "
            + (f"--cpu-share {fits} or less keeps every device's capacity its own." if fits >= 1 else "")
        ).strip()

    def fitting_up(self) -> str | None:
        """The ``dit rack up`` command that rebuilds this rack with quotas that fit the CPUs its
        devices share (the same devices, memory, name, subnet and state dir; as many devices as fit
        at 1 % when even that is too much); None when the quotas already fit."""
        over = self._quotas()
        if over is None:
            return None
        ncpus, _, fits = over
        devices, share = (self.devices, fits) if fits >= 1 else (100 * ncpus, 1)
        argv = ["dit", "rack", "up", "--devices", str(devices), "--cpu-share", str(share)]
        argv += ["--memory-mb", str(self.memory_mb)]
        if self.name != RackSpec.name:
            argv += ["--name", self.name]
        if self.subnet != DEFAULT_SUBNET:
            argv += ["--subnet", self.subnet]
        if Path(self.state_dir) != DEFAULT_STATE_DIR:
            argv += ["--state-dir", str(self.state_dir)]
        return " ".join(argv)

    def quota_refusal(self) -> str | None:
        """One sentence refusing a measurement of parallel strategies on this rack when its devices'
        quotas exceed the CPUs they share (DESIGN.md section 9: a device's capacity would then depend
        on what the others do), naming the quotas and the command that fits; None when they fit."""
        over, command = self._quotas(), self.fitting_up()
        if over is None or command is None:
            return None
        ncpus, total, _ = over
        return (
            f"the rack's {self.devices} devices at --cpu-share {self.cpu_share_pct} ask for {total} % of "
            f"one CPU but share {ncpus} CPU{'s' if ncpus > 1 else ''} ({self.cpus}), so one device's "
            f"capacity would depend on what the others do: rebuild it with `dit rack down` and `{command}`"
        )

    @classmethod
    def recorded(cls, doc: Mapping[str, Any]) -> RackSpec:
        """The spec a rack recorded in its state file (``rack.json``'s ``spec``, as ``rack up``
        writes it); :class:`RackError` names a field that is missing or of the wrong type."""
        try:
            spec = cls(**{**doc, "state_dir": Path(str(doc["state_dir"]))})
        except (KeyError, TypeError) as exc:
            raise RackError(f"rack.json: spec is not a rack's recorded spec ({exc})") from None
        for name in ("devices", "cpu_share_pct", "memory_mb", "host_cpus"):
            if isinstance(getattr(spec, name), bool) or not isinstance(getattr(spec, name), int):
                raise RackError(f"rack.json: spec.{name}: {getattr(spec, name)!r} is not an integer")
        return spec

    def validate(self) -> None:
        if not _NAME.match(self.name):
            raise RackError(f"--name {self.name!r}: 1-6 lowercase letters or digits, starting with a letter")
        if not 1 <= self.devices <= MAX_DEVICES:
            raise RackError(f"--devices {self.devices}: must be between 1 and {MAX_DEVICES}")
        if not 1 <= self.cpu_share_pct <= 100 * self.host_cpus:
            raise RackError(
                f"--cpu-share {self.cpu_share_pct}: must be between 1 and {100 * self.host_cpus} "
                f"(percent of one CPU; this machine has {self.host_cpus})"
            )
        if self.memory_mb < 16:
            raise RackError(f"--memory-mb {self.memory_mb}: must be at least 16 (sshd and Python need room)")
        match = _SUBNET.match(self.subnet)
        if not match or not all(0 <= int(octet) <= 255 for octet in match.groups()):
            raise RackError(f"--subnet {self.subnet!r}: must be three octets of a private 10.x.y.0/24")


@dataclass(frozen=True)
class Node:
    name: str  # the inventory host name: edge, device1 …
    index: int  # 0 for the edge, i for device i
    netns: str
    veth: str  # host side, enslaved to the bridge; the namespace side is INFERENCE_INTERFACE
    address: str
    cgroup: str  # relative path under each controller's hierarchy
    cpu_share_pct: int | None  # None: unlimited (the edge server)
    memory_mb: int | None
    cpus: str

    @property
    def role(self) -> str:
        return EDGE if self.index == 0 else "device"


@dataclass(frozen=True)
class CgroupLayout:
    """Where the controllers are mounted: v1 (one directory per controller) or v2 (unified)."""

    version: int
    root: Path = Path("/sys/fs/cgroup")

    def controller_dirs(self) -> dict[str, Path]:
        if self.version == 2:
            return {"unified": self.root}
        return {c: self.root / c for c in ("cpu", "cpuacct", "memory", "cpuset")}


@dataclass(frozen=True)
class CgroupWrite:
    path: Path  # the control file
    value: str
    optional: bool = False  # skipped when the kernel lacks the file (e.g. no RT group scheduling)


@dataclass(frozen=True)
class Step:
    """One thing ``rack up`` creates: journaled (``op`` + ``undo``) before ``argv`` runs."""

    host: str
    op: str  # netns | link | cgroup | sshd | dir
    undo: dict[str, Any]
    argv: tuple[str, ...] = ()
    writes: tuple[CgroupWrite, ...] = field(default_factory=tuple)


def rack_id(state_dir: Path) -> str:
    """A short stable id of the rack in ``state_dir``: every link, namespace and cgroup of the rack
    carries it, so racks in different state dirs never share a name (``--name`` alone did, and a
    second ``rack up`` then took the first rack's bridge for its own)."""
    return hashlib.sha256(str(state_dir).encode()).hexdigest()[:RACK_ID_HEX]


def bridge_name(spec: RackSpec) -> str:
    return f"dr-{spec.rack_id}-br"


def bridge_alias(spec: RackSpec) -> str:
    return f"{BRIDGE_ALIAS_PREFIX}{spec.state_dir}"[:IFALIAS_MAX]


def cgroup_parent(spec: RackSpec) -> str:
    return f"dit-{spec.name}-{spec.rack_id}"


def links_cgroup(spec: RackSpec) -> str:
    """Where every node's userspace link emulator runs (``netem_emulator_cgroup``): outside the nodes'
    CPU quotas and memory limits. It stands in for the kernel's netem, which costs a real board's
    inference no CPU; inside a node's 40 % quota it took the worker's CPU and, throttled there, held
    a few packets 150-280 ms too long (emulated-rack runs of 2026-12-04)."""
    return f"{cgroup_parent(spec)}/{LINKS_LEAF}"


def bridge_address(spec: RackSpec) -> str:
    """The controller's address on the inference bridge: how Ansible reaches every node."""
    return f"{spec.subnet}.1"


def nodes(spec: RackSpec) -> list[Node]:
    out: list[Node] = []
    for index in range(spec.devices + 1):
        name = EDGE if index == 0 else f"device{index}"
        edge = index == 0
        out.append(
            Node(
                name=name,
                index=index,
                netns=f"dit-{spec.name}-{spec.rack_id}-{name}",
                veth=f"dr-{spec.rack_id}-{index}",
                address=f"{spec.subnet}.{10 if edge else 10 + index}",
                cgroup=f"{cgroup_parent(spec)}/{name}",
                cpu_share_pct=None if edge else spec.cpu_share_pct,
                memory_mb=None if edge else spec.memory_mb,
                cpus=spec.all_cpus if edge else spec.cpus,
            )
        )
    return out


def node_dir(spec: RackSpec, node: Node) -> Path:
    return spec.state_dir / "nodes" / node.name


def cgroup_dirs(layout: CgroupLayout, relative: str) -> list[Path]:
    return [base / relative for base in layout.controller_dirs().values()]


def cpu_quota_writes(layout: CgroupLayout, relative: str, share_pct: int | None) -> list[CgroupWrite]:
    """The CPU quota of ``share_pct`` % of one CPU (None: no quota), v1 CFS files or v2 ``cpu.max``,
    over the short period of :func:`dit.conditions.cpu_share.period_us` (a uniformly slower CPU at
    the scale of a model's stages, not bursts of full speed)."""
    period = CFS_PERIOD_US if share_pct is None else period_us(share_pct)
    quota = -1 if share_pct is None else quota_us(share_pct)
    if layout.version == 2:
        value = "max" if quota < 0 else str(quota)
        return [CgroupWrite(layout.root / relative / "cpu.max", f"{value} {period}")]
    cpu = layout.root / "cpu" / relative
    return [
        CgroupWrite(cpu / "cpu.cfs_period_us", str(period)),
        CgroupWrite(cpu / "cpu.cfs_quota_us", str(quota)),
    ]


def cpu_weight_writes(layout: CgroupLayout, relative: str) -> list[CgroupWrite]:
    """The highest CPU weight, so that a node's quota and not the host's other work sets its
    capacity (a 30 % device gets its 30 % on a busy machine). The quota caps what it can take."""
    if layout.version == 2:
        return [CgroupWrite(layout.root / relative / "cpu.weight", str(CPU_WEIGHT_MAX_V2))]
    return [CgroupWrite(layout.root / "cpu" / relative / "cpu.shares", str(CPU_SHARES_MAX_V1))]


def rt_budgets_us(devices: int) -> tuple[int, int, int]:
    """(the rack's, each node's, the link emulators') RT budget in µs per second: a node needs only
    its agent's start spins; the rest of the rack's budget goes to the link emulators' cgroup. The
    children's sum fits the rack's, which stays below the root's 950 000."""
    count = devices + 1
    parent = min(900_000, max(RT_BUDGET_US, RT_NODE_MIN_US * count + RT_LINKS_MIN_US))
    return parent, RT_NODE_MIN_US, parent - RT_NODE_MIN_US * count


def rt_writes(layout: CgroupLayout, relative: str, budget_us: int) -> list[CgroupWrite]:
    if layout.version == 2:
        return []  # v2 has no per-group RT budget: SCHED_FIFO is allowed in any group
    return [CgroupWrite(layout.root / "cpu" / relative / "cpu.rt_runtime_us", str(budget_us), optional=True)]


def memory_writes(layout: CgroupLayout, relative: str, memory_mb: int | None) -> list[CgroupWrite]:
    if memory_mb is None:
        return []
    limit_bytes = str(memory_mb * 1024 * 1024)
    if layout.version == 2:
        return [CgroupWrite(layout.root / relative / "memory.max", limit_bytes)]
    return [CgroupWrite(layout.root / "memory" / relative / "memory.limit_in_bytes", limit_bytes)]


def cpuset_writes(layout: CgroupLayout, relative: str, cpus: str, mems: str) -> list[CgroupWrite]:
    """A v1 cpuset cgroup starts empty: ``cpuset.mems`` and ``cpuset.cpus`` must be set before a
    task can join it (on v2 empty means "inherit", but setting them is just as right)."""
    base = layout.root / relative if layout.version == 2 else layout.root / "cpuset" / relative
    return [CgroupWrite(base / "cpuset.mems", mems), CgroupWrite(base / "cpuset.cpus", cpus)]


def process_cgroup(layout: CgroupLayout, node_cgroup: str) -> str:
    """The cgroup a node's sshd (and so every process started over SSH) joins: on v1 the node's own,
    on v2 its leaf ``<node>/sshd``, so that the node itself stays free of processes and can nest a
    run's cgroups (``dit_cgroup_root``) with the cpu, cpuset and memory controllers."""
    return f"{node_cgroup}/{PROCESS_LEAF}" if layout.version == 2 else node_cgroup


def subtree_control_write(layout: CgroupLayout, relative: str) -> CgroupWrite:
    """v2: enable cpu, cpuset and memory for the children of ``relative`` ("" is the root)."""
    base = layout.root / relative if relative else layout.root
    return CgroupWrite(base / "cgroup.subtree_control", V2_CONTROLLERS)


def procs_files(layout: CgroupLayout, relative: str) -> list[Path]:
    """Where a process writes its pid to join the node's cgroup (every controller on v1)."""
    return [d / "cgroup.procs" for d in cgroup_dirs(layout, relative)]


def sshd_config(spec: RackSpec, node: Node) -> str:
    keys = keys_dir(spec)
    return (
        f"ListenAddress {node.address}\n"
        "Port 22\n"
        f"HostKey {keys / 'host_ed25519'}\n"
        f"PidFile {node_dir(spec, node) / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        # sshd refuses the authorized keys when the file or any directory above it is not root's or
        # is group/world-writable: `rack up` checks the same before it builds anything.
        "StrictModes yes\n"
        "AcceptEnv LANG LC_*\n"
        "Subsystem sftp internal-sftp\n"
    )


def keys_dir(spec: RackSpec) -> Path:
    return spec.state_dir / "keys"


def client_key(spec: RackSpec) -> Path:
    return keys_dir(spec) / "controller_ed25519"


def known_hosts(spec: RackSpec, host_public_key: str) -> str:
    """Every node's address with the rack host key: SSH checks the host key strictly."""
    key = " ".join(host_public_key.split()[:2])
    return "".join(f"{node.address} {key}\n" for node in nodes(spec))


def sshd_argv(node: Node, config: Path) -> tuple[str, ...]:
    """sshd in the node's network namespace only. Not ``ip netns exec``: that mounts a fresh sysfs
    over ``/sys`` and hides ``/sys/fs/cgroup``, where the run's processes read their own limits."""
    return ("nsenter", f"--net=/run/netns/{node.netns}", SSHD, "-D", "-e", "-f", str(config))


def network_steps(spec: RackSpec) -> list[Step]:
    """The bridge with the controller's address, then per node its namespace and veth pair."""
    bridge = bridge_name(spec)
    steps = [
        Step("controller", "link", {"link": bridge}, ("ip", "link", "add", bridge, "type", "bridge")),
        Step("controller", "noop", {}, ("ip", "link", "set", "dev", bridge, "alias", bridge_alias(spec))),
        Step("controller", "noop", {}, ("ip", "addr", "add", f"{bridge_address(spec)}/24", "dev", bridge)),
        Step("controller", "noop", {}, ("ip", "link", "set", bridge, "up")),
    ]
    for node in nodes(spec):
        ns = ("ip", "-n", node.netns)
        steps += [
            Step(node.name, "netns", {"netns": node.netns}, ("ip", "netns", "add", node.netns)),
            Step(
                node.name,
                "link",
                {"link": node.veth},
                (
                    "ip",
                    "link",
                    "add",
                    node.veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    INFERENCE_INTERFACE,
                    "netns",
                    node.netns,
                ),
            ),
            Step(node.name, "noop", {}, ("ip", "link", "set", node.veth, "master", bridge)),
            Step(node.name, "noop", {}, ("ip", "link", "set", node.veth, "up")),
            Step(
                node.name, "noop", {}, (*ns, "addr", "add", f"{node.address}/24", "dev", INFERENCE_INTERFACE)
            ),
            Step(node.name, "noop", {}, (*ns, "link", "set", INFERENCE_INTERFACE, "up")),
            Step(node.name, "noop", {}, (*ns, "link", "set", "lo", "up")),
        ]
    return steps


def cpu_set(*cpu_lists: str) -> set[int]:
    """The CPUs of one or more comma-separated lists ("0", "1,2" -> {0, 1, 2})."""
    return {int(c) for lst in cpu_lists for c in lst.split(",") if c.strip()}


def _union(*cpu_lists: str) -> str:
    """The CPUs of several comma-separated lists ("0", "1,2" -> "0,1,2")."""
    return ",".join(str(c) for c in sorted(cpu_set(*cpu_lists)))


def _top_weight(spec: RackSpec, node: Node) -> bool:
    """Whether ``node`` gets the top CPU weight, so that the host's other work (the controller, other
    jobs) cannot slow it: a quota-capped device always (the quota caps what it takes); the uncapped
    edge only when its cpuset leaves the host a CPU of its own, so that it can never starve the host
    (on a one-CPU machine it keeps the default weight). Without it the edge's capacity during a run
    depends on the host's load, and its capacity profile mispredicts the remote term."""
    if node.cpu_share_pct is not None:
        return True
    return len(cpu_set(node.cpus)) < spec.host_cpus


def cgroup_steps(spec: RackSpec, layout: CgroupLayout, mems: str) -> list[Step]:
    """The rack's parent cgroup, the link emulators' (:func:`links_cgroup`), and one per node with
    its quota, memory limit and cpuset.

    Each directory is journaled before it is made; the parent first so that ``rack down``, which
    undoes newest first, removes the children before it.
    """
    parent = cgroup_parent(spec)
    parent_writes = [
        *cpuset_writes(layout, parent, _union(spec.all_cpus, spec.cpus), mems),
        *cpu_weight_writes(layout, parent),
        *rt_writes(layout, parent, rt_budgets_us(spec.devices)[0]),
    ]
    if layout.version == 2:
        # v2 hands a controller to children only once the parent lists it in subtree_control.
        parent_writes = [
            subtree_control_write(layout, ""),
            *parent_writes,
            subtree_control_write(layout, parent),
        ]
    _, node_rt, links_rt = rt_budgets_us(spec.devices)
    links = links_cgroup(spec)
    steps = [
        Step(
            "controller",
            "cgroup",
            {"dirs": [str(d) for d in cgroup_dirs(layout, parent)]},
            writes=tuple(parent_writes),
        ),
        # The link emulators' (a leaf: no quota, no memory limit, every CPU of the rack, the top
        # weight as a kernel's softirq would have); after the parent, so `rack down` removes it first.
        Step(
            "controller",
            "cgroup",
            {"dirs": [str(d) for d in cgroup_dirs(layout, links)]},
            writes=(
                *cpuset_writes(layout, links, _union(spec.all_cpus, spec.cpus), mems),
                *cpu_weight_writes(layout, links),
                *rt_writes(layout, links, links_rt),
            ),
        ),
    ]
    for node in nodes(spec):
        writes = [
            *cpuset_writes(layout, node.cgroup, node.cpus, mems),
            *cpu_quota_writes(layout, node.cgroup, node.cpu_share_pct),
            *(cpu_weight_writes(layout, node.cgroup) if _top_weight(spec, node) else []),
            *memory_writes(layout, node.cgroup, node.memory_mb),
            *rt_writes(layout, node.cgroup, node_rt),
        ]
        if layout.version == 2:
            # The node nests: its children (the sshd leaf, a run's cgroups) get its controllers.
            writes.append(subtree_control_write(layout, node.cgroup))
        steps.append(
            Step(
                node.name,
                "cgroup",
                {"dirs": [str(d) for d in cgroup_dirs(layout, node.cgroup)]},
                writes=tuple(writes),
            )
        )
        leaf = process_cgroup(layout, node.cgroup)
        if leaf != node.cgroup:
            # Journaled after the node, so `rack down` (newest first) removes it before the node.
            steps.append(Step(node.name, "cgroup", {"dirs": [str(d) for d in cgroup_dirs(layout, leaf)]}))
    return steps


def inventory(
    spec: RackSpec,
    python: str = sys.executable,
    netem_dry_run: bool = False,
    layout: CgroupLayout | None = None,
) -> dict[str, Any]:
    """The rack as an Ansible inventory with groups ``edge`` and ``devices`` (like rack.example).

    ``ansible_host`` and ``dit_inference_address`` are the same address: the controller sits on
    the inference bridge, so management and inference share one network here (the rack's real
    boards have a wired management network besides the Wi-Fi). The filesystem and the clock are
    shared, so every node gets its own ``dit_remote_base`` and ``dit_shared_clock`` is set.
    ``netem_dry_run`` (a kernel without ``sch_netem``) makes every device record the tc trees that
    need netem instead of running them (``dit_tc_dry_run: netem``); rate-only trees stay real.
    With a ``layout`` every device's ``dit_cgroup_root`` and ``dit_cpu_cgroup_root`` are its node's
    own cgroups (v1: in the memory and cpu hierarchies; v2: the one unified directory, whose sshd
    sits in the leaf :func:`process_cgroup` so the node may hand controllers on), so a run's memory
    limit and CPU share (``hardware.<device>``) nest inside the node's and both apply; and every
    node's ``netem_emulator_cgroup`` is the rack's :func:`links_cgroup` (the netem role starts the
    userspace link emulator there, not in the node's quota).
    """

    def host(node: Node) -> dict[str, Any]:
        base = node_dir(spec, node)
        out: dict[str, Any] = {
            "ansible_host": node.address,
            "dit_inference_address": node.address,
            "dit_inference_interface": INFERENCE_INTERFACE,
            "dit_remote_base": str(base / "root"),
            "sysfs_root": str(base / "sys"),
            "dit_rack_cgroup": node.cgroup,
            # the userspace link emulator runs outside the node's quota (:func:`links_cgroup`)
            "netem_emulator_cgroup": [str(d) for d in cgroup_dirs(layout, links_cgroup(spec))]
            if layout is not None
            else [],
            # NNPM's map: the article's layout, nodes about a metre apart.
            "dit_lat": 37.975 + (0.00002 if node.index else 0.0),
            "dit_lon": round(23.735 + 0.000012 * max(node.index - 1, 0), 7),
        }
        if netem_dry_run and node.role == "device":
            out["dit_tc_dry_run"] = "netem"
        if layout is not None and layout.version == 1 and node.role == "device":
            out["dit_cgroup_root"] = str(layout.root / "memory" / node.cgroup)
            out["dit_cpu_cgroup_root"] = str(layout.root / "cpu" / node.cgroup)
        elif layout is not None and node.role == "device":
            out["dit_cgroup_root"] = out["dit_cpu_cgroup_root"] = str(layout.root / node.cgroup)
        return out

    all_nodes = nodes(spec)
    ssh_args = f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={spec.state_dir / 'known_hosts'}"
    return {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(client_key(spec)),
                "ansible_ssh_common_args": ssh_args,
                "ansible_python_interpreter": python,
                "dit_python": python,
                "dit_shared_clock": True,
                "dit_rack": str(spec.state_dir),
            },
            "children": {
                "edge": {"hosts": {n.name: host(n) for n in all_nodes if n.role == EDGE}},
                "devices": {"hosts": {n.name: host(n) for n in all_nodes if n.role != EDGE}},
            },
        }
    }


def state_doc(
    spec: RackSpec,
    layout: CgroupLayout,
    netem: bool,
    netem_reason: str,
    inventory: Path,
    up_wall_ns: int,
) -> dict[str, Any]:
    """What ``rack up`` records in the state dir's ``rack.json`` once the rack is up: its spec (the
    quotas and CPUs ``dit reproduce --where rack`` checks), its nodes and where its inventory is."""
    return {
        "spec": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(spec).items()},
        "rack_id": spec.rack_id,
        "bridge": bridge_name(spec),
        "controller_address": bridge_address(spec),
        "cgroup_version": layout.version,
        "netem": {"available": netem, "reason": netem_reason},
        "nodes": {
            n.name: {"address": n.address, "netns": n.netns, "veth": n.veth, "cgroup": n.cgroup}
            for n in nodes(spec)
        },
        "inventory": str(inventory),
        "up_wall_ns": up_wall_ns,
    }


def inventory_yaml(
    spec: RackSpec,
    python: str = sys.executable,
    netem_dry_run: bool = False,
    layout: CgroupLayout | None = None,
) -> str:
    header = (
        f"# The emulated rack in {spec.state_dir} (written by `dit rack up`; `dit rack down` removes it).\n"
    )
    # the state dir's path (a user's text) is in the keys' and configs' paths: written unsafe (data)
    return header + unsafe_yaml(inventory(spec, python, netem_dry_run, layout))


# -- what a rack may undo, and what a new rack must not meet --------------------------------------

CGROUP_CONTROLLERS_V1 = ("cpu", "cpuacct", "memory", "cpuset")  # cgroup_dirs' v1 hierarchies
_NODE_NAME = r"(?:edge|device[1-9][0-9]{0,2})"


@dataclass(frozen=True)
class UndoScope:
    """What ``rack down`` may undo: the objects the rack plan can create for the rack in
    ``state_dir``, named with its :func:`rack_id`. Derived from the state dir given on the command
    line, never from the journal, so a rewritten journal cannot name another rack's bridge, a
    system cgroup or a directory elsewhere: such a record is refused (:meth:`refusal`)."""

    state_dir: Path
    cgroup_root: Path = Path("/sys/fs/cgroup")

    def _patterns(self) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
        rid = re.escape(rack_id(self.state_dir))
        return (
            re.compile(rf"^dr-{rid}-(?:br|[0-9]{{1,3}})$"),
            re.compile(rf"^dit-[a-z][a-z0-9]{{0,5}}-{rid}-{_NODE_NAME}$"),
            re.compile(
                rf"^dit-[a-z][a-z0-9]{{0,5}}-{rid}(?:/{_NODE_NAME}(?:/{PROCESS_LEAF})?|/{LINKS_LEAF})?$"
            ),
        )

    def _cgroup_refusal(self, value: object) -> str | None:
        if not isinstance(value, str) or not os.path.isabs(value) or os.path.normpath(value) != value:
            return f"cgroup {value!r} is not a plain absolute path"
        root = str(self.cgroup_root)
        relative = os.path.relpath(value, root)
        parts = relative.split("/")
        if parts[0] in CGROUP_CONTROLLERS_V1:
            parts = parts[1:]
        if relative.startswith("..") or not self._patterns()[2].match("/".join(parts)):
            return (
                f"cgroup {value} is not one of this rack's "
                f"({root}/[<controller>/]dit-<name>-{rack_id(self.state_dir)}/<node> or /{LINKS_LEAF})"
            )
        return None

    def refusal(self, op: str, undo: Mapping[str, Any]) -> str | None:
        """Why undoing ``op`` with ``undo`` would reach outside this rack (None: it would not)."""
        link, netns, _ = self._patterns()
        rid = rack_id(self.state_dir)
        if op == "link":
            value = undo.get("link")
            if isinstance(value, str) and link.match(value):
                return None
            return f"link {value!r} is not one of this rack's (dr-{rid}-br, dr-{rid}-<n>)"
        if op == "netns":
            value = undo.get("netns")
            if isinstance(value, str) and netns.match(value):
                return None
            return f"network namespace {value!r} is not one of this rack's (dit-<name>-{rid}-<node>)"
        if op == "cgroup":
            dirs = undo.get("dirs")
            if not isinstance(dirs, list) or not dirs:
                return "cgroup record without a list of directories"
            return next((r for r in map(self._cgroup_refusal, dirs) if r), None)
        if op == "sshd":
            procs = undo.get("procs")
            if not isinstance(procs, list) or not procs:
                return "sshd record without a list of cgroup.procs files"
            for path in procs:
                if not isinstance(path, str) or os.path.basename(path) != "cgroup.procs":
                    return f"sshd record: {path!r} is not a cgroup.procs file"
                refused = self._cgroup_refusal(os.path.dirname(path))
                if refused:
                    return f"sshd record: {refused}"
            pidfile = undo.get("pidfile")
            if pidfile is not None:
                nodes_dir = str(self.state_dir / "nodes")
                if (
                    not isinstance(pidfile, str)
                    or os.path.normpath(pidfile) != pidfile
                    or not pidfile.startswith(nodes_dir + "/")
                ):
                    return f"sshd record: pid file {pidfile!r} is outside {nodes_dir}"
            return None
        return f"{op!r} is not a step rack up takes (link, netns, cgroup, sshd)"


@dataclass(frozen=True)
class HostNetwork:
    """What this machine has already, as far as a new rack could collide with it."""

    links: Mapping[str, str] = field(default_factory=dict)  # name -> its ifalias ("" without)
    addresses: tuple[tuple[str, str], ...] = ()  # (link, "a.b.c.d/prefix"): IPv4 on the host's links
    routes: tuple[tuple[str, str], ...] = ()  # (link, "a.b.c.d/prefix"): the main table, no default
    netns: frozenset[str] = frozenset()
    cgroups: frozenset[str] = frozenset()  # those of the new rack's cgroup directories that exist


def rack_of_alias(alias: str) -> str | None:
    """The state dir a bridge's ``ifalias`` names (:func:`bridge_alias`), or None."""
    return alias[len(BRIDGE_ALIAS_PREFIX) :] if alias.startswith(BRIDGE_ALIAS_PREFIX) else None


def _subnet_taken(net: ipaddress.IPv4Network, host: HostNetwork) -> list[tuple[str, str]]:
    taken: list[tuple[str, str]] = []
    for link, cidr in (*host.addresses, *host.routes):
        try:
            other = ipaddress.ip_interface(cidr).network
        except ValueError:
            continue
        if other.prefixlen > 0 and other.overlaps(net) and link not in {t[0] for t in taken}:
            taken.append((link, cidr))
    return taken


def free_subnet(host: HostNetwork) -> str | None:
    """The first 10.213.x that no address or route of this machine overlaps (a hint, not a lease)."""
    for third in range(256):
        candidate = f"10.213.{third}"
        if not _subnet_taken(ipaddress.IPv4Network(f"{candidate}.0/24"), host):
            return candidate
    return None


def collisions(spec: RackSpec, host: HostNetwork) -> str | None:
    """What of ``spec``'s rack this machine has already, and what to do (None: nothing): its
    links, namespaces and cgroups by name, and its /24 on any link (another rack's bridge, a VPN,
    the uplink). A rack is built only when there is none, so that it never takes, and so never
    removes, what is not its own."""
    found: list[str] = []
    racks: set[str] = set()

    def owner(link: str) -> str:
        state_dir = rack_of_alias(host.links.get(link, ""))
        if state_dir is None:
            return ""
        racks.add(state_dir)
        return f" (the bridge of the rack in {state_dir})"

    for name in [bridge_name(spec), *(n.veth for n in nodes(spec))]:
        if name in host.links:
            found.append(f"link {name} exists already{owner(name)}")
    found += [f"network namespace {n.netns} exists already" for n in nodes(spec) if n.netns in host.netns]
    found += [f"cgroup {path} exists already" for path in sorted(host.cgroups)]
    net = ipaddress.IPv4Network(f"{spec.subnet}.0/24")
    for link, cidr in _subnet_taken(net, host):
        found.append(f"--subnet {spec.subnet}: {net} overlaps {cidr} on {link}{owner(link)}")
    if not found:
        return None
    advice = [f"`dit rack down --state-dir {state_dir}` removes that rack" for state_dir in sorted(racks)]
    if any(f.startswith("--subnet") for f in found):
        free = free_subnet(host)
        advice.append(f"--subnet {free} is free" if free else "choose another --subnet")
    return f"{'; '.join(found)}: nothing was built ({'; '.join(advice) or 'remove them first'})"
