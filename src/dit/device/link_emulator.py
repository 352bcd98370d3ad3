"""The userspace link emulator: delay, jitter and loss applied to queued packets (stdlib only).

On a kernel without ``sch_netem`` the network condition's ``userspace`` backend sends the shaped
traffic of a node to NFQUEUE (iptables rules, one queue number per profile: the main profile and
each destination's) and this process holds every queued packet for its delay before it gives the
kernel its verdict. It speaks nfnetlink_queue itself, over an ``AF_NETLINK`` socket of family
``NETLINK_NETFILTER``, instead of binding libnetfilter_queue (PyPI ``netfilterqueue``): that binding
is an sdist that needs a C compiler and ``libnetfilter-queue-dev`` on every node and an aarch64
build the mirror cannot make, while the protocol is a handful of fixed structs
(``include/uapi/linux/netfilter/nfnetlink_queue.h``), so the emulator ships in the device zipapp
like every other node process, with nothing to build or lock.

How a packet is held (the precision is engineered, not hoped for):

- its release instant is ``arrival + delay`` on ``time.monotonic_ns()`` (an absolute clock, as the
  timed start), where ``delay`` is the profile's delay plus jitter drawn uniformly from
  ``[-jitter, +jitter]`` (netem's distribution without a table), clipped at 0;
- order within a flow (protocol, addresses, ports) is kept: a packet is never released before the
  one ahead of it in its flow (netem reorders under jitter; a TCP flow here does not), so its
  scheduled hold can exceed the drawn delay (counted as ``held_for_order``);
- the process sleeps in ``select`` until :data:`SPIN_NS` before the next release, then spins,
  reading the socket without blocking so arrivals during the spin get their own timestamp;
- verdicts due together go to the kernel in one ``send``: an ``NFQNL_MSG_VERDICT_BATCH`` when they are
  the oldest packets of their queue, single verdicts concatenated otherwise;
- it asks for ``SCHED_FIFO`` and ``mlockall`` and records whether the kernel allowed them;
- loss is decided on arrival (``NF_DROP``), per packet, as netem's ``loss random P [C]`` decides it:
  independent (``random() < P``) without a correlation; with ``loss_correlation_pct`` C each draw is
  ``u = C * u_prev + (1 - C) * random()`` (the first ``u_prev`` a fresh ``random()``, as the kernel's
  ``init_crandom``) and the packet is lost when ``u < P`` (:meth:`Profile.lost`). The draws stay
  uniform in mean (1/2) but narrow around it as C grows, so the mean loss stays P only at P = 50 %:
  below it the loss falls (10 % with C = 50 % loses about 0.11 %, :func:`expected_loss`), which is
  why tc-netem(8) calls the correlation deprecated. The emulator keeps netem's meaning so that both
  backends apply a scenario alike; it counts the losses and their runs (``loss_bursts``,
  ``longest_loss_burst``).

Fail closed: the queue is bound without ``NFQA_CFG_F_FAIL_OPEN`` and the iptables rules carry no
``--queue-bypass``, so while no emulator listens the shaped traffic is dropped, never passed
undelayed; the kernel's own counters (``/proc/net/netfilter/nfnetlink_queue``: queue full, user
dropped) and the socket's overflows (``ENOBUFS``) are counted, never silent.

The delay of the main profile varies over time through the same path as netem's: the
``netem-vary`` process (:mod:`dit.device.netem_vary`) runs its schedule and, instead of running
``tc qdisc change``, sends each step's delay to this process's control socket (a UNIX datagram
socket, ``{"delay_ms": ...}``), logging the change in ``netem_changes.csv`` as it does for tc.

``link_emulator.json`` in the results directory holds per profile the packets, drops, and a
histogram of ``actual - scheduled`` hold time (no per-packet log on the hot path); it is rewritten
about every second (``state: running``: the collect stage fetches it while the emulator still
shapes the self-check's pings) and at exit (SIGTERM: every held packet is released at once,
``state: stopped``). A process killed outright stops writing; the collect stage's process check
reports it failed, and the network self-check names its link as degraded. SIGHUP hands it over to a
sweep's next variant (the same link in force, the variant's directory emptied): it counts afresh, from
generators seeded as at its start, and writes the file at once, as a new emulator would.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.device.common import ConfigError, require, write_json

STATS_FILE = "link_emulator.json"
NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_PAYLOAD = 1, 2, 10
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_PACKET = 2
NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO = 0x1, 0x4
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR, NLMSG_DONE = 2, 3
NF_DROP, NF_ACCEPT = 0, 1
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host byte order)
NFGEN_HDR = struct.Struct("!BBH")  # family, version, res_id (the queue number, network order)
NLA_HDR = struct.Struct("=HH")
COPY_RANGE = 64  # enough of each packet for its IP and transport headers (the flow key)
DEFAULT_MAXLEN = 10_000  # packets the kernel holds for one queue before it drops (counted)
RCVBUF_BYTES = 8 << 20
SPIN_NS = 200_000  # the last 200 µs before a release are a busy wait (select wakes up late)
FIFO_PRIORITY = 20
MCL_CURRENT, MCL_FUTURE = 1, 2
PR_SET_TIMERSLACK = 29
SNAPSHOT_NS = 1_000_000_000  # link_emulator.json is rewritten about every second while running ...
SNAPSHOT_GAP_NS = 5_000_000  # ... when no release is due within 5 ms
# Histogram of (actual - scheduled) hold time: upper bounds in µs, the last bucket open.
ERROR_BOUNDS_US = (0, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000)


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = NLA_HDR.size + len(payload)
    return NLA_HDR.pack(length, kind) + payload + b"\0" * (_align(length) - length)


def message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    """An nfnetlink_queue message (``msg``: NFQNL_MSG_*) for ``queue``."""
    body = NFGEN_HDR.pack(socket.AF_UNSPEC, 0, queue) + attrs
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), kind, flags, seq, 0) + body


def config_messages(queue: int, maxlen: int, seq: int) -> list[bytes]:
    """Bind ``queue``, copy the headers, bound its length, GSO on and fail-open explicitly off."""
    flags = NLM_F_REQUEST | NLM_F_ACK
    bind = attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
    params = attr(NFQA_CFG_PARAMS, struct.pack("!IB", COPY_RANGE, NFQNL_COPY_PACKET))
    tuning = (
        attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
        # The mask names the flags set here: GSO on (a TCP super-packet is queued whole, not
        # segmented in software), FAIL_OPEN off (a full queue drops, it never passes undelayed).
        + attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))
        + attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
    )
    return [
        message(NFQNL_MSG_CONFIG, queue, bind, flags, seq),
        message(NFQNL_MSG_CONFIG, queue, params + tuning, flags, seq + 1),
    ]


def verdict_message(queue: int, packet_id: int, verdict: int, batch: bool = False) -> bytes:
    """One verdict; with ``batch`` it applies to every packet of ``queue`` up to ``packet_id``."""
    body = attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))
    return message(NFQNL_MSG_VERDICT_BATCH if batch else NFQNL_MSG_VERDICT, queue, body)


@dataclass(frozen=True)
class Packet:
    queue: int
    packet_id: int
    payload: bytes


def parse(buffer: bytes) -> tuple[list[Packet], list[int]]:
    """The queued packets in a datagram, and the error codes of any acks (0: success)."""
    packets: list[Packet] = []
    errors: list[int] = []
    offset = 0
    while offset + NLMSG_HDR.size <= len(buffer):
        length, kind, _flags, _seq, _pid = NLMSG_HDR.unpack_from(buffer, offset)
        if length < NLMSG_HDR.size or offset + length > len(buffer):
            break
        body = offset + NLMSG_HDR.size
        if kind == NLMSG_ERROR:
            errors.append(-struct.unpack_from("=i", buffer, body)[0])
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            queue = NFGEN_HDR.unpack_from(buffer, body)[2]
            packet_id, payload = -1, b""
            pos, end = body + NFGEN_HDR.size, offset + length
            while pos + NLA_HDR.size <= end:
                alen, atype = NLA_HDR.unpack_from(buffer, pos)
                if alen < NLA_HDR.size:
                    break
                data = pos + NLA_HDR.size
                atype &= NLA_TYPE_MASK
                if atype == NFQA_PACKET_HDR:
                    packet_id = struct.unpack_from("!I", buffer, data)[0]
                elif atype == NFQA_PAYLOAD:
                    payload = bytes(buffer[data : pos + alen])
                pos += _align(alen)
            if packet_id >= 0:
                packets.append(Packet(queue, packet_id, payload))
        offset += _align(length)
    return packets, errors


def flow_key(queue: int, payload: bytes) -> tuple[Any, ...]:
    """Protocol, addresses and ports of an IPv4/IPv6 packet (the queue alone when unreadable)."""
    if len(payload) >= 20 and payload[0] >> 4 == 4:
        ihl = (payload[0] & 0x0F) * 4
        proto = payload[9]
        ports = payload[ihl : ihl + 4] if proto in (6, 17) else b""
        return (queue, proto, payload[12:20], ports)
    if len(payload) >= 40 and payload[0] >> 4 == 6:
        proto = payload[6]
        ports = payload[40:44] if proto in (6, 17) else b""
        return (queue, proto, payload[8:40], ports)
    return (queue,)


@dataclass
class Profile:
    """What one queue does to its packets, and what happened to them."""

    name: str
    queue: int
    delay_ns: int
    jitter_ns: int
    loss: float  # probability
    rng: random.Random
    loss_correlation: float = 0.0  # netem's loss correlation, 0..1
    packets: int = 0
    dropped_loss: int = 0
    loss_bursts: int = 0  # runs of consecutive lost packets
    longest_loss_burst: int = 0
    _loss_run: int = field(default=0, init=False, repr=False)
    _loss_draw: float | None = field(default=None, init=False, repr=False)  # netem's crndstate.last
    released: int = 0
    held_for_order: int = 0
    sum_intended_ns: int = 0
    sum_actual_ns: int = 0
    max_error_ns: int = 0
    errors: list[int] = field(default_factory=lambda: [0] * (len(ERROR_BOUNDS_US) + 1))

    def draw_delay_ns(self) -> int:
        if self.jitter_ns <= 0:
            return self.delay_ns
        return max(0, self.delay_ns + round(self.rng.uniform(-self.jitter_ns, self.jitter_ns)))

    def lost(self) -> bool:
        """Whether the next packet is lost (netem's ``loss random``); counts the runs of losses."""
        if self.loss <= 0:
            return False
        if self.loss_correlation > 0:
            if self._loss_draw is None:  # the state's first value: a fresh draw, as netem's init_crandom
                self._loss_draw = self.rng.random()
            draw = self.loss_correlation * self._loss_draw + (1.0 - self.loss_correlation) * self.rng.random()
            self._loss_draw = draw
        else:
            draw = self.rng.random()
        if draw < self.loss:
            if self._loss_run == 0:
                self.loss_bursts += 1
            self._loss_run += 1
            self.longest_loss_burst = max(self.longest_loss_burst, self._loss_run)
            return True
        self._loss_run = 0
        return False

    def record(self, intended_ns: int, scheduled_ns: int, actual_ns: int) -> None:
        """One released packet: its drawn delay, its scheduled and its actual hold."""
        self.released += 1
        self.sum_intended_ns += intended_ns
        self.sum_actual_ns += actual_ns
        error = actual_ns - scheduled_ns
        self.max_error_ns = max(self.max_error_ns, error)
        self.errors[bucket(error)] += 1

    def begin_segment(self, rng: random.Random) -> None:
        """Count afresh, drawing from ``rng`` (a new generator seeded as at the start): a sweep's next
        variant gets the figures and the draws a new emulator would have given it."""
        self.rng, self._loss_run, self._loss_draw = rng, 0, None
        self.packets = self.dropped_loss = self.loss_bursts = self.longest_loss_burst = 0
        self.released = self.held_for_order = 0
        self.sum_intended_ns = self.sum_actual_ns = self.max_error_ns = 0
        self.errors = [0] * (len(ERROR_BOUNDS_US) + 1)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queue": self.queue,
            "delay_ms": self.delay_ns / 1e6,
            "jitter_ms": self.jitter_ns / 1e6,
            "loss_pct": self.loss * 100,
            "loss_correlation_pct": self.loss_correlation * 100,
            "packets": self.packets,
            "dropped_loss": self.dropped_loss,
            "loss_bursts": self.loss_bursts,
            "mean_loss_burst": self.dropped_loss / self.loss_bursts if self.loss_bursts else None,
            "longest_loss_burst": self.longest_loss_burst,
            "released": self.released,
            "held_for_order": self.held_for_order,
            "mean_intended_ms": self.sum_intended_ns / self.released / 1e6 if self.released else None,
            "mean_actual_ms": self.sum_actual_ns / self.released / 1e6 if self.released else None,
            "max_error_us": self.max_error_ns / 1e3 if self.released else None,
            "error_histogram": histogram_rows(self.errors),
        }


