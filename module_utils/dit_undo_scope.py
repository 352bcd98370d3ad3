# -*- coding: utf-8 -*-
# Shared by dit's Ansible modules: what undoing a journal record may touch (stdlib only, runs on the node).
"""Confine the undo of a journal record to what the run itself could have changed on this node.

``dit_restore`` runs as root and replays records read from ``journal.jsonl``, a file on the
controller. A record is data, never an order: before undoing one, :func:`check` decides from the
node's *scope* — given by the controller from the inventory and the run's metadata, never from
the journal — whether a module of dit could have journaled it, and refuses it otherwise. Paths
are resolved with ``realpath`` on the node first, so ``..`` and symbolic links cannot lead out, and
the undo then acts on the resolved path. The rules (also in docs/journal.md):

- ``file`` (write back prior content, or delete a file the run created): under the node's run
  directory, beside it in a file named after the run (``<node_root>.*``: the tc dry-run log),
  beside a declared tc dry-run log (its ``.state.json``), under ``<sysfs_root>/devices/system/cpu``
  (cpufreq and turbo attributes; not deleted), or directly in the run's cgroup (not deleted);
- ``mkdir`` (remove the run directory): only the node's run directory, for this run id;
- ``rmdir`` / ``cgroup``: under the node's run directory, or the run's cgroup
  ``<cgroup_root>/…/dit-<run id>-<host>``;
- ``process``: only this run's and this host's processes;
- ``lease``: only ``lease.json`` in the node's dit directory (or ``dit_lease_dir``), for this run id;
- ``command``: only the ``tc`` argv shapes ``dit_tc`` journals (``qdisc del … root``, ``qdisc add``,
  ``class add … htb``, ``filter add … u32 match … flowid``), on an interface the run shaped, and
  with ``dry_run`` only into that interface's declared log; or the ``iptables`` argv ``dit_nfqueue``
  journals (``-t mangle -D POSTROUTING -o IF -j CHAIN``, ``-F CHAIN``, ``-X CHAIN``, maybe through
  ``ip netns exec NS``) for the chain the run installed on that interface (the userspace backend).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

LEASE_FILE = "lease.json"  # the node lease dit_lease takes at preflight (released by a "lease" record)
CPU_SYSFS = "devices/system/cpu"  # the only sysfs subtree dit's modules write (dit_sysfs roles)
# Where tc may be run from: the bare name (found on the module's PATH) or a system directory;
# never a path a journal could point at a binary of its own.
TC_PROGRAMS = ("tc", "/sbin/tc", "/usr/sbin/tc", "/bin/tc", "/usr/bin/tc")
IPTABLES_PROGRAMS = ("iptables", "/sbin/iptables", "/usr/sbin/iptables")
IP_PROGRAMS = ("ip", "/sbin/ip", "/usr/sbin/ip", "/bin/ip", "/usr/bin/ip")
NFQUEUE_CHAIN = re.compile(r"^DIT-[0-9a-f]{12}\Z")  # dit.conditions.netem.nfqueue.chain_name
QDISC_KINDS = ("pfifo", "bfifo", "pfifo_fast", "tbf", "htb", "netem")  # dit_tc's render_qdisc_options
OPTION_WORDS = frozenset(
    [
        "limit",
        "rate",
        "burst",
        "latency",
        "peakrate",
        "mtu",
        "default",
        "r2q",
        "direct_qlen",
        "delay",
        "loss",
        "duplicate",
        "reorder",
        "corrupt",
        "ecn",
        "gap",
        "ceil",
        "cburst",
        "prio",
        "quantum",
    ]
)
# Option values as dit_tc renders them: 1000, 8000000bit, 25000us, 0.5%, 1e-05% (":g"), 0x1 (htb default).
VALUE = re.compile(r"^(0x[0-9a-fA-F]{1,8}|[0-9]{1,20}(\.[0-9]{1,20})?(e-?[0-9]{1,3})?(bit|us|%)?)\Z")
HANDLE = re.compile(r"^[0-9a-fA-F]{1,8}:[0-9a-fA-F]{0,8}\Z")
FILTER_HANDLE = re.compile(r"^[0-9a-fA-F]{1,8}:[0-9a-fA-F]{0,8}:[0-9a-fA-F]{0,8}\Z")
HEX = re.compile(r"^0x[0-9a-fA-F]{1,8}\Z")
INTEGER = re.compile(r"^-?[0-9]{1,10}\Z")
PROTOCOL = re.compile(r"^[a-z0-9_]{1,16}\Z")


class Refused(Exception):
    """The record reaches outside what the run could have changed on this node."""


def _real(path: object, what: str) -> str:
    if not isinstance(path, str) or not os.path.isabs(path):
        raise Refused(f"{what} {path!r} is not an absolute path")
    return os.path.realpath(path)


def _within(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


class Scope:
    """What one node's undo may touch: from the inventory and the run's metadata, never the journal."""

    def __init__(
        self,
        run_id: str,
        host: str,
        node_root: str | None = None,
        sysfs_root: str | None = "/sys",
        cgroup_root: str | None = "/sys/fs/cgroup",
        interfaces: Iterable[dict[str, Any]] = (),
        lease_dir: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.host = host
        self.node_root = os.path.realpath(node_root) if node_root else None
        # The node's lease (lease.json) lives in its dit directory, the run directory's parent,
        # unless the inventory moves it (dit_lease_dir).
        lease = lease_dir or (os.path.dirname(self.node_root) if self.node_root else None)
        self.lease_dir = os.path.realpath(lease) if lease else None
        sysfs = os.path.realpath(sysfs_root or "/sys")
        # As dit_sysfs: a root of "/" stands for /sys itself.
        self.cpu_sysfs = os.path.join("/sys" if sysfs == "/" else sysfs, CPU_SYSFS)
        self.cgroup_root = os.path.realpath(cgroup_root or "/sys/fs/cgroup")
        self.cgroup_name = f"dit-{run_id}-{host}"
        self.interfaces: dict[
            tuple[str, str], str
        ] = {}  # (dev, netns) -> the real path of its dry-run log ("" for none)
        self.chains: set[tuple[str, str, str]] = set()  # (chain, dev, netns) the userspace backend installed
        for item in interfaces or ():
            log = item.get("log") or ""
            key = (str(item.get("dev") or ""), str(item.get("netns") or ""))
            self.interfaces[key] = os.path.realpath(log) if log else ""
            if item.get("chain"):
                self.chains.add((str(item["chain"]), *key))

    # -- areas ---------------------------------------------------------------------------------
    def in_node_area(self, real: str) -> bool:
        """Under the run directory, or a file beside it named after the run (``<node_root>.*``)."""
        if self.node_root is None:
            return False
        if _within(real, self.node_root):
            return True
        parent, name = os.path.split(self.node_root)
        return os.path.dirname(real) == parent and os.path.basename(real).startswith(name + ".")

    def is_tc_state(self, real: str) -> bool:
        """dit_tc's dry-run state file beside a declared log: ``<log>.[<netns>.]<dev>.state.json``."""
        return any(
            log
            and os.path.dirname(real) == os.path.dirname(log)
            and real.startswith(log + ".")
            and real.endswith(".state.json")
            for log in self.interfaces.values()
        )

    def is_run_cgroup(self, real: str) -> bool:
        return (
            _within(real, self.cgroup_root)
            and real != self.cgroup_root
            and os.path.basename(real) == self.cgroup_name
        )

    def where(self) -> str:
        """The areas, for a refusal message (short: one message per refused record)."""
        node = "the run's node directory" if self.node_root else "(no node directory declared)"
        return f"{node}, <sysfs>/{CPU_SYSFS} and the run's cgroup {self.cgroup_name}"

    # -- records -------------------------------------------------------------------------------
    def check(self, op: object, undo: object) -> dict[str, Any]:
        """The undo data with resolved paths, or :class:`Refused` saying why not."""
        if not isinstance(undo, dict):
            raise Refused("its undo data is not an object")
        check = getattr(self, "_check_" + str(op), None)
        if check is None:
            raise Refused(f"unknown journal op {op!r}")
        result: dict[str, Any] = check(undo)
        return result

    def _check_process(self, undo: dict[str, Any]) -> dict[str, Any]:
        if undo.get("run_id") != self.run_id or undo.get("host") != self.host:
            raise Refused(
                "it names processes of run {!r} on {!r}, not of run {} on {}".format(
                    undo.get("run_id"), undo.get("host"), self.run_id, self.host
                )
            )
        return undo

    def _check_mkdir(self, undo: dict[str, Any]) -> dict[str, Any]:
        real = _real(undo.get("path"), "directory")
        if self.node_root is None or real != self.node_root or undo.get("run_id") != self.run_id:
            raise Refused(f"{real} is not this run's node directory ({self.node_root})")
        return {**undo, "path": real}

    def _check_file(self, undo: dict[str, Any]) -> dict[str, Any]:
        real = _real(undo.get("path"), "file")
        prior = undo.get("prior")
        if prior is not None and not isinstance(prior, str):
            raise Refused(f"the prior content of {real} is not text")
        if self.in_node_area(real) or self.is_tc_state(real):
            return {**undo, "path": real}
        attribute = _within(real, self.cpu_sysfs) or self.is_run_cgroup(os.path.dirname(real))
        if attribute and prior is not None:  # kernel attributes are written back, never deleted
            return {**undo, "path": real}
        raise Refused(f"{'deleting ' if prior is None else ''}{real} is outside {self.where()}")

    def _check_rmdir(self, undo: dict[str, Any]) -> dict[str, Any]:
        real = _real(undo.get("path"), "directory")
        if (self.in_node_area(real) and real != self.node_root) or self.is_run_cgroup(real):
            return {**undo, "path": real}
        raise Refused(f"{real} is outside {self.where()}")

    def _check_cgroup(self, undo: dict[str, Any]) -> dict[str, Any]:
        real = _real(undo.get("path"), "cgroup")
        if not self.is_run_cgroup(real):
            raise Refused(f"{real} is not this run's cgroup {self.cgroup_root}/.../{self.cgroup_name}")
        return {**undo, "path": real}

    def _check_lease(self, undo: dict[str, Any]) -> dict[str, Any]:
        real = _real(undo.get("path"), "lease")
        if (
            self.lease_dir is None or os.path.dirname(real) != self.lease_dir
            or os.path.basename(real) != LEASE_FILE or undo.get("run_id") != self.run_id
        ):  # fmt: skip
            raise Refused(f"{real} is not this node's lease ({self.lease_dir}/{LEASE_FILE}) of this run")
        return {**undo, "path": real}

    def _check_command(self, undo: dict[str, Any]) -> dict[str, Any]:
        argv = undo.get("argv")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise Refused("its argv is not a list of strings")
        if argv and (argv[0] in IPTABLES_PROGRAMS or argv[0] in IP_PROGRAMS):
            return self._check_iptables(undo, argv)
        dev, netns = tc_target(argv)
        if (dev, netns) not in self.interfaces:
            raise Refused(
                "{} is not an interface this run shaped ({})".format(
                    f"{dev} in netns {netns}" if netns else dev,
                    ", ".join(sorted(d + (f" in netns {n}" if n else "") for d, n in self.interfaces))
                    or "none",
                )
            )
        if undo.get("dry_run"):
            log = self.interfaces[(dev, netns)]
            if not log or _real(undo.get("log"), "log") != log:
                raise Refused(f"its dry-run log {undo.get('log')!r} is not the log declared for {dev}")
            return {**undo, "log": log}
        return undo

    def _check_iptables(self, undo: dict[str, Any], argv: list[str]) -> dict[str, Any]:
        chain, dev, netns = iptables_target(argv)
        if dev is None:
            if not any(c == chain and n == netns for c, _, n in self.chains):
                raise Refused(f"chain {chain} is not the chain this run installed ({self._chains()})")
        elif (chain, dev, netns) not in self.chains:
            raise Refused(f"the jump from {dev} to {chain} is not one this run installed ({self._chains()})")
        return {**undo, "dry_run": False}

    def _chains(self) -> str:
        return (
            ", ".join(sorted(f"{c} on {d}" + (f" in netns {n}" if n else "") for c, d, n in self.chains))
            or "none"
        )


