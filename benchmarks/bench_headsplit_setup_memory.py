"""HeadSplit's worker set-up memory: each worker's units' bytes against its process's peak RSS.

    .venv/bin/python benchmarks/bench_headsplit_setup_memory.py \\
        [--model tinyllama] [--workers 4] [--strategy layerwise] [--checkpoint DIR --sha256 PIN]

Places ``--model`` on ``--workers`` equal workers (as the controller does, uniform speeds), then builds
each worker's share in a fresh child process exactly as ``remote_setup`` does (seeded weights, or the
checkpoint read per unit) and prints, per worker: its units' bytes (what it holds after set-up, the
placement's count), the child's RSS with torch imported and nothing built (the base), its peak RSS
(``ru_maxrss``) while building, and the peak above base and units. Needs torch (``pip install -e
'.[llm]'``, or ``./dev slow``'s set-up).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tinyllama")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--strategy", default="layerwise")
    ap.add_argument("--checkpoint", help="a checkpoint (file or directory) to read instead of seeded weights")
    ap.add_argument("--sha256", help="its pin")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    from headsplit import placement
    from headsplit.config import preset

    cfg = preset(a.model)
    specs = [placement.WorkerSpec(f"worker{r}", 1 << 40, 1e9, 0) for r in range(1, a.workers + 1)]
    plan = placement.place(cfg, specs, a.strategy, context_tokens=0)
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