def bucket(error_ns: int) -> int:
    """The histogram bucket of a hold-time error (``actual - scheduled``)."""
    us = error_ns / 1e3
    for index, bound in enumerate(ERROR_BOUNDS_US):
        if us <= bound:
            return index
    return len(ERROR_BOUNDS_US)


def histogram_rows(counts: Sequence[int]) -> list[dict[str, Any]]:
    """``[{"upto_us": bound or None (open), "packets": n}, ...]``; the first bucket is ``<= 0``."""
    bounds: list[int | None] = [*ERROR_BOUNDS_US, None]
    return [{"upto_us": b, "packets": int(n)} for b, n in zip(bounds, counts, strict=True)]


def quantile_upto_us(counts: Sequence[int], q: float) -> int | None:
    """The histogram's upper bound (µs) under which a fraction ``q`` of the packets fell."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= q * total:
            return ERROR_BOUNDS_US[index] if index < len(ERROR_BOUNDS_US) else None
    return None


def _integral_at(integral: Sequence[float], x: float, step: float) -> float:
    """The integral of a distribution function on ``[0, 1]`` (tabulated every ``step``) up to ``x``."""
    if x <= 0:
        return 0.0
    n = len(integral) - 1
    j = int(x / step)
    if j >= n:
        return integral[n] + (x - 1.0)  # the function is 1 beyond 1
    return integral[j] + (integral[j + 1] - integral[j]) * (x / step - j)


def expected_loss(loss: float, correlation: float, step: float = 1e-4) -> float:
    """The long-run fraction of packets :meth:`Profile.lost` (and netem's ``loss P C``) drops.

    ``loss`` and ``correlation`` are fractions. In its stationary state a correlated draw is
    ``u = sum_k (1 - C) * C**k * v_k`` over independent uniform ``v_k``, a sum of scaled uniforms:
    its distribution function is built here on a grid of ``step`` by convolving one uniform
    ``[0, (1 - C) C**k]`` at a time (a moving average of the running distribution's integral),
    the terms narrower than ten grid steps taken together at their mean. The loss is ``P(u < loss)``:
    ``loss`` itself without a correlation or at 50 %, less below 50 % and more above as C grows.
    Within about 1e-5 up to C = 0.75 and 1e-4 at 0.9 (against a five times finer grid), in a second
    or less: for tests, figures and documentation, not for the hot path.
    """
    if not 0 <= loss <= 1 or not 0 <= correlation <= 0.95:
        raise ValueError(f"loss {loss} must be in 0..1 and correlation {correlation} in 0..0.95")
    if correlation == 0 or loss in (0, 1):
        return loss
    n = round(1 / step)
    widths: list[float] = []
    width = 1.0 - correlation
    while width >= 10 * step:
        widths.append(width)
        width *= correlation
    shift = (1.0 - sum(widths)) / 2  # the narrow terms: their mean, their spread below a step
    narrowest = widths.pop()
    cdf = [min(1.0, max(0.0, (i * step - shift) / narrowest)) for i in range(n + 1)]
    for width in reversed(widths):
        integral = [0.0] * (n + 1)  # of the distribution function, trapezoids
        for i in range(1, n + 1):
            integral[i] = integral[i - 1] + (cdf[i - 1] + cdf[i]) * step / 2
        cdf = [(integral[i] - _integral_at(integral, i * step - width, step)) / width for i in range(n + 1)]
    j = min(int(loss / step), n - 1)
    return cdf[j] + (cdf[j + 1] - cdf[j]) * (loss / step - j)


class Schedule:
    """Held packets by release instant; flow order kept (pure: the clock is passed in)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, int, int, int]] = []
        self._seq = 0
        self._last: dict[tuple[Any, ...], int] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, profile: Profile, packet: Packet, now_ns: int) -> None:
        intended = profile.draw_delay_ns()
        key = flow_key(packet.queue, packet.payload)
        due = now_ns + intended
        previous = self._last.get(key)
        if previous is not None and previous > due:
            due = previous
            profile.held_for_order += 1
        self._last[key] = due
        if len(self._last) > 65_536:  # forget flows whose last packet has left
            self._last = {k: v for k, v in self._last.items() if v > now_ns}
        heapq.heappush(self._heap, (due, self._seq, packet.queue, packet.packet_id, now_ns, intended))
        self._seq += 1

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ns: int) -> list[tuple[int, int, int, int, int]]:
        """``(queue, packet_id, due, arrival, intended)`` of every packet due by ``now_ns``."""
        out = []
        while self._heap and self._heap[0][0] <= now_ns:
            due, _, queue, packet_id, arrival, intended = heapq.heappop(self._heap)
            out.append((queue, packet_id, due, arrival, intended))
        return out

    def pop_all(self) -> list[tuple[int, int, int, int, int]]:
        return self.pop_due(1 << 62)


