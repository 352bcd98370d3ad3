"""Reachability of every node: three probes every two seconds; green only when all three answer.

Two methods, chosen once at start (``dit web --probe auto|ping|tcp|off``):

- ``ping`` (the default when it works): one ``ping -n -c 3 -i 0.2 -W 1 ADDRESS`` per node per round,
  whose per-reply lines (``icmp_seq=N … time=X ms``) give the three results. It sends exactly three
  echo requests (no ``-w`` deadline: with one, ping keeps sending until it has three replies or the
  deadline passes, so an unreachable node got five or more while NNPM counted three). ICMP is what the
  article means by "three pings", and it needs nothing on the node.
- ``tcp`` (the fallback): three TCP connections to the node's SSH port (``ansible_port``, else 22),
  one second each, with asyncio. ``ping`` needs a raw socket or an unprivileged ICMP socket
  (``net.ipv4.ping_group_range``); where neither is allowed (many containers), or ``ping`` is not
  installed, a TCP connect still proves the node is up and that the port Ansible needs is open.

``auto`` pings 127.0.0.1 once at start: if that answers, ``ping``, else ``tcp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dit.web.services.aio import run_reaped

PROBES = 3
INTERVAL_S = 2.0
TIMEOUT_S = 1.0
METHODS = ("auto", "ping", "tcp", "off")
_REPLY = re.compile(r"icmp_seq=(\d+)\b.*?time[=<]([\d.]+)\s*ms")


@dataclass(frozen=True)
class Target:
    name: str
    address: str
    port: int = 22


@dataclass(frozen=True)
class ProbeResult:
    name: str
    address: str
    method: str
    rtt_ms: tuple[float | None, ...]  # one per probe, None when it did not answer
    detail: str
    at_ns: int = field(default_factory=time.time_ns)

    @property
    def answered(self) -> int:
        return sum(r is not None for r in self.rtt_ms)

    @property
    def ok(self) -> bool:
        return len(self.rtt_ms) == PROBES and self.answered == PROBES

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "method": self.method,
            "ok": self.ok,
            "answered": self.answered,
            "sent": len(self.rtt_ms),
            "rtt_ms": list(self.rtt_ms),
            "detail": self.detail,
            "at_ns": self.at_ns,
        }


def parse_ping(output: str, count: int = PROBES) -> tuple[float | None, ...]:
    """The round-trip time of each of ``count`` echo requests from ``ping -n`` output (None: lost)."""
    found: dict[int, float] = {}
    for match in _REPLY.finditer(output):
        seq = int(match.group(1))
        if 1 <= seq <= count:
            found.setdefault(seq, float(match.group(2)))
    return tuple(found.get(seq) for seq in range(1, count + 1))


async def ping(target: Target) -> ProbeResult:
    argv = [
        "ping",
        "-n",
        "-c",
        str(PROBES),
        "-i",
        "0.2",
        "-W",
        str(int(TIMEOUT_S)),
        target.address,
    ]
    try:
        done = await run_reaped(argv, 5.0, stderr=asyncio.subprocess.STDOUT)
    except (OSError, TimeoutError) as exc:
        return ProbeResult(target.name, target.address, "ping", (None,) * PROBES, f"ping failed: {exc}")
    text = done.stdout.decode("utf-8", errors="replace")
    rtts = parse_ping(text)
    answered = sum(r is not None for r in rtts)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if "transmitted" in line or "rtt" in line), "")
    if answered == 0 and lines:
        summary = next((line for line in lines if "transmitted" in line), lines[-1])
    return ProbeResult(target.name, target.address, "ping", rtts, summary.strip()[:300])


async def tcp_connect(target: Target) -> ProbeResult:
    async def one() -> tuple[float | None, str]:
        start = time.monotonic_ns()
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(target.address, target.port), timeout=TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            return None, str(exc) or type(exc).__name__
        rtt = (time.monotonic_ns() - start) / 1e6
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return round(rtt, 3), "connected"

    results = await asyncio.gather(*(one() for _ in range(PROBES)))
    rtts = tuple(r for r, _ in results)
    answered = sum(r is not None for r in rtts)
    last = results[-1][1]
    detail = f"tcp:{target.port} {answered}/{PROBES} connected" + ("" if answered == PROBES else f" ({last})")
    return ProbeResult(target.name, target.address, f"tcp:{target.port}", rtts, detail)


async def choose_method(requested: str) -> str:
    """``ping`` or ``tcp`` (or ``off``) for ``requested`` (``auto`` tries ping on 127.0.0.1)."""
    if requested != "auto":
        return requested
    if shutil.which("ping") is None:
        return "tcp"
    result = await ping(Target("self", "127.0.0.1"))
    return "ping" if result.answered > 0 else "tcp"


Prober = Callable[[Target], Awaitable[ProbeResult]]


class ProbeLoop:
    """Probes the targets ``targets()`` returns every :data:`INTERVAL_S` seconds; keeps the last results."""

    def __init__(
        self, targets: Callable[[], Sequence[Target]], method: str = "auto", interval_s: float = INTERVAL_S
    ) -> None:
        self.targets = targets
        self.requested = method
        self.method = "off" if method == "off" else "pending"
        self.interval_s = interval_s
        self.results: dict[str, ProbeResult] = {}
        self._task: asyncio.Task[None] | None = None
        self._limit = asyncio.Semaphore(16)

    def prober(self) -> Prober | None:
        return {"ping": ping, "tcp": tcp_connect}.get(self.method)

    async def round(self) -> None:
        probe = self.prober()
        if probe is None:
            return
        targets = list(self.targets())

        async def guarded(target: Target) -> ProbeResult:
            async with self._limit:
                return await probe(target)

        results = await asyncio.gather(*(guarded(t) for t in targets))
        names = {t.name for t in targets}
        self.results = {r.name: r for r in results} | {
            k: v for k, v in self.results.items() if k in names and k not in {r.name for r in results}
        }

    async def _run(self) -> None:
        self.method = await choose_method(self.requested)
        while True:
            started = time.monotonic()
            with contextlib.suppress(Exception):
                await self.round()
            await asyncio.sleep(max(0.1, self.interval_s - (time.monotonic() - started)))

    def start(self) -> None:
        if self.requested != "off" and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
