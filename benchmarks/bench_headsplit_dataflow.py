"""Dataflow control's transport on this machine: a message pushed worker -> worker over torch RPC
(TensorPipe, ``uv`` transport, basic channel: as HeadSplit runs it) against plain TCP sockets
(persistent, TCP_NODELAY, a small header and the raw float32 row per frame).

    .venv/bin/python benchmarks/bench_headsplit_dataflow.py [--hops 300] [--reps 3] [--sizes 64,576,2048] [--smoke]

Two processes on 127.0.0.1. Per payload (float32 rows of ``--sizes`` values: 64 a control-sized
message, 576 SmolLM2-135M's hidden, 2048 TinyLlama's), prints the one-way time of a pushed message:
a chain of ``--hops`` messages bouncing between the two processes, each sent by the receiver's
handler as soon as the previous one arrives (torch: ``rpc_async`` from inside the RPC handler, nobody
waiting on the reply; sockets: a reader loop that writes the next frame), divided by the hops
(median over ``--reps`` chains); and the round trip of a request/response (torch ``rpc_sync``; a
frame out and one back), median of ``--hops`` calls. Also reads back TCP_NODELAY on the TCP sockets
TensorPipe opened in this process. Loopback only: the figures are each stack's own per-message cost,
not a network's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from dit.extras import require_extras

require_extras("bench_headsplit_dataflow.py", "llm")  # before torch's import: one line, not a traceback

import torch  # noqa: E402 (after the extras' check)
import torch.distributed.rpc as trpc  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "runtimes" / "headsplit" / "src"
if importlib.util.find_spec("headsplit") is None:  # a checkout whose venv lacks the runtime
    sys.path.insert(0, str(SOURCE))

from headsplit.pushnet import recv_exact  # noqa: E402 (after the source-tree fallback)

_DONE = threading.Event()
_PEER = {"name": ""}
FRAME = struct.Struct("!cII")


def bounce(k: int, t: torch.Tensor) -> None:
    """One hop of a chain: ``k`` hops still to go after this one."""
    if k == 0:
        _DONE.set()
    else:
        trpc.rpc_async(_PEER["name"], bounce, args=(k - 1, t))


def echo(t: torch.Tensor) -> torch.Tensor:
    return t


def rpc_init(rank: int, port: int) -> None:
    opts = trpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", num_worker_threads=16, _transports=["uv"], _channels=["basic"]
    )
    name, _PEER["name"] = ("a", "b") if rank == 0 else ("b", "a")
    trpc.init_rpc(name, rank=rank, world_size=2, rpc_backend_options=opts)  # type: ignore[no-untyped-call, unused-ignore]


def tcp_nodelay_of_own_sockets() -> list[int]:
    """TCP_NODELAY of every connected TCP socket of this process (TensorPipe's, after some traffic)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET:
                s.getpeername()  # connected ones only (not the listeners)
                out.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        except OSError:
            pass
        finally:
            s.close()
    return out


def bench_rpc(port: int, sizes: list[int], hops: int, reps: int) -> dict[int, tuple[float, float]]:
    rpc_init(0, port)
    out: dict[int, tuple[float, float]] = {}
    for n in sizes:
        t = torch.randn(1, n)
        trpc.rpc_sync("b", echo, args=(t,))  # warm-up
        chains = []
        for _ in range(reps):
            _DONE.clear()
            t0 = time.perf_counter_ns()
            trpc.rpc_async("b", bounce, args=(hops - 1, t))
            if not _DONE.wait(120):
                raise RuntimeError("torch RPC chain did not finish")
            chains.append((time.perf_counter_ns() - t0) / hops)
        rtts = []
        for _ in range(hops):
            t0 = time.perf_counter_ns()
            trpc.rpc_sync("b", echo, args=(t,))
            rtts.append(time.perf_counter_ns() - t0)
        out[n] = (statistics.median(chains), statistics.median(rtts))
    nodelay = tcp_nodelay_of_own_sockets()
    print(f"torch RPC: TCP_NODELAY on TensorPipe's {len(nodelay)} connected socket(s): {nodelay}")
    trpc.shutdown()
    return out


def recv_frame(s: socket.socket) -> tuple[str, int, torch.Tensor]:
    """A frame: kind (1 byte), hops to go, payload length, then the raw float32 row (not pickled: a
    pickled tensor goes through torch.save, ~0.3 ms a message here)."""
    kind, k, n = FRAME.unpack(recv_exact(s, FRAME.size))
    t = torch.frombuffer(bytearray(recv_exact(s, n)), dtype=torch.float32).view(1, -1)
    return ("hop" if kind == b"h" else "echo"), k, t


def send_frame(s: socket.socket, obj: tuple[str, int, torch.Tensor]) -> None:
    kind, k, t = obj
    data = t.numpy().tobytes()
    s.sendall(FRAME.pack(b"h" if kind == "hop" else b"e", k, len(data)) + data)


def socket_peer(port: int) -> None:
    with socket.create_server(("127.0.0.1", port)) as srv:
        conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while True:
            try:
                kind, k, t = recv_frame(conn)
            except EOFError:
                return
            send_frame(conn, (kind, k - 1 if kind == "hop" else k, t))


def bench_socket(port: int, sizes: list[int], hops: int, reps: int) -> dict[int, tuple[float, float]]:
    deadline = time.monotonic() + 30
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: dict[int, tuple[float, float]] = {}
    with s:
        for n in sizes:
            t = torch.randn(1, n)
            send_frame(s, ("echo", 0, t))
            recv_frame(s)
            chains = []
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                send_frame(s, ("hop", hops - 1, t))
                while True:
                    _, k, got = recv_frame(s)
                    if k == 0:
                        break
                    send_frame(s, ("hop", k - 1, got))
                chains.append((time.perf_counter_ns() - t0) / hops)
            rtts = []
            for _ in range(hops):
                t0 = time.perf_counter_ns()
                send_frame(s, ("echo", 0, t))
                recv_frame(s)
                rtts.append(time.perf_counter_ns() - t0)
            out[n] = (statistics.median(chains), statistics.median(rtts))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_headsplit_dataflow.py")
    ap.add_argument("--hops", type=int, default=300, help="messages per chain (even), and round trips")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="64,576,2048", help="float32 values per message, comma-separated")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    ap.add_argument("--peer", choices=("rpc", "socket"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.peer == "rpc":
        rpc_init(1, args.port)
        trpc.shutdown()
        return 0
    if args.peer == "socket":
        socket_peer(args.port)
        return 0
    if args.smoke:
        args.hops, args.reps, args.sizes = 20, 1, "64"
    hops = args.hops + args.hops % 2  # even: the chain ends where it started
    sizes = [int(x) for x in args.sizes.split(",")]
    results = {}
    for backend, fn in (("torch RPC", bench_rpc), ("socket", bench_socket)):
        port = free_port()
        peer = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--peer", "rpc" if fn is bench_rpc else "socket",
             "--port", str(port)]
        )  # fmt: skip
        try:
            results[backend] = fn(port, sizes, hops, args.reps)
        finally:
            if peer.wait(timeout=60) != 0:
                print(f"{backend}: the peer exited {peer.returncode}", file=sys.stderr)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{hops} hops per chain (mean hop), median of {args.reps} chains; {hops} round trips (median); "
          f"loopback; load average {load} on {os.cpu_count()} CPUs")  # fmt: skip
    cols = (
        ("payload", 14),
        ("torch RPC one-way", 18),
        ("socket one-way", 15),
        ("torch RPC RTT", 14),
        ("socket RTT", 11),
    )
    print(" | ".join(f"{name:>{width}}" for name, width in cols))
    for n in sizes:
        (rh, rr), (sh, sr) = results["torch RPC"][n], results["socket"][n]
        print(f"{n:>6} x f32 {4 * n / 1024:>4.1f}kB | {rh / 1e3:>15.0f} us | {sh / 1e3:>12.0f} us | "
              f"{rr / 1e3:>11.0f} us | {sr / 1e3:>8.0f} us")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