def verdicts(released: Iterable[tuple[int, int]], pending: Mapping[int, dict[int, None]]) -> bytes:
    """Accept verdicts for ``(queue, packet_id)`` pairs, one send's worth.

    ``pending`` maps each queue to its unanswered packet ids in arrival order (the ids the kernel
    numbers increasingly per queue); they are removed here. A queue whose released packets are its
    oldest unanswered ones gets one ``NFQNL_MSG_VERDICT_BATCH`` (everything up to the highest id),
    any other release single verdicts.
    """
    by_queue: dict[int, list[int]] = {}
    for queue, packet_id in released:
        by_queue.setdefault(queue, []).append(packet_id)
    out = bytearray()
    for queue, ids in by_queue.items():
        waiting = pending.get(queue, {})
        chosen = set(ids)
        prefix = 0
        for packet_id in waiting:
            if packet_id not in chosen:
                break
            prefix += 1
        if prefix == len(ids) and len(ids) > 1:
            out += verdict_message(queue, max(ids), NF_ACCEPT, batch=True)
        else:
            for packet_id in ids:
                out += verdict_message(queue, packet_id, NF_ACCEPT)
        for packet_id in ids:
            waiting.pop(packet_id, None)
    return bytes(out)


def profile_rng(cfg: Mapping[str, Any], name: str) -> random.Random:
    """The generator of profile ``name`` of the emulator configured by ``cfg``, seeded like netem-vary's
    (the run's seed and the device): the same draws on every run."""
    device = cfg.get("device", cfg.get("host", ""))
    return random.Random(f"{cfg.get('seed', 0)}:{device}:{name}")


