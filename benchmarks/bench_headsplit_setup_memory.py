"""HeadSplit's worker set-up memory: each worker's units' bytes against its process's peak RSS.

    .venv/bin/python benchmarks/bench_headsplit_setup_memory.py \\
        [--model tinyllama] [--workers 4] [--strategy layerwise] [--checkpoint DIR --sha256 PIN]

Places ``--model`` on ``--workers`` equal workers (as the controller does, uniform speeds), then builds
each worker's share in a fresh child process exactly as ``remote_setup`` does (seeded weights, or the
checkpoint read per unit) and prints, per worker: its units' bytes (what it holds after set-up, the
placement's count), the child's RSS with torch imported and nothing built (the base), its peak RSS
(``ru_maxrss``) while building, and the peak above base and units. Needs torch (``pip install -e
'.[llm]'``, or ``./dev slow``'s set-up).

With ``--rpc`` it runs the real thing instead: a controller and ``--workers`` worker processes on
127.0.0.1 (that placement, seeded weights, one token) and prints each worker's units, the peak the
controller stated for it before set-up, and the worker process's own peak RSS (VmHWM, its results file).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dit.extras import require_extras

SOURCE = Path(__file__).resolve().parents[1] / "runtimes" / "headsplit" / "src"
if importlib.util.find_spec("headsplit") is None:  # a checkout whose venv lacks the runtime
    sys.path.insert(0, str(SOURCE))

MB = 1e6


def child(doc: dict[str, Any]) -> dict[str, int]:
    """In the child: build the share, return base RSS, peak RSS and the bytes the share holds."""
    import resource

    from headsplit import engine
    from headsplit.config import ModelConfig
    from headsplit.rpc import rss_bytes
    from headsplit.units import Unit

    cfg = ModelConfig.from_json(doc["model"])
    units = [Unit.parse(k) for k in doc["units"]]
    base = rss_bytes()
    if hasattr(engine, "load_share"):
        unit_w, slots = engine.load_share(cfg, doc["checkpoint"], units)
    else:  # a checkout before the per-unit build (issue 47): remote_setup's old sequence, to compare
        from headsplit import model

        names = sorted(engine.share_tensor_names(cfg, units))
        ck = doc["checkpoint"]
        w = (
            model.load_checkpoint(cfg, ck["path"], ck["sha256"], names)
            if ck
            else model.seeded_weights(cfg, names)
        )
        unit_w, slots = engine.build_share(cfg, w, units)
        del w
    st = engine.WorkerState("bench", cfg)
    st.load(unit_w, slots)
    del unit_w, slots
    held, _ = st.nbytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"base_rss": base, "peak_rss": peak, "held": held, "end_rss": rss_bytes()}


def over_rpc(cfg: Any, plan: dict[Any, str], workers: int) -> None:
    """Controller + workers on loopback, one token: each worker's stated need and its own peak RSS."""
    from headsplit import placement

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    doc = {
        "model": {"preset": cfg.name}, "checkpoint": None,
        "controller": {"host": "edge", "address": "127.0.0.1", "port": port},
        "workers": [{"rank": r, "address": "127.0.0.1", "memory_limit_bytes": 0} for r in range(1, workers + 1)],
        "strategy": "layerwise", "speculation": False, "tau": 0.0, "speculation_profile": None, "tokens": 1,
        "prompt": "x", "rpc_timeout_s": 600, "rpc_retries": 0, "threads": 1, "result": "results/headsplit.json",
        "replacement": False, "placement": {u.key(): w for u, w in plan.items()},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-hs-setup-") as tmp:
        (Path(tmp) / "headsplit.json").write_text(json.dumps(doc))
        argv = [sys.executable, "-m", "headsplit.worker", "--config", "headsplit.json", "--rank"]
        env = {**os.environ, "PYTHONPATH": str(SOURCE)}
        procs = [subprocess.Popen([*argv, str(r)], cwd=tmp, env=env) for r in range(1, workers + 1)]
        ctl = [sys.executable, "-m", "headsplit.controller", "--config", "headsplit.json"]
        subprocess.run(ctl, cwd=tmp, env=env, check=True, capture_output=True)
        for p in procs:
            p.wait(timeout=120)
        res = json.loads((Path(tmp) / "results" / "headsplit.json").read_text())
        stated = {d["name"]: d.get("need_bytes", 0) for d in res["workers"]}
        print(
            f"{'worker':8} {'units MB':>9} {'stated need MB':>15} {'peak RSS MB':>12} {'peak-units MB':>14}"
        )
        for r in range(1, workers + 1):
            name = f"worker{r}"
            report = json.loads((Path(tmp) / "results" / f"{name}.json").read_text())
            need = placement.worker_bytes(cfg, plan, name, 0)
            peak = report["peak_rss_bytes"]
            print(
                f"{name:8} {need / MB:9.1f} {stated[name] / MB:15.1f} {peak / MB:12.1f} {(peak - need) / MB:14.1f}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tinyllama")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--strategy", default="layerwise")
    ap.add_argument("--checkpoint", help="a checkpoint (file or directory) to read instead of seeded weights")
    ap.add_argument("--sha256", help="its pin")
    ap.add_argument(
        "--rpc", action="store_true", help="run controller and workers for real (seeded, 1 token)"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="gpt2-tiny on 2 workers: the same code path in seconds (CI)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    require_extras("bench_headsplit_setup_memory.py", "llm")
    if a.smoke:
        a.model, a.workers = "gpt2-tiny", 2
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    from headsplit import placement
    from headsplit.config import preset

    cfg = preset(a.model)
    specs = [placement.WorkerSpec(f"worker{r}", 1 << 40, 1e9, 0) for r in range(1, a.workers + 1)]
    plan = placement.place(cfg, specs, a.strategy, context_tokens=0)
    if a.rpc:
        print(f"{cfg.name}, {a.strategy} on {a.workers} worker processes over torch RPC, seeded weights")
        over_rpc(cfg, plan, a.workers)
        return 0
    checkpoint = {"path": a.checkpoint, "sha256": a.sha256} if a.checkpoint else None
    print(
        f"{cfg.name}, {a.strategy} on {a.workers} workers, {'checkpoint' if checkpoint else 'seeded weights'}"
    )
    print(
        f"{'worker':8} {'units MB':>9} {'held MB':>8} {'base MB':>8} {'peak MB':>8} {'peak-base-units MB':>19}"
    )
    for spec in specs:
        units = sorted(u for u, w in plan.items() if w == spec.name)
        need = placement.worker_bytes(cfg, plan, spec.name, 0)
        doc = {"model": cfg.to_json(), "units": [u.key() for u in units], "checkpoint": checkpoint}
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(doc)], check=True, capture_output=True, text=True
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        over = r["peak_rss"] - r["base_rss"] - need
        print(
            f"{spec.name:8} {need / MB:9.1f} {r['held'] / MB:8.1f} {r['base_rss'] / MB:8.1f} "
            f"{r['peak_rss'] / MB:8.1f} {over / MB:19.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
