"""Token generation of decoder models (``runtime: {tokens: N}`` of the built-in runtime).

The device agent writes, per device, ``results/tokens.csv`` (a generation without hooks: ``rep,token,``
``start_ns,latency_ns,kv_len``, start in device-origin time) and ``results/heads.csv`` (the per-head
profile, :data:`dit.models.decoder_profile.HEAD_COLUMNS`), collected as ``raw/<host>/<host>_tokens.csv``
and ``raw/<host>/<host>_heads.csv``. :func:`aggregate_tokens` writes under ``aggregate/``:

``heads.csv`` — every device's rows with a ``host`` column first: ``host,rep,token,layer,unit,head,``
    ``latency_ns,ops,kv_len``.
``tokens.csv`` — per device and token, the mean over the repetitions: ``host,token,latency_ns,kv_len``
    (``latency_ns`` rounded to the nanosecond; token 0 is the prefill of the prompt).

and returns the figures of the summary values ``tokens``, ``token_latency_mean`` (ns, every token of every
repetition and device), ``tokens_per_s`` (``1e9 / token_latency_mean``), ``headwise_attention_ratio``
(decode tokens: the per-head rows plus the output projection over the fused attention time, see
:func:`headwise_ratio`) and, with a power trace, ``energy_per_token`` (J, from ``energy.csv``'s
generation rows, :func:`dit.analysis.monitors.generation_energy_rows`).

Runs without token generation have none of these files: nothing is written, nothing changes.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.analysis.run import AggregateError, LoadedRun, raw_file
from dit.models.decoder_profile import HEAD_COLUMNS, TOKEN_COLUMNS

HEADS_AGGREGATE = ("host", *HEAD_COLUMNS)
#: The documented tolerance of ``headwise_attention_ratio``: within a factor 5 of 1 (docs/raw-results.md).
#: The per-head recomputation runs every head on its own small kernels, each paying the framework's
#: per-operation dispatch, so it is of the order of the fused attention's time, not equal to it.
HEADWISE_TOLERANCE = 5.0
TOKENS_AGGREGATE = ("host", "token", "latency_ns", "kv_len")


@dataclass(frozen=True)
class TokenSummary:
    """What :func:`aggregate_tokens` found: the tables it wrote and the figures of the summary."""

    tables: tuple[Path, ...]
    tokens: int
    token_latency_mean_ns: float
    tokens_per_s: float
    headwise_ratio: float | None


def _rows(path: Path, columns: Sequence[str]) -> list[dict[str, Any]]:
    """The integer columns of a raw CSV; an unreadable or malformed file names itself and the field."""
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise AggregateError(f"{path}: missing column(s) {', '.join(missing)}")
        out: list[dict[str, Any]] = []
        for line, row in enumerate(reader, start=2):
            parsed: dict[str, Any] = {}
            for c in columns:
                if c == "unit":
                    parsed[c] = row[c]
                    continue
                try:
                    parsed[c] = int(row[c])
                except (TypeError, ValueError):
                    raise AggregateError(f"{path}:{line}: {c} {row[c]!r} is not an integer") from None
            out.append(parsed)
        return out


def headwise_ratio(heads: Sequence[dict[str, Any]]) -> float | None:
    """Decode tokens (> 0): Σ over (rep, token, layer) of (Σ per-head ``head`` rows + ``projection``)
    divided by Σ ``attention`` — 1.0 when the head-wise decomposition accounts for the fused time."""
    parts: dict[str, int] = defaultdict(int)
    for row in heads:
        unit = str(row["unit"])
        if row["token"] > 0 and unit in ("head", "projection", "attention"):
            parts[unit] += row["latency_ns"]
    if parts["attention"] <= 0:
        return None
    return (parts["head"] + parts["projection"]) / parts["attention"]


def aggregate_tokens(run: LoadedRun) -> TokenSummary | None:
    """Write ``aggregate/heads.csv`` and ``aggregate/tokens.csv``; None when no device generated tokens."""
    devices = [d for d in run.devices if raw_file(run.path, d, "tokens.csv").is_file()]
    if not devices:
        return None
    out_dir = run.aggregate_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    all_heads: list[dict[str, Any]] = []
    latencies: list[int] = []
    counts: set[int] = set()
    heads_path = out_dir / "heads.csv"
    tokens_path = out_dir / "tokens.csv"
    with (
        heads_path.open("w", newline="", encoding="utf-8") as hf,
        tokens_path.open("w", newline="", encoding="utf-8") as tf,
    ):
        heads_out = csv.writer(hf)
        heads_out.writerow(HEADS_AGGREGATE)
        tokens_out = csv.writer(tf)
        tokens_out.writerow(TOKENS_AGGREGATE)
        for device in devices:
            tokens = _rows(raw_file(run.path, device, "tokens.csv"), TOKEN_COLUMNS)
            per_token: dict[int, list[int]] = defaultdict(list)
            kv: dict[int, int] = {}
            for row in tokens:
                per_token[row["token"]].append(row["latency_ns"])
                kv[row["token"]] = row["kv_len"]
                latencies.append(row["latency_ns"])
            counts.add(len(per_token))
            for token in sorted(per_token):
                tokens_out.writerow([device, token, round(statistics.fmean(per_token[token])), kv[token]])
            heads_file = raw_file(run.path, device, "heads.csv")
            if heads_file.is_file():
                heads = _rows(heads_file, HEAD_COLUMNS)
                all_heads.extend(heads)
                for row in heads:
                    heads_out.writerow([device, *(row[c] for c in HEAD_COLUMNS)])
    if not latencies:
        raise AggregateError(f"{run.path}: tokens.csv of {', '.join(devices)} has no rows")
    mean = statistics.fmean(latencies)
    return TokenSummary(
        tables=(heads_path, tokens_path),
        tokens=max(counts),
        token_latency_mean_ns=mean,
        tokens_per_s=1e9 / mean if mean > 0 else 0.0,
        headwise_ratio=headwise_ratio(all_heads),
    )


def energy_per_token_j(run: LoadedRun) -> float | None:
    """The mean energy per generated token over every device's generation repetitions with a power
    trace (:func:`dit.analysis.monitors.generation_energy_rows`); None without one."""
    from dit.analysis.monitors import generation_energy_rows

    values: list[float] = []
    for device in run.devices:
        rows = generation_energy_rows(run.path, device)
        if rows is not None:
            values.extend(float(v) for v in rows["energy_per_token_j"].dropna())
    return statistics.fmean(values) if values else None