def since(counters: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel's queue counters ``counters`` counted from ``base`` (an earlier read) on: the drops
    since then (``waiting`` is a level, not a count)."""
    out: dict[str, Any] = {}
    for queue, values in counters.items():
        before = base.get(queue)
        if not isinstance(values, Mapping) or not isinstance(before, Mapping):
            out[queue] = values
            continue
        out[queue] = {
            key: value - before.get(key, 0) if key != "waiting" and isinstance(value, int) else value
            for key, value in values.items()
        }
    return out


def kernel_queue_counters(
    queues: Iterable[int], path: str = "/proc/net/netfilter/nfnetlink_queue"
) -> dict[str, Any]:
    """The kernel's counters of ``queues``: waiting, dropped (queue full), user dropped (no room in
    the socket)."""
    wanted = set(queues)
    out: dict[str, Any] = {}
    try:
        with open(path, encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        return {"error": str(exc)}
    for line in lines:
        fields = line.split()
        if len(fields) >= 7 and int(fields[0]) in wanted:
            out[fields[0]] = {
                "waiting": int(fields[2]),
                "queue_dropped": int(fields[5]),
                "user_dropped": int(fields[6]),
            }
    return out


def realtime() -> dict[str, Any]:
    """Ask for SCHED_FIFO, locked memory and no timer slack; say what the kernel allowed."""
    out: dict[str, Any] = {}
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
        out["sched_fifo"] = FIFO_PRIORITY
    except (OSError, AttributeError) as exc:
        out["sched_fifo"] = f"refused: {exc}"
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mlockall(MCL_CURRENT | MCL_FUTURE) == 0:
            out["mlockall"] = True
        else:
            out["mlockall"] = f"refused: {os.strerror(ctypes.get_errno())}"
        libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError, ImportError) as exc:
        out.setdefault("mlockall", f"refused: {exc}")
    out["cgroup"] = own_cgroups()
    return out


def own_cgroups(path: str = "/proc/self/cgroup") -> list[str]:
    """The cgroups this process runs in (``/proc/self/cgroup``: ``id:controllers:path`` per hierarchy),
    as ``controllers:path``: where its CPU comes from (the emulated rack's ``links`` cgroup, not a
    node's quota)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return sorted({line.split(":", 1)[1] for line in lines if line.count(":") >= 2})


def _profiles(cfg: Mapping[str, Any]) -> list[Profile]:
    out = []
    for index, item in enumerate(require(cfg, "queues", list)):
        if not isinstance(item, Mapping):
            raise ConfigError(f"queues[{index}]: expected an object")
        try:
            queue = int(item["queue"])
            delay, jitter = float(item.get("delay_ms", 0.0)), float(item.get("jitter_ms", 0.0))
            loss = float(item.get("loss_pct", 0.0))
            correlation = float(item.get("loss_correlation_pct", 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"queues[{index}]: {exc}") from exc
        if not 0 <= queue <= 65535 or delay < 0 or jitter < 0 or not 0 <= loss <= 100:
            raise ConfigError(f"queues[{index}]: queue 0..65535, delay/jitter >= 0, loss 0..100")
        if not 0 <= correlation <= 100:
            raise ConfigError(f"queues[{index}].loss_correlation_pct: {correlation:g} is outside 0..100")
        name = str(item.get("name", queue))
        rng = profile_rng(cfg, name)
        out.append(
            Profile(
                name, queue, round(delay * 1e6), round(jitter * 1e6), loss / 100, rng,
                loss_correlation=correlation / 100,
            )
        )  # fmt: skip
    if not out:
        raise ConfigError("queues: at least one queue")
    return out


class Emulator:
    """The socket, the schedule and the counters of one run of the emulator."""

    def __init__(self, profiles: list[Profile], maxlen: int) -> None:
        self.profiles = {p.queue: p for p in profiles}
        self.schedule = Schedule()
        self.pending: dict[int, dict[int, None]] = {q: {} for q in self.profiles}
        self.enobufs = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF_BYTES)  # SO_RCVBUFFORCE (root)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        self.sock.bind((0, 0))
        self.buffer = bytearray(1 << 16)
        seq = 1
        for queue in self.profiles:
            for msg in config_messages(queue, maxlen, seq):
                self.sock.send(msg)
                code = self._ack()
                if code:
                    raise OSError(code, f"binding NFQUEUE {queue}: {os.strerror(code)}")
            seq += 2
        self.sock.setblocking(False)

    def _ack(self) -> int:
        while True:
            size = self.sock.recv_into(self.buffer)
            _, errors = parse(bytes(self.buffer[:size]))
            if errors:
                return errors[0]

    def receive(self, now_ns: int) -> bytes:
        """Read every queued packet waiting now; hold or drop each. Returns drop verdicts to send."""
        drops = bytearray()
        while True:
            try:
                size = self.sock.recv_into(self.buffer)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # the socket overflowed: the kernel dropped messages
                    self.enobufs += 1
                    continue
                raise
            packets, _ = parse(bytes(self.buffer[:size]))
            for packet in packets:
                profile = self.profiles.get(packet.queue)
                if profile is None:
                    continue
                profile.packets += 1
                if profile.lost():
                    profile.dropped_loss += 1
                    drops += verdict_message(packet.queue, packet.packet_id, NF_DROP)
                    continue
                self.pending[packet.queue][packet.packet_id] = None
                self.schedule.hold(profile, packet, now_ns)
        return bytes(drops)

    def release(self, due: list[tuple[int, int, int, int, int]], now_ns: int) -> None:
        if not due:
            return
        data = verdicts(((q, i) for q, i, _, _, _ in due), self.pending)
        self.send(data)
        for queue, _, scheduled, arrival, intended in due:
            self.profiles[queue].record(intended, scheduled - arrival, now_ns - arrival)

    def send(self, data: bytes) -> None:
        if not data:
            return
        while True:
            try:
                self.sock.send(data)
                return
            except BlockingIOError:
                select.select([], [self.sock], [], 0.01)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.setblocking(True)
            for queue in self.profiles:
                cmd = attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, socket.AF_INET))
                self.sock.send(message(NFQNL_MSG_CONFIG, queue, cmd))
        self.sock.close()


