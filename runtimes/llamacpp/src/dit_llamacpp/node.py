"""The two programs that run on the nodes (standard library only; dit writes this file and
``launch.py`` into the run directory, so a node needs neither dit nor this package installed).

``worker``: refuses a bind address outside the rack (:func:`launch.check_bind`), starts
``ggml-rpc-server`` as its child, waits until the port listens (``/proc/net/tcp``, no connection made),
writes the ready file, then appends one JSON line per interval to its samples file: wall clock,
the inference interface's rx/tx byte counters, the server's RSS and peak RSS (``/proc/<pid>/status``)
and the TCP payload bytes of its connections (``tcp_acked``, ``tcp_received``, ``tcp_sent``,
``tcp_sockets``: the kernel's per-socket counters of the sockets on its port, read with sock_diag,
``sockdiag.py``; ``tcp_error`` with the reason where they cannot be read). It runs until the testbed
reaps it (SIGTERM: a last sample, then the server is stopped).

``controller``: checks the GGUF file's SHA-256 when one is given, waits for ``DIT_START_AT_NS``, runs
``llama-completion`` (argv after ``--``), timestamps every chunk of its standard output, and writes
``results/llamacpp.json``: argv, exit status, start and end (wall clock, ns), both outputs and the
chunks, and with ``--session`` the prompt's and the generated token ids llama.cpp wrote into its
session file (``token_ids: true`` in the block). It exits with the controller's status.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

try:
    from dit_llamacpp import launch, sockdiag
except ImportError:  # on a node: launch.py and sockdiag.py are beside this file, on sys.path as the
    launch = importlib.import_module("launch")  # script's directory
    sockdiag = importlib.import_module("sockdiag")


def interfaces() -> dict[str, list[str]]:
    """Interface -> its addresses, from ``ip -j addr`` (empty when iproute2 is missing)."""
    try:
        proc = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    out: dict[str, list[str]] = {}
    for link in json.loads(proc.stdout or "[]"):
        out[str(link.get("ifname"))] = [
            str(a.get("local")) for a in link.get("addr_info") or [] if a.get("local")
        ]
    return out


def counters(iface: str) -> tuple[int, int]:
    base = Path("/sys/class/net") / iface / "statistics"
    try:
        return int((base / "rx_bytes").read_text()), int((base / "tx_bytes").read_text())
    except (OSError, ValueError):
        return -1, -1


def proc_stats(pid: int) -> dict[str, int]:
    """RSS and peak RSS (bytes) of ``pid``; missing values absent. (Not ``/proc/<pid>/io``: its
    ``rchar``/``wchar`` do not count ``send``/``recv``, which rpc-server uses.)"""
    stats: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                stats["rss" if key == "VmRSS" else "hwm"] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return stats


def listening(port: int) -> bool:
    """Some socket listens on TCP ``port`` (``/proc/net/tcp`` and ``tcp6``, state 0A)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def worker(args: argparse.Namespace) -> int:
    try:
        iface = launch.check_bind(
            args.bind, inference_address=args.inference_address, local=args.local, interfaces=interfaces()
        )
    except launch.BindRefused as exc:
        print(f"llamacpp worker: refused: {exc}", file=sys.stderr)
        return 2
    argv = launch.rpc_server_argv(args.binary, args.bind, args.port, args.threads)
    server = subprocess.Popen(argv)
    stop = threading.Event()

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    deadline = time.monotonic() + args.ready_timeout
    while not listening(args.port):
        if server.poll() is not None:
            print(f"llamacpp worker: {argv[0]} exited with {server.returncode}", file=sys.stderr)
            return 1
        if time.monotonic() > deadline or stop.is_set():
            server.kill()
            print(
                f"llamacpp worker: port {args.port} not listening after {args.ready_timeout} s",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.05)
    samples = Path(args.samples)
    samples.parent.mkdir(parents=True, exist_ok=True)
    traffic = sockdiag.PortTraffic(args.port, args.bind)

    def sample(out: Any) -> None:
        rx, tx = counters(iface)
        row = {"t_ns": time.time_ns(), "rx": rx, "tx": tx, **proc_stats(server.pid), **traffic.sample()}
        out.write(json.dumps(row) + "\n")
        out.flush()

    with samples.open("a", encoding="utf-8") as out:
        sample(out)
        ready = {"pid": server.pid, "interface": iface, "address": args.bind, "port": args.port, "argv": argv}
        Path(args.ready).write_text(json.dumps(ready), encoding="utf-8")
        while not stop.is_set() and server.poll() is None:
            stop.wait(args.interval)
            if server.poll() is None:
                sample(out)
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
        return 0
    print(f"llamacpp worker: {argv[0]} exited with {server.returncode}", file=sys.stderr)
    return 1 if server.returncode else 0


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def token_ids(session: Path, tokens: int) -> dict[str, Any]:
    """``prompt_ids`` and ``generated_ids`` from llama.cpp's session file (then removed: it holds the
    whole KV cache), or ``token_ids_error`` saying why not."""
    try:
        ids = launch.session_tokens(session.read_bytes(), str(session))
    except (OSError, launch.SessionError) as exc:
        return {"token_ids_error": str(exc)}
    finally:
        session.unlink(missing_ok=True)
    if tokens < 1 or len(ids) <= tokens:
        return {"token_ids_error": f"{session}: {len(ids)} tokens, expected a prompt and {tokens} generated"}
    return {"prompt_ids": ids[:-tokens], "generated_ids": ids[-tokens:]}


