"""Dataflow control's transport: one persistent TCP connection from every process to every other
(TCP_NODELAY, opened once before the first token, no handshake per message), each message a frame:
two lengths, a JSON header (the ``Msg`` fields; never pickle) and the activation's raw float32 bytes.

Why not torch RPC's ``rpc_async`` worker -> worker (benchmarks/bench_headsplit_dataflow.py, docs/
headsplit.md): a pushed message costs several times more there, every push also sends a reply, and a
push travels on a connection its sender opened without binding a source address -- from 127.0.0.1 in
local mode, where the link emulator selects a device's packets by the device's own address. Here a
connection is opened from the sender's own address (``source_address``), so its messages leave from
there. torch RPC still carries the set-up, the calls between tokens and rpc control.

Each process listens on its own address (an ephemeral port; the controller learns the workers'
through RPC and hands every worker the table), and reads each incoming connection in a thread that
hands every message to ``on_message``.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import torch

from headsplit.dataflow import Msg

FRAME = struct.Struct("!II")  # header bytes, payload bytes
_FIELDS = ("kind", "step", "attempt", "start", "layer", "src", "dst", "verdict", "spec", "hops", "path_ns",
           "text")  # fmt: skip


def encode(msg: Msg) -> bytes:
    head: dict[str, Any] = {k: getattr(msg, k) for k in _FIELDS}
    head["verdicts"] = [list(v) for v in msg.verdicts]
    payload = b""
    if msg.t is not None:
        t = msg.t.detach().to(torch.float32).contiguous()
        head["shape"] = list(t.shape)
        payload = t.numpy().tobytes()
    raw = json.dumps(head, separators=(",", ":")).encode()
    return FRAME.pack(len(raw), len(payload)) + raw + payload


def decode(raw: bytes, payload: bytes) -> Msg:
    head = json.loads(raw)
    t = None
    if "shape" in head:
        t = torch.frombuffer(bytearray(payload), dtype=torch.float32).view(head["shape"])
    verdicts = tuple((int(a), float(b), bool(c)) for a, b, c in head["verdicts"])
    return Msg(t=t, verdicts=verdicts, **{k: head[k] for k in _FIELDS})


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(s: socket.socket) -> tuple[bytes, bytes]:
    n_head, n_payload = FRAME.unpack(recv_exact(s, FRAME.size))
    return recv_exact(s, n_head), recv_exact(s, n_payload)


class PushNet:
    """This process's end: its listener, its connections to the others, their reader threads."""

    def __init__(self, name: str, address: str, on_message: Callable[[Msg], None]) -> None:
        self.name = name
        self.own = address
        self.on_message = on_message
        self.server = socket.create_server((address, 0))
        self.conns: dict[str, socket.socket] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.errors: list[str] = []
        threading.Thread(target=self._accept, name="pushnet-accept", daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.getsockname()[:2]
        return str(host), int(port)

    def connect(self, table: dict[str, tuple[str, int]]) -> None:
        """One connection to every other process of ``table`` (name -> listening address), from this
        process's own address, each announced by a header naming this process."""
        for peer, (host, port) in sorted(table.items()):
            if peer == self.name or peer in self.conns:
                continue
            s = socket.create_connection((host, port), timeout=30, source_address=(self.own, 0))
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw = json.dumps({"hello": self.name}).encode()
            s.sendall(FRAME.pack(len(raw), 0) + raw)
            self.conns[peer], self.locks[peer] = s, threading.Lock()

    def send(self, msg: Msg) -> None:
        data = encode(msg)
        with self.locks[msg.dst]:
            self.conns[msg.dst].sendall(data)

    def close(self) -> None:
        for s in [self.server, *self.conns.values()]:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._read, args=(conn,), name="pushnet-read", daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            try:
                _recv(conn)  # the hello
                while True:
                    raw, payload = _recv(conn)
                    self.on_message(decode(raw, payload))
            except (EOFError, OSError):
                return
            except Exception as exc:  # a bad frame: said in the worker's report, the step times out
                self.errors.append(f"{type(exc).__name__}: {exc}")
