"""Chapter 5 read from its decoder-profile run: the per-head, projection and FFN costs per token, the
tokens per second and the energy per token, and head-wise against fused attention, beside the article.

The article's figures are a Raspberry Pi 4's; a run elsewhere says which machine it measured.
"""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path
from typing import Any, Final

from dit import units
from dit.report import labels
from dit.report.section import Section
from dit.reproduce.article import FIGURES
from dit.reproduce.chapter import Chapter, Finished, Plan, Size, missing_modules, not_installed
from dit.reproduce.context import verdict_table
from dit.scenario import expand
from dit.units import MISSING

NOT_SIMULATED = "n/a (the simulator takes these as inputs)"


def _decode_medians(heads_csv: Path) -> dict[str, float]:
    """Median latency (ns) per unit over the decode tokens (token > 0): a head's time per token, a
    layer's FFN per token; ``attention`` and the per-head sum for the head-wise comparison."""
    import pandas as pd

    frame = pd.read_csv(heads_csv)
    decode = frame[frame["token"] > 0]
    out: dict[str, float] = {}
    for unit in ("head", "ffn", "attention", "projection"):
        rows = decode[decode["unit"] == unit]["latency_ns"]
        if not rows.empty:
            out[unit] = float(statistics.median(rows))
    return out


def _summary(run_dir: Path) -> dict[str, Any]:
    try:
        doc = json.loads((run_dir / "aggregate" / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {v["name"]: v.get("value") for v in doc.get("values", []) if isinstance(v, dict) and "name" in v}


def _verdict(value_ns: float, key: str, scale: float) -> str:
    figure = FIGURES[key]
    value = value_ns / scale
    if figure.holds(value):
        return "reproduces: within the article's range"
    machine = platform.processor() or platform.machine()
    faster = figure.low is not None and value < figure.low
    factor = (figure.low or value) / value if faster else value / (figure.high or value)
    return (
        f"does not reproduce: the article's range is a Raspberry Pi 4's (Cortex-A72); this is {machine}, "
        f"{factor:.1f}x {'below the range' if faster else 'above the range'}"
    )


def sections(run_dir: Path | None, missing: str) -> list[Section]:
    section = Section("Per-unit costs of a decoder layer", "profiles")
    heads = None if run_dir is None else run_dir / "aggregate" / "heads.csv"
    if run_dir is None or heads is None or not heads.is_file():
        section.note = f"Measured here: {missing}."
        verdict_table(
            section,
            [
                [
                    key.split(".", 1)[1],
                    "not measured",
                    NOT_SIMULATED,
                    FIGURES[key].text,
                    "cannot say: not measured",
                ]
                for key in ("ch5.head_ms", "ch5.ffn_s", "ch5.link_mbps")
            ],
        )
        return [section]
    medians = _decode_medians(heads)
    summary = _summary(run_dir)
    rows: list[list[str]] = []
    for unit, quantity, key, scale in (
        ("head", "one attention head per token (median, decode)", "ch5.head_ms", 1e6),
        ("ffn", "feed-forward block per token (median, decode)", "ch5.ffn_s", 1e9),
    ):
        if unit in medians:
            value = medians[unit]
            rows.append(
                [
                    quantity,
                    units.duration(value),
                    NOT_SIMULATED,
                    FIGURES[key].text,
                    _verdict(value, key, scale),
                ]
            )
    rate = summary.get("tokens_per_s")
    rows.append(
        [
            "tokens per second",
            MISSING if rate is None else f"{float(rate):.2f}",
            NOT_SIMULATED,
            "no figure in the article",
            MISSING,
        ]
    )
    ratio = summary.get("headwise_attention_ratio")
    rows.append(
        [
            "head-wise / fused attention time (decode)",
            MISSING if ratio is None else f"{float(ratio):.2f}",
            NOT_SIMULATED,
            "no figure in the article",
            "the head-wise recomputation pays the framework's per-operation cost per head (docs/raw-results.md)",
        ]
    )
    energy = summary.get("energy_per_token")
    fake = labels.fake_power_nodes(run_dir / "aggregate")
    rows.append(
        [
            "energy per token",
            MISSING
            if energy is None
            else units.energy(float(energy)) + (" (fake sensor: modelled, not measured)" if fake else ""),
            NOT_SIMULATED,
            "no figure in the article",
            MISSING,
        ]
    )
    rows.append(
        [
            "link rate",
            "not measured by this chapter's run (it profiles one device)",
            NOT_SIMULATED,
            FIGURES["ch5.link_mbps"].text,
            "cannot say: not measured",
        ]
    )
    verdict_table(section, rows)
    section.note = (
        f"The decoder profile of {run_dir.name} (aggregate/heads.csv: per head, projection and FFN per "
        "generated token, docs/models.md). Decode tokens only: token 0 is the prompt's prefill."
    )
    return [section]


def document(size: Size) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Chapter 5's decoder profile: TinyLlama generating tokens on one device with the per-head hooks
    (the layers runtime, docs/models.md), whole for ``full``, two of its 22 layers for ``quick``."""
    params: dict[str, Any] = {"prompt_len": 8}
    tokens = 32
    reductions: tuple[str, ...] = ()
    if size == "quick":
        params["num_layers"] = 2
        tokens = 8
        reductions = (
            "TinyLlama with 2 of its 22 decoder layers (per-layer and per-head costs are per layer; the "
            "weights are seeded, not trained: timing does not depend on them)",
            "8 generated tokens instead of 32, 1 repetition",
        )
    doc = {
        "name": "ch5_decoder_profile",
        "description": "Chapter 5: per-head, projection and FFN costs of a decoder layer per token",
        "model": {"name": "tinyllama", "params": params},
        "devices": ["device1"],
        "repetitions": 1 if size == "quick" else 3,
        "warmup": 1,
        "seed": 2024,
        "runtime": {"name": "layers", "tokens": tokens},
        "inference": {"enabled": False},
        "optimisation": {"enabled": False},
        "timing": {"start_lead_s": 5},
    }
    return doc, reductions


def _plan(size: Size, local: bool) -> Plan:
    missing = missing_modules("torch", "transformers")
    if missing:
        return not_installed("ch5", size, "Chapter 5", missing, "pip install -e '.[llm]'")
    doc, reductions = document(size)
    return Plan("ch5", size, tuple(expand(doc)), reductions)


def _report(done: Finished) -> list[Section]:
    finished = done.finished_runs()
    return sections(finished[0] if finished else None, done.not_measured())


CHAPTER: Final = Chapter("ch5", "Chapter 5 — decoder profiles of a trained model", _plan, _report)
