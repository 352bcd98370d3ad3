"""Every listener of HeadSplit's processes is on the node's inference address, never the wildcard.

torch RPC is unauthenticated pickle. torch's TCPStore (the controller's rendezvous) binds ``*:<port>``
whatever host it is given; before headsplit bound the socket itself, a controller on 127.0.0.1 listened
on ``:::<port>``, reachable from every interface of the node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from headsplit.netif import listeners

SRC = str(Path(__file__).resolve().parents[1] / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(
    tmp: Path,
    controller: str | dict[str, Any] = "127.0.0.1",
    worker: str | dict[str, Any] = "127.0.0.1",
    **over: Any,
) -> int:
    """``headsplit.json`` of a controller and one worker; an address, or fields over 127.0.0.1's."""
    port = free_port()
    ctl = {"address": controller} if isinstance(controller, str) else {"address": "127.0.0.1", **controller}
    wrk = {"address": worker} if isinstance(worker, str) else {"address": "127.0.0.1", **worker}
    doc: dict[str, Any] = {
        "model": {"preset": "gpt2-tiny"},
        "controller": {"host": "edge", "port": port, **ctl},
        "workers": [{"rank": 1, "name": "worker1", "host": "device1", **wrk}],
        "tokens": 2,
        "prompt": "Bound",
        "rpc_timeout_s": 30,
        "strategy": "layerwise",
        **over,
    }
    (tmp / "headsplit.json").write_text(json.dumps(doc))
    return port


def start(tmp: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    for variable in ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "DIT_START_AT_NS"):
        env.pop(variable, None)
    return subprocess.Popen(
        [sys.executable, "-m", *argv, "--config", "headsplit.json"],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_controller_s_rendezvous_listens_on_its_address_only(tmp_path: Path) -> None:
    port = write_config(tmp_path)
    # No worker joins: the controller's store listens and waits for it, which is when to look.
    ctl = start(tmp_path, "headsplit.controller")
    try:
        deadline = time.monotonic() + 120
        found: list[tuple[str, int]] = []
        while not any(p == port for _, p in found):
            assert ctl.poll() is None, ctl.communicate()[1][-2000:]
            assert time.monotonic() < deadline, f"the rendezvous never listened on {port}: {found}"
            time.sleep(0.1)
            found = listeners(ctl.pid)
        assert ("127.0.0.1", port) in found
        assert all(host == "127.0.0.1" for host, _ in found), found  # never 0.0.0.0 or ::
    finally:
        ctl.send_signal(signal.SIGKILL)
        ctl.communicate(timeout=60)


@pytest.mark.parametrize(
    ("program", "controller", "worker", "field", "why"),
    [
        ("headsplit.controller", "0.0.0.0", "127.0.0.1", "controller.address", "is the wildcard"),  # noqa: S104
        ("headsplit.controller", "", "127.0.0.1", "controller.address", "empty"),
        ("headsplit.worker", "127.0.0.1", "::", r"workers\[0\].address", "is the wildcard"),
        (
            "headsplit.worker",
            "127.0.0.1",
            "192.0.2.123",
            r"workers\[0\].address",
            "no.* interface|any interface",
        ),
    ],
)
def test_a_wildcard_or_foreign_address_is_refused_before_anything_listens(
    tmp_path: Path, program: str, controller: str, worker: str, field: str, why: str
) -> None:
    write_config(tmp_path, controller, worker)
    argv = (program, "--rank", "1") if program.endswith("worker") else (program,)
    proc = start(tmp_path, *argv)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    assert re.search(rf"refused: {field}: .*({why})", err), err
    assert "Traceback" not in err


def test_local_mode_processes_listen_on_their_device_s_own_address(tmp_path: Path) -> None:
    """Local mode: a process on a device listens on the device's loopback address (``source_address``),
    so what it sends on every connection made to it leaves from there, where the link emulator's chain
    selects the device's packets. The controller on a device too: its rendezvous and its TensorPipe. As
    root (a UTS namespace of the process's own); elsewhere the inference address, said on stderr."""
    base = f"127.41.{os.getpid() % 250 + 1}"
    controller_source, worker_source = f"{base}.3", f"{base}.2"
    write_config(tmp_path, controller={"source_address": controller_source},
                 worker={"source_address": worker_source})  # fmt: skip
    worker = start(tmp_path, "headsplit.worker", "--rank", "1")
    ctl = start(tmp_path, "headsplit.controller")
    try:
        _, ctl_err = ctl.communicate(timeout=600)
        _, worker_err = worker.communicate(timeout=120)
    finally:
        for proc in (ctl, worker):
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=60)
    assert ctl.returncode == 0 and worker.returncode == 0, ctl_err[-2000:] + worker_err[-2000:]
    results = json.loads((tmp_path / "results" / "headsplit.json").read_text())
    assert results["tokens_generated"] == 2
    hosts = {listener.rsplit(":", 1)[0] for listener in results["listeners"]}
    worker_hosts = {listener.rsplit(":", 1)[0] for listener in json.loads(
        (tmp_path / "results" / "worker1.json").read_text())["listeners"]}  # fmt: skip
    if os.geteuid() == 0:
        assert hosts == {controller_source} and worker_hosts == {worker_source}, (hosts, worker_hosts)
        assert "will not delay" not in ctl_err + worker_err
    else:  # the rendezvous is headsplit's own socket: on the device's address all the same
        assert hosts == {controller_source, "127.0.0.1"} and worker_hosts == {"127.0.0.1"}
        assert f"not on workers[0].source_address {worker_source}" in worker_err
