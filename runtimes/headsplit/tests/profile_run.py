"""A small profile run directory written by dit's own profile code path, for the placement-costs tests.

What a run of the ``layers`` runtime with ``runtime: {tokens: N}`` leaves (docs/raw-results.md): per
device ``raw/<d>/<d>_heads.csv`` and ``raw/<d>/<d>_tokens.csv``, written here by the device's writers
(``dit.models.decoder_profile.write_heads_csv`` / ``write_tokens_csv``) from records whose ``ops`` are
the profiler's own count (``HFDecoderModel.layer_op_counts``), then ``aggregate/heads.csv`` written by
the run's aggregation (``dit.analysis.tokens.aggregate_tokens``). Only the latencies are made up: a
device's time per op times its ``slowdown`` (what the real run measures is the integration test's:
tests/integration/test_headsplit_runtime.py). No torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dit.analysis.run import LoadedRun, raw_file
from dit.analysis.tokens import aggregate_tokens
from dit.models.decoder_profile import (
    DecoderProfile,
    HeadRecord,
    TokenRecord,
    write_heads_csv,
    write_tokens_csv,
)
from dit.models.hf_decoder import FAMILIES, HFDecoderModel

#: The profiled model: the shape of headsplit's ``llama-tiny`` preset (hidden 64, 8 heads, 2 KV heads,
#: FFN 176), two layers.
SHAPE = {"family": "llama", "hidden": 64, "heads": 8, "kv_heads": 2, "intermediate": 176, "layers": 2}
PROMPT = 4


def op_counts(shape: Mapping[str, Any], kv_len: int) -> dict[str, int]:
    """The profiler's per-layer op counts of one decode token over ``kv_len`` positions."""
    model = SimpleNamespace(
        hidden=shape["hidden"],
        heads=shape["heads"],
        kv_heads=shape["kv_heads"],
        head_dim=shape["hidden"] // shape["heads"],
        intermediate=shape["intermediate"],
        family=FAMILIES[shape["family"]],
    )
    counts: dict[str, int] = HFDecoderModel.layer_op_counts(model, 1, kv_len)  # type: ignore[arg-type]
    return counts


def write_profile_run(
    run: Path,
    slowdown: Mapping[str, float],
    *,
    tokens: int = 4,
    repetitions: int = 2,
    ns_per_op: float = 2.0,
    run_id: str = "profiles-20261205-000000-abcdef12-0011",
    shape: Mapping[str, Any] = SHAPE,
    stall_ns: Mapping[str, int] | None = None,
) -> Path:
    """A profile run of ``slowdown``'s devices in ``run`` (its run directory, made here); returns it.
    ``stall_ns`` adds, per device, that stall to every fifth head row (what a CPU quota does: a few
    units hold the rest of a period)."""
    run.mkdir(parents=True)
    devices = list(slowdown)
    (run / "scenario.yaml").write_text(f"name: profiles\ndevices: [{', '.join(devices)}]\n", encoding="utf-8")
    params = {"family": shape["family"], "num_layers": shape["layers"], "prompt_len": PROMPT}
    (run / "metadata.json").write_text(
        json.dumps({"run_id": run_id, "model": {"spec": {"name": "hf_decoder", "params": params}}}),
        encoding="utf-8",
    )
    for device, slow in slowdown.items():
        prof = DecoderProfile(
            "hf_decoder", tokens, 1, repetitions, shape["heads"], shape["kv_heads"], shape["layers"]
        )
        timed: list[TokenRecord] = []
        for rep in range(repetitions):
            for token in range(tokens):
                kv_len = PROMPT + token
                counts = op_counts(shape, kv_len)
                total = 0
                for layer in range(shape["layers"]):
                    # a little spread around the device's rate, so that the median has work to do
                    scale = ns_per_op * slow * (1.0 + 0.1 * ((rep + token + layer) % 3 - 1))
                    ns = {unit: max(1, round(ops * scale)) for unit, ops in counts.items()}
                    for head in range(shape["heads"]):
                        stall = (stall_ns or {}).get(device, 0) if len(prof.records) % 5 == 0 else 0
                        prof.records.append(
                            HeadRecord(
                                rep, token, layer, "head", head, ns["head"] + stall, counts["head"], kv_len
                            )
                        )
                        total += stall
                    for unit in ("projection", "ffn"):
                        prof.records.append(
                            HeadRecord(rep, token, layer, unit, -1, ns[unit], counts[unit], kv_len)
                        )
                    total += shape["heads"] * ns["head"] + ns["projection"] + ns["ffn"]
                timed.append(TokenRecord(rep, token, 1_000_000 * token, total, kv_len))
        raw_file(run, device, "heads.csv").parent.mkdir(parents=True)
        write_heads_csv(raw_file(run, device, "heads.csv"), prof)
        write_tokens_csv(raw_file(run, device, "tokens.csv"), timed)
    assert aggregate_tokens(LoadedRun(run)) is not None
    return run
