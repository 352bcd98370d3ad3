"""A worker process: ``python -m headsplit.worker --config headsplit.json --rank R``.

Joins the RPC group as ``worker<R>``, serves the controller's calls (its units and KV caches live
here) until the controller shuts the group down, then writes ``results/worker<R>.json`` (next to the
controller's result file) with its memory samples and exits 0. Its RPC listens on its device's own
address (``source_address``: local mode's loopback address of the device) where the process can take
it, else on ``address`` (:func:`headsplit.netif.pin`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from headsplit.controller import ConfigError, load_run_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headsplit.worker")
    ap.add_argument("--config", required=True)
    ap.add_argument("--rank", required=True, type=int)
    args = ap.parse_args(argv)
    try:
        rc = load_run_config(args.config)
    except ConfigError as exc:
        print(f"headsplit worker: {exc}", file=sys.stderr)
        return 2
    entry = next((w for w in rc.workers if w.rank == args.rank), None)
    if entry is None:
        print(
            f"headsplit worker: --rank {args.rank}: no such rank in {args.config} (ranks 1..{len(rc.workers)})",
            file=sys.stderr,
        )
        return 2
    from headsplit import netif

    where = f"workers[{entry.rank - 1}]"
    try:
        own, note = netif.pin(
            entry.address,
            entry.source_address,
            where=f"{where}.address",
            source_where=f"{where}.source_address",
        )
    except netif.BindRefused as exc:
        print(f"headsplit worker: refused: {exc}", file=sys.stderr)
        return 2
    if note:
        print(f"headsplit worker: {note}", file=sys.stderr, flush=True)
    torch.set_num_threads(rc.threads)
    from headsplit import rpc

    rpc.set_own_address(own)
    start_ns = time.time_ns()
    listening = rpc.init_listening_only_on(
        entry.name, entry.rank, 1 + len(rc.workers), rc.rendezvous, rc.port, rc.rpc_timeout_s,
        own, f"{where}.source_address" if own == entry.source_address else f"{where}.address",
    )  # fmt: skip
    if listening is None:
        return 2
    rpc.shutdown()
    listening += rpc.push_listener()
    rpc.close_push()
    out = Path(rc.result).parent / f"worker{entry.rank}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": entry.name,
        "rank": entry.rank,
        "host": entry.host,
        "threads": rc.threads,
        "start_ns": start_ns,
        "end_ns": time.time_ns(),
        "listeners": listening,
        **rpc.worker_report(),
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