def snapshot(path: Path, data: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically, without the fsync of ``write_json``: on an SD card an fsync can
    stall for tens of milliseconds, and this runs between releases (the final write fsyncs)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def unix_address(path: str) -> Iterator[str]:
    """``path`` as an AF_UNIX address. Addresses hold at most 107 bytes and a node's run directory
    can be longer, so a long path goes through its directory's descriptor (``/proc/self/fd/N/name``),
    open while the address is in use (bind, sendto)."""
    if len(os.fsencode(path)) < 100:
        yield path
        return
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)


def _control_socket(path: str | None) -> socket.socket | None:
    if not path:
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with unix_address(path) as address:
        ctl.bind(address)
    os.chmod(path, 0o600)
    ctl.setblocking(False)
    return ctl


def _control(ctl: socket.socket, main: Profile, changes: list[tuple[int, float]]) -> None:
    """Apply every delay change waiting on the control socket (from netem-vary) to ``main``."""
    while True:
        try:
            data = ctl.recv(4096)
        except BlockingIOError:
            return
        try:
            delay_ms = float(json.loads(data.decode("utf-8"))["delay_ms"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            continue
        if delay_ms >= 0:
            main.delay_ns = round(delay_ms * 1e6)
            changes.append((time.monotonic_ns(), delay_ms))


def run_link_emulator(cfg: Mapping[str, Any]) -> int:
    """The ``link-emulator`` command.

    Config: ``run_id``, ``host``, ``device``, ``seed``, ``results_dir``, ``queues`` (a list of
    ``{queue, name, delay_ms, jitter_ms, loss_pct, loss_correlation_pct}``, the first one the main profile whose delay
    ``netem-vary`` changes), optional ``maxlen`` (packets per queue), ``control_socket`` (path of
    the UNIX datagram socket netem-vary sends delay changes to), ``ready_file`` (written once every
    queue is bound), ``realtime`` (default true: ask for SCHED_FIFO and mlockall) and ``spin_us``
    (the busy wait before each release, :data:`SPIN_NS` by default).
    """
    profiles = _profiles(cfg)
    results = Path(require(cfg, "results_dir", str))
    maxlen = int(cfg.get("maxlen", DEFAULT_MAXLEN))
    spin_ns = round(float(cfg.get("spin_us", SPIN_NS / 1e3)) * 1e3)
    results.mkdir(parents=True, exist_ok=True)
    granted = (
        realtime() if cfg.get("realtime", True) else {"sched_fifo": "not asked", "mlockall": "not asked"}
    )
    try:
        emulator = Emulator(profiles, maxlen)
    except OSError as exc:
        raise ConfigError(f"cannot bind the NFQUEUE queues {[p.queue for p in profiles]}: {exc}") from exc
    ctl = _control_socket(str(cfg.get("control_socket") or "") or None)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    stop: list[int] = []
    handover: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        (handover if signum == signal.SIGHUP else stop).append(signum)

    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    old_fd = signal.set_wakeup_fd(wake_w.fileno())
    changes: list[tuple[int, float]] = []
    started = time.monotonic_ns()
    kernel_base: Mapping[str, Any] = {}  # the kernel's counters at the last hand-over

    def stats(state: str, counters: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "host": cfg.get("host"),
            "device": cfg.get("device", cfg.get("host")),
            "backend": "userspace",
            "state": state,
            "started_mono_ns": started,
            "written_mono_ns": time.monotonic_ns(),
            "stopped_by": signal.Signals(stop[0]).name if stop else ("" if state == "running" else "error"),
            "realtime": granted,
            "spin_us": spin_ns / 1e3,
            "maxlen": maxlen,
            "socket_overflows": emulator.enobufs,
            "kernel": since(counters, kernel_base),
            "delay_changes": [{"t_mono_ns": t, "delay_ms": d} for t, d in changes],
            "profiles": [p.summary() for p in emulator.profiles.values()],
        }

    next_snapshot = started
    if cfg.get("ready_file"):
        write_json(Path(str(cfg["ready_file"])), {"host": cfg.get("host"), "t_mono_ns": started, **granted})
    readers: list[Any] = [emulator.sock, wake_r] + ([ctl] if ctl is not None else [])
    main = profiles[0]
    try:
        while not stop:
            if handover:  # a sweep's next variant: its figures and draws from here on, as a new emulator's
                handover.clear()
                started, kernel_base = time.monotonic_ns(), kernel_queue_counters(emulator.profiles)
                for profile in emulator.profiles.values():
                    profile.begin_segment(profile_rng(cfg, profile.name))
                emulator.enobufs = 0
                changes.clear()
                next_snapshot = started
            now = time.monotonic_ns()
            emulator.send(emulator.receive(now))
            emulator.release(emulator.schedule.pop_due(now), now)
            due = emulator.schedule.next_due()
            # A snapshot for the collect stage (which runs while the emulator still shapes the pings),
            # written where no release is close, or late rather than never.
            if now >= next_snapshot and (
                due is None or due - now > SNAPSHOT_GAP_NS or now - next_snapshot > SNAPSHOT_NS
            ):
                snapshot(results / STATS_FILE, stats("running", kernel_queue_counters(emulator.profiles)))
                next_snapshot = now + SNAPSHOT_NS
                continue
            now = time.monotonic_ns()
            wait_ns = None if due is None else due - now
            if wait_ns is None or wait_ns > spin_ns:
                timeout_ns = None if wait_ns is None else wait_ns - spin_ns
                if wait_ns is None or wait_ns > SNAPSHOT_GAP_NS:  # wake for the snapshot too
                    snapshot_in = max(0, next_snapshot - now)
                    timeout_ns = snapshot_in if timeout_ns is None else min(timeout_ns, snapshot_in)
                timeout = None if timeout_ns is None else timeout_ns / 1e9
                ready, _, _ = select.select(readers, [], [], timeout)
                if ctl is not None and ctl in ready:
                    _control(ctl, main, changes)
                if wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        wake_r.recv(64)
            # else: spin; the next pass reads arrivals without blocking and releases what is due
    finally:
        now = time.monotonic_ns()
        with contextlib.suppress(OSError):
            emulator.send(emulator.receive(now))
            emulator.release(emulator.schedule.pop_all(), now)  # on stop nothing is held back
        counters = kernel_queue_counters(emulator.profiles)
        emulator.close()
        signal.set_wakeup_fd(old_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ctl is not None:
            with contextlib.suppress(OSError):
                os.unlink(str(cfg.get("control_socket")))
            ctl.close()
        write_json(results / STATS_FILE, stats("stopped", counters))
    return 0
