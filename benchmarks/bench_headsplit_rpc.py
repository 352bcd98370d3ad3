"""HeadSplit over torch RPC on this machine: per-token time split into compute and communication.

    .venv/bin/python benchmarks/bench_headsplit_rpc.py \\
        [--model gpt2-tiny] [--tokens 16] [--workers 2] [--threads 1] [--control rpc|dataflow|both]

Each placement runs under each control (``--control``, default both): rpc (the controller calls every
stage) and dataflow (the workers push to each other; headsplit.dataflow).

Starts one controller and ``--workers`` workers on 127.0.0.1 (a free port), twice: a layer-wise
placement (contiguous layers per worker) and a head-split one (heads dealt round-robin, projection
and FFN of a layer on different workers), no speculation. Prints, per decode token (medians over
tokens 1..N-1, the prefill left out), the compute (attention + projection + FFN), the pulls of
activations between processes (broadcast + gather + Z forward), the remaining RPC control overhead,
the total, and the bytes moved, with the RTT measured at start. Everything runs on one host, so the
"network" is loopback: the figures are the RPC stack's own overhead, not WiFi's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dit.extras import require_extras

SOURCE = Path(__file__).resolve().parents[1] / "runtimes" / "headsplit" / "src"
if importlib.util.find_spec("headsplit") is None:  # a checkout whose venv lacks the runtime
    sys.path.insert(0, str(SOURCE))

from headsplit.config import preset  # noqa: E402 (after the source-tree fallback)
from headsplit.units import all_units  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def placement(name: str, mode: str, workers: list[str]) -> dict[str, str]:
    cfg = preset(name)
    n = len(workers)
    if mode == "layerwise":
        per = -(-cfg.n_layers // n)
        return {u.key(): workers[u.layer // per] for u in all_units(cfg)}
    out = {}
    for u in all_units(cfg):
        i = u.head if u.kind == "head" else u.layer if u.kind == "proj" else u.layer + 1
        out[u.key()] = workers[i % n]
    return out


def run(
    name: str, mode: str, tokens: int, n_workers: int, threads: int, control: str = "rpc"
) -> dict[str, Any]:
    workers = [f"worker{r}" for r in range(1, n_workers + 1)]
    with tempfile.TemporaryDirectory(prefix="hs-bench-") as tmp:
        doc = {
            "model": {"preset": name},
            "controller": {"host": "edge", "address": "127.0.0.1", "port": free_port()},
            "workers": [{"rank": r, "address": "127.0.0.1"} for r in range(1, n_workers + 1)],
            "speculation": False,
            "control": control,
            "tokens": tokens,
            "prompt": "Heads expose the parallelism inside a layer.",
            "rpc_timeout_s": 60,
            "threads": threads,
            "result": "results/headsplit.json",
            "placement": placement(name, mode, workers),
        }
        Path(tmp, "headsplit.json").write_text(json.dumps(doc))
        # the processes import headsplit from its source tree when it is not installed (absolute: cwd=tmp)
        source = str(Path(__file__).resolve().parents[1] / "runtimes" / "headsplit" / "src")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p),
        }
        argv = [sys.executable, "-m", "headsplit.worker", "--config", "headsplit.json", "--rank"]
        procs = [subprocess.Popen([*argv, str(r)], cwd=tmp, env=env) for r in range(1, n_workers + 1)]
        ctl = [sys.executable, "-m", "headsplit.controller", "--config", "headsplit.json"]
        subprocess.run(ctl, cwd=tmp, env=env, check=True)
        for p in procs:
            p.wait(timeout=120)
        return json.loads(Path(tmp, "results/headsplit.json").read_text())  # type: ignore[no-any-return]


def ms(ns: float) -> str:
    return f"{ns / 1e6:8.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--control", choices=("rpc", "dataflow", "both"), default="both")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    a = ap.parse_args()
    require_extras("bench_headsplit_rpc.py", "llm")
    if a.smoke:
        a.tokens = 3
    print(f"model {a.model}, {a.workers} workers on 127.0.0.1, {a.tokens} tokens, {a.threads} thread(s), "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    controls = ("rpc", "dataflow") if a.control == "both" else (a.control,)
    for mode in ("layerwise", "headsplit"):
        for control in controls:
            report(run(a.model, mode, a.tokens, a.workers, a.threads, control), f"{mode}, control {control}")


def report(d: dict[str, Any], label: str) -> None:
    dec = d["tokens"][1:]

    def med(*keys: str, rows: list[dict[str, Any]] = dec) -> float:
        return float(statistics.median(sum(t.get(k, 0) for k in keys) for t in rows))

    rtt = statistics.median(x for w in d["workers"] for x in w["rtt_ns"])
    layers = d["model"]["n_layers"]
    print(f"\n{label}: {d['tokens_per_s']:.1f} tokens/s, RTT median {ms(rtt)}")
    print(f"  per token: total {ms(med('total_ns'))}")
    print(f"    compute (attention+projection+FFN) {ms(med('attention_ns', 'projection_ns', 'ffn_ns'))}")
    print(f"    compute on the critical path       {ms(med('critical_ns'))}")
    print(f"    the rest: messages, waits (comm)   {ms(med('comm_ns'))}")
    if d.get("control") == "dataflow":
        print(f"    messages on the critical path      {med('critical_messages'):8.0f}")
    else:
        print(f"    pulls (broadcast+gather+Z forward) {ms(med('broadcast_ns', 'gather_ns', 'zforward_ns'))}")
        print(f"    RPC control overhead               {ms(med('control_ns'))}")
    print(f"  communication per layer per token {ms(med('comm_ns') / layers)}, "
          f"compute per layer {ms(med('attention_ns', 'projection_ns', 'ffn_ns') / layers)}")  # fmt: skip
    print(f"  bytes per decode token {statistics.median(sum(t['bytes'].values()) for t in dec):.0f} B")


if __name__ == "__main__":
    main()
