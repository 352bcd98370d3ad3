"""``dit rack up`` / ``status`` / ``down``: run the plan of :mod:`dit.rack.plan` on this machine.

Every step is appended to ``<state dir>/journal.jsonl`` (the run journal's format,
:mod:`dit.run.journal`) *before* it is taken, so ``rack down`` undoes everything newest first even
after ``rack up`` was killed half-way; undoing a step that never happened is harmless. Nothing
that exists already is ever journaled: ``rack up`` refuses to start when any of its names or its
subnet is taken, a step whose object appeared meanwhile is refused before it is journaled, and a
creation whose command failed is marked undone at once (it made nothing), so a failed ``rack up``
cannot remove another rack's bridge. ``rack down`` undoes only records within
:class:`~dit.rack.plan.UndoScope` (docs/rack.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.rack import DEFAULT_SUBNET
from dit.rack.plan import (
    SSHD,
    CgroupLayout,
    HostNetwork,
    Node,
    RackError,
    RackSpec,
    Step,
    UndoScope,
    cgroup_steps,
    client_key,
    collisions,
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
    state_doc,
)
from dit.run.journal import Journal
from dit.run.localmode import make_fake_sysfs
from dit.trusted import others_can_write, owner_name

JOURNAL = "journal.jsonl"
STATE = "rack.json"
INVENTORY = "inventory.yml"
KNOWN_HOSTS = "known_hosts"
#: Everything ``rack up`` puts in its state dir: ``rack down`` removes these and nothing else.
STATE_ENTRIES = (JOURNAL, STATE, INVENTORY, KNOWN_HOSTS, "keys", "nodes")
SOURCE = "dit rack"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SSHD_PRIVSEP = Path("/run/sshd")
#: Held from the collision check until the network exists, so that two `rack up`s at once cannot
#: both find a subnet free and both take it.
HOST_LOCK = Path("/run/dit-rack.lock")
SSH_ANSWER_S = 10.0  # how long `rack status` waits for a node's login


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
    from dit.run.inventory import local_cpu_split

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


def check_state_dir(state_dir: Path, *, building: bool) -> None:
    """Refuse a state dir that anyone but root could write, or that sits below such a directory.

    The state dir holds the key sshd accepts for root on every node and the journal that ``rack
    down`` obeys as root, so it and every directory above it must be root's and not group- or
    world-writable, which is also the rule sshd's StrictModes applies to the authorized keys.
    ``building`` (``rack up``) also refuses a directory holding anything but a rack's own entries,
    or a directory in it that is not root's alone.
    """
    for parent in reversed(state_dir.parents):  # "/" first; the path is resolved, so no links
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            break  # rack up creates the rest, root's with mode 0755
        if others_can_write(st):
            raise RackError(
                f"--state-dir {state_dir}: {parent} above it is owned by {owner_name(st.st_uid)} with mode "
                f"{stat.S_IMODE(st.st_mode):04o}: sshd (StrictModes) refuses the rack's keys below a "
                "directory that is not root's or that others can write, and such a directory lets them "
                "replace the keys and the journal. Choose a state dir whose every parent is root's and "
                "not group- or world-writable (the default: /var/lib/dit/rack)"
            )
    try:
        st = os.lstat(state_dir)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise RackError(f"--state-dir {state_dir}: not a directory")
    if others_can_write(st):
        advice = (
            "Remove it or choose a new directory: rack up creates it root's alone (mode 0700)"
            if building
            else f"Look at {state_dir / JOURNAL}; once you trust it, `chown root:root {state_dir}` and "
            f"`chmod 0700 {state_dir}`, then run `dit rack down` again"
        )
        raise RackError(
            f"--state-dir {state_dir} is owned by {owner_name(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}: "
            "someone else could have planted keys in it or rewritten its journal, so dit neither builds "
            f"a rack there nor obeys its journal. {advice}"
        )
    if not building:
        return
    foreign = sorted(entry.name for entry in os.scandir(state_dir) if entry.name not in STATE_ENTRIES)
    if foreign:
        raise RackError(
            f"--state-dir {state_dir} holds {', '.join(foreign[:5])}{' …' if len(foreign) > 5 else ''}: "
            "not a rack's state dir; choose a new or empty directory"
        )
    for root, dirs, _ in os.walk(state_dir):
        for name in dirs:
            path = Path(root, name)
            st = os.lstat(path)
            if others_can_write(st) or not stat.S_ISDIR(st.st_mode):
                raise RackError(
                    f"{path} is owned by {owner_name(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}, "
                    f"not as rack up makes it: remove {state_dir} or choose another --state-dir"
                )


def _mkdir(path: Path, mode: int) -> None:
    """``path`` as a directory of root's with ``mode`` (the umask left out)."""
    path.mkdir(mode=mode, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RackError(f"{path}: not a directory")
    os.chown(path, 0, 0)
    os.chmod(path, mode)


def _make_dirs(path: Path, mode: int) -> None:
    """``path`` and the parents it lacks (those root's with mode 0755, whatever the umask)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for parent in reversed(missing[1:]):
        _mkdir(parent, 0o755)
    _mkdir(path, mode)


def _write_file(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` as root's with ``mode``, whatever was there, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", closefd=False) as handle:
            handle.write(text)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ip_json(*argv: str) -> list[dict[str, Any]]:
    result = subprocess.run(["ip", "-j", *argv], check=False, capture_output=True, text=True)
    try:
        parsed = json.loads(result.stdout or "[]")
    except ValueError:
        return []
    return [item for item in parsed if isinstance(item, dict)] if isinstance(parsed, list) else []


def host_network(spec: RackSpec, layout: CgroupLayout) -> HostNetwork:
    """This machine's links (with their aliases), IPv4 addresses and routes, network namespaces,
    and which of ``spec``'s cgroups exist: what :func:`dit.rack.plan.collisions` compares."""
    links: dict[str, str] = {}
    for entry in Path("/sys/class/net").iterdir():
        try:
            links[entry.name] = (entry / "ifalias").read_text().strip()
        except OSError:
            links[entry.name] = ""
    addresses = tuple(
        (str(link.get("ifname")), f"{info['local']}/{info['prefixlen']}")
        for link in _ip_json("-4", "addr", "show")
        for info in link.get("addr_info", [])
        if "local" in info and "prefixlen" in info
    )
    routes = tuple(
        (str(route.get("dev") or route.get("type") or "?"), str(route["dst"]))
        for route in _ip_json("-4", "route", "show", "table", "main")
        if route.get("dst") not in (None, "default")
    )
    netns_dir = Path("/run/netns")
    netns = frozenset(os.listdir(netns_dir)) if netns_dir.is_dir() else frozenset()
    parent = cgroup_steps(spec, layout, "0")[0]
    cgroups = frozenset(d for d in parent.undo["dirs"] if os.path.lexists(d))
    return HostNetwork(links, addresses, routes, netns, cgroups)


def _exists(step: Step) -> bool:
    if step.op == "link":
        return os.path.lexists(f"/sys/class/net/{step.undo['link']}")
    if step.op == "netns":
        return os.path.lexists(f"/run/netns/{step.undo['netns']}")
    if step.op == "cgroup":
        return any(os.path.lexists(d) for d in step.undo["dirs"])
    return False


def _preflight() -> None:
    if os.geteuid() != 0:
        raise RackError("dit rack needs root (network namespaces, cgroups, sshd)")
    tools = ((SSHD, "openssh-server"), ("ip", "iproute2"), ("nsenter", "util-linux"), ("tc", "iproute2"))
    for tool, package in tools:
        hint = f"apt-get install {package}"
        if shutil.which(tool) is None:
            raise RackError(f"{tool} not found ({hint})")
    for tool in ("ssh-keygen", "ssh"):
        if shutil.which(tool) is None:
            raise RackError(f"{tool} not found (apt-get install openssh-client)")


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
        change: list[str] = []
        if step.op != "noop":
            if _exists(step):
                # The collision check found it free: someone made it since. Never journal what
                # this rack did not make, or its rollback would remove it.
                raise RackError(f"{step.op} {step.undo} appeared while the rack was built: not touched")
            change = self.journal.record_changes(step.host, [{"op": step.op, "undo": step.undo}], SOURCE)
        try:
            if step.op == "cgroup":
                for directory in step.undo["dirs"]:
                    Path(directory).mkdir(exist_ok=True)  # exist_ok: co-mounted v1 controllers
            if step.argv:
                _run(step.argv)
        except RackError:
            if step.op in ("link", "netns"):  # one command, which made nothing when it failed
                self.journal.mark_undone(change)
            raise
        for write in step.writes:
            if not (write.optional and not write.path.exists()):
                _write(write.path, write.value)

    def up(self, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
        """Build the rack, or refuse before building anything; a failure half-way removes what
        this call built (and only that) before it is reported."""
        spec = self.spec
        spec.validate()
        _preflight()
        check_state_dir(spec.state_dir, building=True)
        if journal_of(spec.state_dir).pending():
            raise RackError(
                f"a rack is already up in {spec.state_dir}: `dit rack down --state-dir {spec.state_dir}` first"
            )
        layout = self.layout = self.layout or detect_layout()
        with _host_lock():
            found = collisions(spec, host_network(spec, layout))
            if found:
                raise RackError(found)
            try:
                return self._build(layout, progress)
            except (RackError, OSError) as exc:
                message = str(exc) if isinstance(exc, RackError) else f"{exc.filename}: {exc.strerror}"
                if not self.journal.path.exists():
                    raise RackError(message) from None
                try:
                    down(spec.state_dir)
                except RackError as cleanup:
                    raise RackError(
                        f"{message}; removing what was built failed too ({cleanup}): "
                        f"run `dit rack down --state-dir {spec.state_dir}`"
                    ) from None
                raise RackError(f"{message} (what was built is removed again)") from None

    def _build(self, layout: CgroupLayout, progress: Callable[[str], None]) -> dict[str, Any]:
        spec = self.spec
        _make_dirs(spec.state_dir, 0o700)
        self._keys()
        if not SSHD_PRIVSEP.is_dir():
            # sshd's privilege-separation directory (Debian's sshd needs it). Not journaled: it is
            # the system's, and another rack's sshd needs it after this rack is gone.
            _mkdir(SSHD_PRIVSEP, 0o755)
        progress("network: bridge, namespaces, veths")
        for step in network_steps(spec):
            self._take(step)
        progress(f"cgroups (v{layout.version}): cpu quota, memory limit, cpuset")
        for step in cgroup_steps(spec, layout, _mems(layout)):
            self._take(step)
        all_nodes = nodes(spec)
        netem, netem_reason = _netem_available(all_nodes[0])
        _mkdir(spec.state_dir / "nodes", 0o755)
        for node in all_nodes:
            self._sshd(node)
        for node in all_nodes:
            _wait_ssh(node.address)
        progress(f"sshd up on {len(all_nodes)} nodes")
        inventory = inventory_yaml(spec, sys.executable, netem_dry_run=not netem, layout=layout)
        _write_file(spec.state_dir / INVENTORY, inventory, 0o644)
        state = state_doc(spec, layout, netem, netem_reason, spec.state_dir / INVENTORY, time.time_ns())
        _write_file(spec.state_dir / STATE, json.dumps(state, indent=2) + "\n", 0o644)
        return state

    def _keys(self) -> None:
        """A fresh host key and controller key per rack, root's alone; the controller's public key
        is the only authorized one."""
        keys = keys_dir(self.spec)
        _mkdir(keys, 0o700)
        host_key, client = keys / "host_ed25519", client_key(self.spec)
        for path in (host_key, client):
            public = Path(f"{path}.pub")
            for old in (path, public):
                old.unlink(missing_ok=True)
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
            for made, mode in ((path, 0o600), (public, 0o644)):
                os.chown(made, 0, 0)
                os.chmod(made, mode)
        _write_file(keys / "authorized_keys", Path(f"{client}.pub").read_text(), 0o600)
        _write_file(
            self.spec.state_dir / KNOWN_HOSTS,
            known_hosts(self.spec, Path(f"{host_key}.pub").read_text()),
            0o644,
        )

    def _sshd(self, node: Node) -> None:
        assert self.layout is not None
        directory = node_dir(self.spec, node)
        _mkdir(directory, 0o755)
        _mkdir(directory / "root", 0o755)
        make_fake_sysfs(directory / "sys", node.role)
        config = directory / "sshd_config"
        _write_file(config, sshd_config(self.spec, node), 0o644)
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
    """Undo one journaled step; a step that never happened (a crash before it) is a no-op. Only
    for a record :class:`~dit.rack.plan.UndoScope` allowed."""
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
    else:
        raise RackError(f"journal: unknown rack step {op!r}")


def _remove_state(state_dir: Path) -> str:
    """Remove what rack up wrote into ``state_dir``, then the directory if that emptied it."""
    if not state_dir.is_dir():
        return "removed"
    foreign = sorted(entry.name for entry in os.scandir(state_dir) if entry.name not in STATE_ENTRIES)
    if foreign:
        return f"kept (it holds {', '.join(foreign[:5])}, which rack up did not write)"
    for name in STATE_ENTRIES:
        path = state_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
    state_dir.rmdir()
    return "removed"


def down(state_dir: Path) -> tuple[int, str]:
    """Undo every pending step within the rack's scope newest first, then remove the state dir.

    Returns the steps undone and what became of the state dir. A record outside
    :class:`~dit.rack.plan.UndoScope` is not undone: every other one is, then the refusals are
    raised (the journal and the state dir stay, the refused records pending).
    """
    if os.geteuid() != 0:
        raise RackError("dit rack down needs root")
    if not os.path.lexists(state_dir):
        return 0, "removed"
    check_state_dir(state_dir, building=False)
    scope = UndoScope(state_dir, CGROUP_ROOT)
    journal = journal_of(state_dir)
    refused: list[str] = []
    undone = 0
    for change in journal.pending():
        reason = scope.refusal(change.op, change.undo)
        if reason is not None:
            refused.append(f"{change.id} ({change.host}, {change.op}): {reason}")
            continue
        undo(change.op, change.undo)
        journal.mark_undone([change.id])
        undone += 1
    if refused:
        raise RackError(
            f"{len(refused)} journal record(s) refused, outside what this rack can create; not undone "
            f"({undone} other steps were): {'; '.join(refused)}. They stay pending in {journal.path}: "
            "find out who wrote them, delete their lines, and run `dit rack down` again"
        )
    return undone, _remove_state(state_dir)


# -- status --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStatus:
    name: str
    address: str
    netns: bool
    cgroup: bool
    link: str  # "ok", or what is wrong with the node's veth on the bridge / the route to it
    ssh: str  # "ok": a login with the rack's key answered over the bridge; else why not
    processes: int  # in the node's cgroup

    @property
    def healthy(self) -> bool:
        return self.netns and self.cgroup and self.link == "ok" and self.ssh == "ok"


def _link_problem(veth: str, bridge: str, address: str) -> str:
    """What keeps the host from reaching ``address`` through ``veth`` on ``bridge`` ("ok": nothing)."""
    net = Path("/sys/class/net")
    if not (net / bridge).exists():
        return f"bridge {bridge} missing"
    if not (net / veth).exists():
        return f"{veth} missing"
    master = net / veth / "master"
    if not master.exists() or master.resolve().name != bridge:
        return f"{veth} not on {bridge}"
    if (net / veth / "operstate").read_text().strip() != "up":
        return f"{veth} down"
    route = _ip_json("route", "get", address)
    device = str(route[0].get("dev")) if route else "none"
    if device != bridge:
        return f"route via {device}, not {bridge}"
    return "ok"


def _ssh_argv(state_dir: Path, address: str) -> list[str]:
    return [
        "ssh", "-F", "/dev/null", "-i", str(state_dir / "keys" / "controller_ed25519"),
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={state_dir / KNOWN_HOSTS}", "-o", "ConnectTimeout=5",
        "-o", "LogLevel=ERROR", f"root@{address}", "true",
    ]  # fmt: skip


def _logins(state_dir: Path, addresses: Sequence[str]) -> list[str]:
    """Log in to every address at once with the rack's key and host key: "ok" or why not."""
    started = [
        subprocess.Popen(
            _ssh_argv(state_dir, address),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for address in addresses
    ]
    deadline = time.monotonic() + SSH_ANSWER_S
    out: list[str] = []
    for process in started:
        try:
            _, stderr = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            out.append(f"no answer in {SSH_ANSWER_S:.0f} s")
            continue
        if process.returncode == 0:
            out.append("ok")
        else:
            last = (stderr.strip().splitlines() or [f"ssh exited {process.returncode}"])[-1]
            out.append(f"no answer: {last}")
    return out


def status(state_dir: Path) -> tuple[dict[str, Any], list[NodeStatus]]:
    """Each node: its namespace and cgroup exist, its veth is up on the rack's bridge with the route
    through it, and its sshd answers a login with the rack's keys (a listening socket alone is not
    enough: a hung sshd still completes the TCP handshake)."""
    check_state_dir(state_dir, building=False)
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
    bridge = str(state.get("bridge", ""))
    links: list[str] = []
    for node in state["nodes"].values():
        veth = node.get("veth")
        links.append(_link_problem(veth, bridge, node["address"]) if veth and bridge else "not recorded")
    # Only over a route through the bridge: never send a login towards another interface.
    reachable = [n["address"] for n, link in zip(state["nodes"].values(), links, strict=True) if link == "ok"]
    logins = dict(zip(reachable, _logins(state_dir, reachable), strict=True))
    rows: list[NodeStatus] = []
    for (name, node), link in zip(state["nodes"].items(), links, strict=True):
        procs = procs_files(layout, process_cgroup(layout, node["cgroup"]))
        rows.append(
            NodeStatus(
                name=name,
                address=node["address"],
                netns=_netns_exists(node["netns"]),
                cgroup=all(p.parent.is_dir() for p in procs),
                link=link,
                ssh=logins.get(node["address"], "not tried"),
                processes=len(_pids_in(procs[0])),
            )
        )
    return state, rows