def controller(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("llamacpp controller: no llama-completion argv after --", file=sys.stderr)
        return 2
    if args.sha256:
        found = sha256_of(args.model)
        if found != args.sha256:
            print(
                f"llamacpp controller: {args.model}: SHA-256 {found}, expected {args.sha256}", file=sys.stderr
            )
            return 2
    session = Path(args.session) if args.session else None
    if session is not None:  # a stale session would be loaded: its prompt not evaluated again
        session.unlink(missing_ok=True)
    start_at = int(os.environ.get("DIT_START_AT_NS", "0"))
    while time.time_ns() < start_at:
        time.sleep(min(0.01, (start_at - time.time_ns()) / 1e9))
    start = time.time_ns()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks: list[list[int]] = []
    stdout: list[bytes] = []
    err: list[bytes] = []
    assert proc.stdout is not None and proc.stderr is not None
    errors = proc.stderr
    reader = threading.Thread(target=lambda: err.append(errors.read()), daemon=True)
    reader.start()
    fd = proc.stdout.fileno()
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append([time.time_ns(), len(data)])
        stdout.append(data)
    code = proc.wait()
    end = time.time_ns()
    reader.join(10)
    text_err = b"".join(err).decode("utf-8", errors="replace")
    sys.stderr.write(text_err[-20000:])
    result = {
        "argv": argv,
        "returncode": code,
        "start_ns": start,
        "end_ns": end,
        "stdout": b"".join(stdout).decode("utf-8", errors="replace"),
        "stderr": text_err,
        "stdout_chunks": chunks,
        "model_sha256": args.sha256 or None,
    }
    if session is not None:
        result.update(token_ids(session, args.tokens))
    out = Path(args.result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result), encoding="utf-8")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamacpp-node")
    sub = parser.add_subparsers(dest="role", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--binary", required=True)
    w.add_argument("--bind", required=True)
    w.add_argument("--inference-address", required=True)
    w.add_argument("--local", action="store_true")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--threads", type=int, default=1)
    w.add_argument("--ready", required=True)
    w.add_argument("--samples", required=True)
    w.add_argument("--interval", type=float, default=0.2)
    w.add_argument("--ready-timeout", type=float, default=60.0)
    c = sub.add_parser("controller")
    c.add_argument("--model", required=True)
    c.add_argument("--sha256", default="")
    c.add_argument("--result", required=True)
    c.add_argument(
        "--session", default="", help="llama.cpp's session file (with --prompt-cache) to read ids from"
    )
    c.add_argument("--tokens", type=int, default=0, help="how many of the session's ids were generated")
    c.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return worker(args) if args.role == "worker" else controller(args)


if __name__ == "__main__":
    sys.exit(main())
