"""Per-worker checkpoint shards: each worker receives the tensors of the units placed on it.

``python -m headsplit.shard --checkpoint PATH --sha256 PIN --workers N --strategy S --out DIR`` verifies
the checkpoint against its pin, computes the placement of its model on N workers (``layerwise``,
``roundrobin`` or ``greedy`` with uniform assumed worker speeds: the placement must be known before the
run, so it cannot use the RTTs measured at start) and writes into DIR:

    worker<R>.safetensors   the full tensors its units are cut from (this package's names), plus the
                            Wk/Wv of every layer where it holds a query head (its KV copies)
    controller.safetensors  embedding, positions, final norm, LM head
    shards.json             checkpoint pin, model config, placement (unit key -> worker), and per file
                            its SHA-256, units and tensors

A run given ``checkpoint.shards`` (docs/headsplit.md) uses that placement (re-placement still migrates
units between workers over RPC) and every worker verifies its file's SHA-256 before reading it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from headsplit import checkpoint as ckpt
from headsplit import engine, model, placement
from headsplit.checkpoint import CheckpointError, directory_config, sha256_file
from headsplit.config import ModelConfig, preset
from headsplit.units import Unit

SHARDS_JSON = "shards.json"
CONTROLLER = "controller"


def write_shards(
    cfg: ModelConfig, source: Path, sha256: str, plan: dict[Unit, str], out: Path
) -> dict[str, Any]:
    """Write one safetensors file per worker of ``plan`` (and the controller's) into ``out``, reading
    each tensor from the verified checkpoint as it is written (one tensor in memory at a time)."""
    ckpt.verify(source, sha256)
    src = model.CheckpointSource(cfg, source)
    engine.check_placement(cfg, plan, set(plan.values()))
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {}
    shares: dict[str, tuple[list[str], list[str]]] = {
        worker: (
            [u.key() for u in engine.units_of(plan, worker)],
            sorted(engine.share_tensor_names(cfg, engine.units_of(plan, worker))),
        )
        for worker in sorted(set(plan.values()))
    }
    shares[CONTROLLER] = ([], sorted(model.controller_tensor_names(cfg)))
    for owner, (units, names) in shares.items():
        path = out / f"{owner}.safetensors"
        model.write_rows(path, {n: src.shapes[n] for n in names}, src.rows)
        files[owner] = {"file": path.name, "sha256": sha256_file(path), "units": units, "tensors": names}
    doc = {
        "checkpoint_sha256": sha256,
        "model": cfg.to_json(),
        "placement": {u.key(): worker for u, worker in sorted(plan.items())},
        "files": files,
    }
    (out / SHARDS_JSON).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def plan_for(
    cfg: ModelConfig, workers: int, strategy: str, memory_bytes: int, tokens: int
) -> dict[Unit, str]:
    specs = [placement.WorkerSpec(f"worker{r}", memory_bytes, 1e9, 0) for r in range(1, workers + 1)]
    if strategy not in placement.STRATEGIES:
        raise ValueError(f"strategy: one of {', '.join(placement.STRATEGIES)}, got {strategy!r}")
    return dict(placement.place(cfg, specs, strategy, context_tokens=tokens))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headsplit.shard", description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="safetensors file or Hugging Face directory")
    ap.add_argument("--sha256", required=True, help="its pin (docs/headsplit.md)")
    ap.add_argument("--model", help="the preset (a single file; a directory's config.json decides otherwise)")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--strategy", choices=placement.STRATEGIES, default="layerwise")
    ap.add_argument("--memory-mb", type=int, default=1 << 20, help="per-worker memory the placement fits")
    ap.add_argument("--tokens", type=int, default=512, help="context the placement must fit")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    src = Path(a.checkpoint)
    try:
        cfg = directory_config(src)
        if cfg is None:
            if not a.model:
                raise CheckpointError("--model: required for a checkpoint without config.json")
            cfg = preset(a.model)
        plan = plan_for(cfg, a.workers, a.strategy, a.memory_mb << 20, a.tokens)
        doc = write_shards(cfg, src, a.sha256, plan, Path(a.out))
    except (CheckpointError, ValueError) as exc:
        print(f"headsplit shard: {exc}", file=sys.stderr)
        return 2
    for owner, f in doc["files"].items():
        print(f"{a.out}/{f['file']}: {owner}, {len(f['units'])} units, sha256 {f['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
