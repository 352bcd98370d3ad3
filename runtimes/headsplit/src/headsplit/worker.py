"""A worker process: ``python -m headsplit.worker --config headsplit.json --rank R``.

That process is a small supervisor (no torch): it runs the worker proper as its child (``--serve``) and,
when the child ends with a signal or a failure status, writes ``results/worker<R>.exit.json``
(:class:`headsplit.memory.ExitNote`: its exit status and its memory cgroup's counters -- limit, OOM
kills, peak) and says the same on stderr, so that a worker the kernel killed for its memory limit is
named as such (by the controller when it can read the note, else in the node's logs) and not only as an
RPC call that failed with EOF. The supervisor shares the worker's cgroup and holds ~15 MB.

The worker proper joins the RPC group as ``worker<R>``, serves the controller's calls (its units and KV caches live
here) until the controller shuts the group down, then writes ``results/worker<R>.json`` (next to the
controller's result file) with its memory samples and exits 0. Its RPC listens on its device's own
address (``source_address``: local mode's loopback address of the device) where the process can take
it, else on ``address`` (:func:`headsplit.netif.pin`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

EXIT_NOTE = "worker{rank}.exit.json"  # beside the controller's result file, in the worker's node root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headsplit.worker")
    ap.add_argument("--config", required=True)
    ap.add_argument("--rank", required=True, type=int)
    ap.add_argument("--serve", action="store_true", help="be the worker itself (the supervisor's child)")
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args)
    child = [sys.executable, "-m", "headsplit.worker", "--config", args.config, "--rank", str(args.rank)]
    return supervise([*child, "--serve"], args.config, args.rank)


def note_path(config: str, rank: int) -> Path:
    """Where the supervisor of ``rank`` writes its exit note (the config's ``result`` directory)."""
    try:
        result = json.loads(Path(config).read_text(encoding="utf-8")).get("result", "results/headsplit.json")
    except (OSError, ValueError, AttributeError):
        result = "results/headsplit.json"  # the child refuses the config itself, naming the problem
    return Path(str(result)).parent / EXIT_NOTE.format(rank=rank)


def supervise(argv: list[str], config: str, rank: int) -> int:
    """Run ``argv`` (the worker proper), pass SIGTERM/SIGINT on to it, and note how it ended."""
    from headsplit import memory

    proc = subprocess.Popen(argv, preexec_fn=_die_with_parent)  # noqa: PLW1509 (no threads here yet)

    def forward(signum: int, _: FrameType | None) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = proc.wait()
    if code in (0, 2):  # done, or a refused config (the child said why on stderr)
        return code
    cgroup_dir = memory.own_memory_cgroup()
    note = memory.ExitNote(
        f"worker{rank}", code, None if cgroup_dir is None else memory.read_cgroup(cgroup_dir)
    )
    out = note_path(config, rank)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(note.to_json(), indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"headsplit worker: cannot write {out}: {exc.strerror}", file=sys.stderr)
    print(f"headsplit worker: {memory.loss_message(note.worker, 'its run', note, None, 0)}", file=sys.stderr)
    return 128 + note.signal if note.signal is not None else code


def _die_with_parent() -> None:
    """In the child: the kernel kills it when the supervisor dies, so that killing the supervisor alone
    (SIGKILL, which it cannot pass on) leaves no worker behind."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def serve(args: argparse.Namespace) -> int:
    import torch

    from headsplit.controller import ConfigError, load_run_config

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
    from headsplit import memory, netif

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
        "peak_rss_bytes": memory.status_bytes("VmHWM"),
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