def iptables_target(argv: list[str]) -> tuple[str, str | None, str]:
    """``(chain, dev or None, netns)`` of an argv of the shapes dit_nfqueue journals; :class:`Refused`
    for any other."""

    def bad(why: str) -> Refused:
        return Refused(f"argv {argv} is not an iptables undo dit_nfqueue journals: {why}")

    rest, netns = list(argv), ""
    if rest and rest[0] in IP_PROGRAMS:
        if len(rest) < 5 or rest[1:3] != ["netns", "exec"]:
            raise bad("expected ip netns exec <netns> iptables ...")
        if not re.match(r"^[A-Za-z0-9_.-]{1,64}\Z", rest[3]) or rest[3].startswith("-"):
            raise bad("bad netns")
        netns, rest = rest[3], rest[4:]
    if not rest or rest[0] not in IPTABLES_PROGRAMS:
        raise bad(f"the program must be one of {', '.join(IPTABLES_PROGRAMS)}")
    if rest[1:4] != ["-w", "-t", "mangle"]:
        raise bad("expected -w -t mangle")
    tail = rest[4:]
    if len(tail) == 2 and tail[0] in ("-F", "-X") and NFQUEUE_CHAIN.match(tail[1]):
        return tail[1], None, netns
    if (
        len(tail) == 6 and tail[:3] == ["-D", "POSTROUTING", "-o"] and tail[4] == "-j"
        and NFQUEUE_CHAIN.match(tail[5]) and re.match(r"^[A-Za-z0-9_.:@-]{1,15}\Z", tail[3])
        and not tail[3].startswith("-")
    ):  # fmt: skip
        return tail[5], tail[3], netns
    raise bad("expected -F CHAIN, -X CHAIN or -D POSTROUTING -o IF -j CHAIN of a DIT- chain")


