# -*- coding: utf-8 -*-
# Shared by dit's Ansible modules: round-trip times to the run's other nodes (stdlib only, runs on the node).
"""Ping the links of a node: ``count`` ICMP echo requests per target, every RTT in integer nanoseconds.

Used by ``dit_collect`` (the run's measured links, ``results/ping.json``) and ``dit_facts`` (preflight's
unshaped baseline). Targets are pinged in parallel, one thread each, so N links take the time of one.
Without a ``ping`` binary, a target with a TCP port falls back to timing TCP connects to it.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from typing import Any

RTT = re.compile(r"time[=<]([0-9.]+) ms")


def ping(
    name: str, address: str, count: int, tcp_port: int | None = None, source: str | None = None
) -> dict[str, Any]:
    """One link: ``{"target", "address", "sent", "received", "rtt_ns", "method", ...}``.

    ``source`` (local mode: the device's own loopback address) is the address the requests leave
    from, so the device's network condition applies to them as to its inference traffic.
    """
    record: dict[str, Any] = {"target": name, "address": address, "sent": count, "received": 0, "rtt_ns": []}
    if source:
        record["source"] = source
    program = shutil.which("ping")
    if program:
        argv = [
            program,
            "-n",
            "-c",
            str(count),
            "-i",
            "0.2",
            "-W",
            "1",
            *(["-I", source] if source else []),
            address,
        ]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=count * 2 + 10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            record.update(method="icmp", argv=argv, error=str(exc))
            return record
        rtts = [round(float(m.group(1)) * 1e6) for m in RTT.finditer(proc.stdout)]
        record.update(method="icmp", argv=argv, received=len(rtts), rtt_ns=rtts)
        if proc.returncode not in (0, 1):
            record["error"] = (proc.stderr or proc.stdout).strip()[-500:]
        return record
    if tcp_port is None:
        record.update(method="none", error="no ping binary on this node and no TCP port to time instead")
        return record
    rtts = []
    for _ in range(count):
        start = time.monotonic_ns()
        try:
            with socket.create_connection(
                (address, tcp_port), timeout=1.0, source_address=(source, 0) if source else None
            ):
                rtts.append(time.monotonic_ns() - start)
        except OSError:
            pass
        time.sleep(0.05)
    record.update(method="tcp-connect", port=tcp_port, received=len(rtts), rtt_ns=rtts)
    return record


def ping_all(targets: list[dict[str, Any]], count: int, tcp_port: int | None = None) -> list[dict[str, Any]]:
    """Every target (``{"target": name, "address": ..., "tcp_port", "source": optional}``) at once; results in
    the order of ``targets``. ``tcp_port`` is the fallback port of the ``edge`` target."""
    results: list[dict[str, Any]] = [{} for _ in targets]

    def one(index: int, item: dict[str, Any]) -> None:
        name = str(item.get("target") or item.get("address"))
        port = item.get("tcp_port", tcp_port if name == "edge" else None)
        results[index] = ping(name, str(item["address"]), count, port, str(item.get("source") or "") or None)

    threads = [threading.Thread(target=one, args=(i, t), daemon=True) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