def tc_target(argv: list[str]) -> tuple[str, str]:
    """``(dev, netns)`` of an argv of the shapes dit_tc journals; :class:`Refused` for any other."""

    def bad(why: str) -> Refused:
        return Refused(f"argv {argv} is not a tc undo dit_tc journals: {why}")

    if not argv or argv[0] not in TC_PROGRAMS:
        raise bad(f"the program must be one of {', '.join(TC_PROGRAMS)}")
    rest, netns = argv[1:], ""
    if rest[:1] == ["-n"]:
        if len(rest) < 2 or not re.match(r"^[A-Za-z0-9_.-]{1,64}\Z", rest[1]) or rest[1].startswith("-"):
            raise bad("bad netns")
        rest, netns = rest[2:], rest[1]
    if len(rest) < 4 or rest[2] != "dev":
        raise bad("expected <object> <verb> dev <interface>")
    kind, verb, dev, tail = rest[0], rest[1], rest[3], rest[4:]
    if not re.match(r"^[A-Za-z0-9_.:@-]{1,15}\Z", dev) or dev.startswith("-"):
        raise bad("bad interface name")
    if (kind, verb) == ("qdisc", "del"):
        if tail != ["root"]:
            raise bad("a qdisc is only deleted at the root")
    elif (kind, verb) == ("qdisc", "add"):
        _, tail = _parent(tail, bad, root_allowed=True)
        if len(tail) < 3 or tail[0] != "handle" or not HANDLE.match(tail[1]) or tail[2] not in QDISC_KINDS:
            raise bad(f"expected handle <major:> <{'|'.join(QDISC_KINDS)}>")
        _options(tail[3:], bad)
    elif (kind, verb) == ("class", "add"):
        _, tail = _parent(tail, bad, root_allowed=False)
        if len(tail) < 3 or tail[0] != "classid" or not HANDLE.match(tail[1]) or tail[2] != "htb":
            raise bad("expected classid <id> htb")
        _options(tail[3:], bad)
    elif (kind, verb) == ("filter", "add"):
        _, tail = _parent(tail, bad, root_allowed=False)
        head, tail = tail[:7], tail[7:]
        if (
            len(head) < 7
            or head[0] != "protocol"
            or not PROTOCOL.match(head[1])
            or head[2] != "prio"
            or not INTEGER.match(head[3])
            or head[4] != "handle"
            or not FILTER_HANDLE.match(head[5])
            or head[6] != "u32"
        ):
            raise bad("expected protocol <p> prio <n> handle <fh> u32")
        while tail[:2] == ["match", "u32"]:
            m = tail[:6]
            if (
                len(m) < 6
                or not HEX.match(m[2])
                or not HEX.match(m[3])
                or m[4] != "at"
                or not INTEGER.match(m[5])
            ):
                raise bad("expected match u32 <hex> <hex> at <offset>")
            tail = tail[6:]
        if len(tail) != 2 or tail[0] != "flowid" or not HANDLE.match(tail[1]):
            raise bad("a u32 filter ends with flowid <class>")
    else:
        raise bad(f"{kind} {verb} is not an undo dit_tc journals")
    return dev, netns


def _parent(tail: list[str], bad: Callable[[str], Refused], root_allowed: bool) -> tuple[str, list[str]]:
    if root_allowed and tail[:1] == ["root"]:
        return "root", tail[1:]
    if len(tail) >= 2 and tail[0] == "parent" and HANDLE.match(tail[1]):
        return tail[1], tail[2:]
    raise bad("expected {}parent <handle>".format("root or " if root_allowed else ""))


def _options(words: list[str], bad: Callable[[str], Refused]) -> None:
    for word in words:
        if word not in OPTION_WORDS and not VALUE.match(word):
            raise bad(f"option {word!r}")
