"""HeadSplit's results parser: ``results/headsplit.json`` checked field by field, the tables and the
summary of one run (per-token timings, placement, energy)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dit.analysis.run import LoadedRun
from dit.runtimes import (
    Results,
    SummaryValue,
    helpers,
)
from dit.runtimes.helpers import energy_summary, write_csv
from headsplit.plugin.common import (
    RESULT_NAME,
    HeadSplitLaunchError,
    HeadSplitResultsError,
)
from headsplit.units import Unit

# -- results ------------------------------------------------------------------------------------

TOKEN_TIMINGS = (
    "total_ns",
    "attention_ns",
    "projection_ns",
    "ffn_ns",
    "gather_ns",
    "broadcast_ns",
    "reexec_ns",
)


def _where(file: Path, field: str, problem: str) -> HeadSplitResultsError:
    return HeadSplitResultsError(f"{file}: {field}: {problem}")


def _int(file: Path, doc: Mapping[str, Any], key: str, where: str) -> int:
    value = doc.get(key)
    if key not in doc:
        raise _where(file, f"{where}{key}", "is missing")
    if not isinstance(value, int) or isinstance(value, bool):
        raise _where(file, f"{where}{key}", f"{value!r} is not an integer")
    return value


def _list(file: Path, doc: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> list[Any]:
    value = doc.get(key)
    if value is None and (optional or key in doc):
        return []
    if key not in doc:
        raise _where(file, f"{where}{key}", "is missing")
    if not isinstance(value, list):
        raise _where(file, f"{where}{key}", f"{value!r} is not a list")
    return value


def _records(file: Path, doc: Mapping[str, Any], key: str, ints: Iterable[str]) -> list[Mapping[str, Any]]:
    rows: list[Mapping[str, Any]] = []
    for i, row in enumerate(_list(file, doc, key, "", optional=True)):
        if not isinstance(row, Mapping):
            raise _where(file, f"{key}[{i}]", f"{row!r} is not a mapping")
        for name in ints:
            _int(file, row, name, f"{key}[{i}].")
        rows.append(row)
    return rows


def read_results(file: Path) -> dict[str, Any]:
    """The controller's results file, checked field by field against the contract (HEADSPLIT.md)."""
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HeadSplitResultsError(f"{file}: cannot be read ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise HeadSplitResultsError(f"{file}: not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise HeadSplitResultsError(f"{file}: the top level is not a mapping")
    for key in ("tokens_generated", "start_ns", "end_ns"):
        _int(file, doc, key, "")
    if "prompt_tokens" in doc:  # optional: the prompt rate is left out without it
        _int(file, doc, "prompt_tokens", "")
    rate = doc.get("tokens_per_s")
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not math.isfinite(rate):
        raise _where(
            file, "tokens_per_s", f"{rate!r} is not a number" if "tokens_per_s" in doc else "is missing"
        )
    for i, token in enumerate(_list(file, doc, "tokens", "")):
        where = f"tokens[{i}]."
        if not isinstance(token, Mapping):
            raise _where(file, f"tokens[{i}]", f"{token!r} is not a mapping")
        for key in ("index", *TOKEN_TIMINGS):
            _int(file, token, key, where)
        for key in ("speculated", "accepted", "rejected"):
            for j, layer in enumerate(_list(file, token, key, where)):
                if not isinstance(layer, int) or isinstance(layer, bool):
                    raise _where(file, f"{where}{key}[{j}]", f"{layer!r} is not a layer index")
        links = token.get("bytes")
        if not isinstance(links, Mapping):
            raise _where(
                file, f"{where}bytes", "is missing" if "bytes" not in token else f"{links!r} is not a mapping"
            )
        for link, count in links.items():
            if not isinstance(count, int) or isinstance(count, bool):
                raise _where(file, f"{where}bytes[{link!r}]", f"{count!r} is not a byte count")
    _records(file, doc, "memory", ("token", "bytes"))
    _records(file, doc, "replacements", ("token", "planning_ns", "migration_ns", "moved_units"))
    _records(file, doc, "retries", ("time_ns", "attempt"))
    for i, worker in enumerate(_list(file, doc, "workers", "")):
        if not isinstance(worker, Mapping) or not isinstance(worker.get("name"), str):
            raise _where(file, f"workers[{i}].name", "is missing")
        for j, rtt in enumerate(_list(file, worker, "rtt_ns", f"workers[{i}].", optional=True)):
            if not isinstance(rtt, int) or isinstance(rtt, bool):
                raise _where(file, f"workers[{i}].rtt_ns[{j}]", f"{rtt!r} is not an integer")
    _placement(file, doc.get("placement"))
    quality = doc.get("perplexity")
    if quality is not None:
        if not isinstance(quality, Mapping):
            raise _where(file, "perplexity", f"{quality!r} is neither null nor a mapping")
        for key in ("tokens", "paragraph_tokens"):
            _int(file, quality, key, "perplexity.")
        for key in ("perplexity", "nll_mean", "tau"):
            value = quality.get(key)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise _where(file, f"perplexity.{key}",
                             f"{value!r} is not a number" if key in quality else "is missing")  # fmt: skip
        if not isinstance(quality.get("paragraph_sha256"), str):
            raise _where(file, "perplexity.paragraph_sha256", "is missing")
    oom = doc.get("oom")
    if oom is not None:
        if not isinstance(oom, Mapping):
            raise _where(file, "oom", f"{oom!r} is neither null nor a mapping")
        _int(file, oom, "token", "oom.")
        if not isinstance(oom.get("worker"), str):
            raise _where(file, "oom.worker", "is missing")
    return doc


def _placement(file: Path, placement: Any) -> None:
    """``placement``: optional, and so are its fields; those present are checked (older results files
    have no ``costs`` nor ``predicted_token_s``)."""
    if placement is None:
        return
    if not isinstance(placement, Mapping):
        raise _where(file, "placement", f"{placement!r} is not a mapping")
    units = placement.get("units")
    if units is not None and (
        not isinstance(units, Mapping) or not all(isinstance(w, str) for w in units.values())
    ):
        raise _where(file, "placement.units", "is not a mapping of unit key -> worker name")
    predicted = placement.get("predicted_token_s")
    if predicted is not None and (
        not isinstance(predicted, int | float) or isinstance(predicted, bool) or not math.isfinite(predicted)
    ):
        raise _where(file, "placement.predicted_token_s", f"{predicted!r} is not a number")
    costs = placement.get("costs")
    if costs is not None and (not isinstance(costs, Mapping) or costs.get("source") not in COST_SOURCES):
        raise _where(file, "placement.costs.source", f"is not one of {', '.join(COST_SOURCES)}")


COST_SOURCES = ("micro-benchmark", "profile")


def worker_units(units: Mapping[str, str], workers: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per worker, how many heads, projections and FFNs ``units`` (the results' ``placement.units``,
    ``{"L0.head0": "worker1", ...}``) gives it; every worker listed, 0 for one without units."""
    counts = {w: {"head": 0, "proj": 0, "ffn": 0} for w in workers}
    for key, worker in units.items():
        counts.setdefault(worker, {"head": 0, "proj": 0, "ffn": 0})[Unit.parse(key).kind] += 1
    return counts


def _placement_table(doc: Mapping[str, Any], out: Path) -> Path | None:
    """``aggregate/hs_placement.csv``: per worker its units and the FLOP/s the placement costed them
    at, with where those came from (``micro-benchmark``, or ``profile`` and the profile run's id)."""
    placement = doc.get("placement")
    if not isinstance(placement, Mapping) or not isinstance(placement.get("units"), Mapping):
        return None
    workers = [w for w in doc.get("workers") or [] if isinstance(w, Mapping)]
    counts = worker_units(placement["units"], [str(w["name"]) for w in workers])
    costs = placement.get("costs")
    source = ""
    if isinstance(costs, Mapping):
        source = (
            "profile " + str(costs.get("run_id")) if costs["source"] == "profile" else str(costs["source"])
        )
    by_name = {str(w["name"]): w for w in workers}

    def rate(worker: str, kind: str) -> Any:
        rates = by_name.get(worker, {}).get("placement_flops_per_s")
        return rates.get(kind, "") if isinstance(rates, Mapping) else ""

    return write_csv(
        out / "hs_placement.csv",
        ["worker", "host", "heads", "projections", "ffns", "head_flops_per_s", "proj_flops_per_s",
         "ffn_flops_per_s", "costs"],
        (
            [w, by_name.get(w, {}).get("host", ""), c["head"], c["proj"], c["ffn"], rate(w, "head"),
             rate(w, "proj"), rate(w, "ffn"), source]
            for w, c in counts.items()
        ),
    )  # fmt: skip


def _migration_bytes(doc: Mapping[str, Any]) -> int | None:
    """The bytes every re-placement moved (0 without one); None when a re-placement did not record them."""
    moved = [r.get("bytes") for r in doc.get("replacements") or []]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in moved):
        return None
    return sum(int(n) for n in moved if n is not None)


def find_results(run: LoadedRun) -> tuple[str, Path]:
    """The controller's host and its results file ``raw/<host>/<host>_headsplit.json``."""
    return helpers.find_results(run, RESULT_NAME, error=HeadSplitResultsError)


def _percentile(ordered: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def decode(model: str, ids: Sequence[int]) -> str | None:
    """``ids`` as text by a trained model's own tokenizer; None for a preset without one (byte-level
    ids of seeded weights are not text) or when the tokenizer cannot be loaded here."""
    from headsplit.plugin.launch import TRAINED, model_tokenizer

    if model not in TRAINED:
        return None
    try:
        return str(model_tokenizer(model).decode(list(ids)))
    except HeadSplitLaunchError:
        return None


def _generated(run: LoadedRun, doc: Mapping[str, Any], out: Path) -> tuple[Path, str | None] | None:
    """``aggregate/hs_generated.json``: the generated ids and, for a trained model, their text."""
    ids = doc.get("generated")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    block = run.scenario.get("runtime")
    model = str(block.get("model", "gpt2-tiny")) if isinstance(block, Mapping) else "gpt2-tiny"
    text = decode(model, ids)
    path = out / "hs_generated.json"
    path.write_text(json.dumps({"model": model, "ids": ids, "text": text}, indent=1) + "\n", encoding="utf-8")
    return path, text


QUALITY_FIELDS = (
    "perplexity", "nll_mean", "tokens", "paragraph_tokens", "paragraph_sha256", "tokenizer", "speculation",
    "tau", "speculated", "accepted",
)  # fmt: skip


def _quality(run: LoadedRun, doc: Mapping[str, Any], out: Path) -> tuple[Path, float] | None:
    """``aggregate/hs_quality.json``: the held-out paragraph's perplexity under the run's configuration
    (``perplexity: true``), beside the model and the ids of the run's generation."""
    quality = doc.get("perplexity")
    if not isinstance(quality, Mapping):
        return None
    block = run.scenario.get("runtime")
    model = str(block.get("model", "gpt2-tiny")) if isinstance(block, Mapping) else "gpt2-tiny"
    path = out / "hs_quality.json"
    record = {"model": model, **{k: quality.get(k) for k in QUALITY_FIELDS}}
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return path, float(quality["perplexity"])


def parse(run: LoadedRun) -> Results:
    """``raw/<controller>/<controller>_headsplit.json`` -> ``aggregate/hs_*.csv`` and summary values."""
    controller, file = find_results(run)
    doc = read_results(file)
    out = run.aggregate_dir
    tokens = list(doc["tokens"])
    extra = sorted({k for t in tokens for k in t if k.endswith("_ns") and k not in TOKEN_TIMINGS})
    timings = [*TOKEN_TIMINGS, *extra]
    bytes_per_token = [sum(int(v) for v in t["bytes"].values()) for t in tokens]
    tables = [
        write_csv(
            out / "hs_tokens.csv",
            ["token", "token_id", *timings, "speculated", "accepted", "rejected", "bytes"],
            (
                [
                    t["index"],
                    t.get("token_id", ""),
                    *(t.get(k, "") for k in timings),
                    len(t["speculated"]),
                    len(t["accepted"]),
                    len(t["rejected"]),
                    total,
                ]
                for t, total in zip(tokens, bytes_per_token, strict=True)
            ),
        ),
        write_csv(
            out / "hs_layers.csv",
            ["token", "layer", "speculated", "accepted"],
            (
                [t["index"], layer, int(layer in t["speculated"]), int(layer in t["accepted"])]
                for t in tokens
                for layer in sorted({*t["speculated"], *t["accepted"], *t["rejected"]})
            ),
        ),
        write_csv(
            out / "hs_links.csv",
            ["token", "link", "bytes"],
            ([t["index"], link, count] for t in tokens for link, count in sorted(t["bytes"].items())),
        ),
        write_csv(
            out / "hs_memory.csv",
            ["token", "worker", "bytes"],
            ([m["token"], m.get("worker", ""), m["bytes"]] for m in doc.get("memory") or []),
        ),
        write_csv(
            out / "hs_replacements.csv",
            ["token", "worker", "planning_ns", "migration_ns", "moved_units", "bytes"],
            (
                [
                    r["token"],
                    r.get("worker", ""),
                    r["planning_ns"],
                    r["migration_ns"],
                    r["moved_units"],
                    r.get("bytes", ""),
                ]
                for r in doc.get("replacements") or []
            ),
        ),
        write_csv(
            out / "hs_retries.csv",
            ["time_ns", "worker", "call", "attempt", "error"],
            (
                [r["time_ns"], r.get("worker", ""), r.get("call", ""), r["attempt"], r.get("error", "")]
                for r in doc.get("retries") or []
            ),
        ),
        write_csv(
            out / "hs_rtt.csv",
            ["worker", "host", "sample", "rtt_ns"],
            (
                [w["name"], w.get("host", ""), i, rtt]
                for w in doc.get("workers") or []
                for i, rtt in enumerate(w.get("rtt_ns") or [])
            ),
        ),
    ]

    # the shared LLM columns (docs/runtimes.md, "LLM summary columns"): token 0 is the prompt's prefill,
    # the tokens after it the decode; a column this run cannot measure is left out, never approximated
    generated = int(doc["tokens_generated"])
    wall_ns = int(doc["end_ns"]) - int(doc["start_ns"])
    values = [
        SummaryValue("tokens_generated", generated, "", "int", "tokens generated"),
        SummaryValue("tokens_per_s", generated * 1e9 / wall_ns if wall_ns > 0 else None, "1/s", "float",
                     "generated tokens / (prefill + decode) wall time"),
    ]  # fmt: skip
    decode = sorted(int(t["total_ns"]) for t in tokens if t["index"] > 0)
    if decode:
        values += [
            SummaryValue("generation_tokens_per_s", len(decode) * 1e9 / sum(decode) if sum(decode) else None,
                         "1/s", "float", "tokens after the first / decode time (prefill excluded)"),
            SummaryValue("token_latency_mean", round(statistics.fmean(decode)), "ns", "int",
                         "mean latency of a generated token (prefill excluded)"),
            SummaryValue("token_latency_p50", _percentile(decode, 50), "ns", "int", "median token latency"),
            SummaryValue("token_latency_p99", _percentile(decode, 99), "ns", "int", "99th percentile token latency"),
        ]  # fmt: skip
    prefill = [int(t["total_ns"]) for t in tokens if t["index"] == 0]
    if prefill:
        values.append(
            SummaryValue("prefill_latency", prefill[0], "ns", "int", "token 0: the prompt's prefill")
        )
        prompt = doc.get("prompt_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt > 0 and prefill[0] > 0:
            values.append(
                SummaryValue("prompt_tokens_per_s", prompt * 1e9 / prefill[0], "1/s", "float",
                             "prompt tokens / prefill time")
            )  # fmt: skip
    total = sum(int(t["total_ns"]) for t in tokens)
    for part in ("attention", "projection", "ffn"):
        share = 100.0 * sum(int(t[f"{part}_ns"]) for t in tokens) / total if total else None
        values.append(SummaryValue(f"{part}_share", share, "%", "float", f"{part} time / token time"))
    speculated = sum(len(t["speculated"]) for t in tokens)
    accepted = sum(len(t["accepted"]) for t in tokens)
    rejected = sum(len(t["rejected"]) for t in tokens)
    values += [
        SummaryValue("speculation_acceptance", 100.0 * accepted / speculated if speculated else None, "%", "float",
                     "speculated layer transitions whose attention was kept"),
        SummaryValue("reexecutions", rejected, "", "int", "speculative attentions re-executed on the exact input"),
        SummaryValue("replacements", len(doc.get("replacements") or []), "", "int", "placement re-runs (memory)"),
        SummaryValue("migration_bytes", _migration_bytes(doc), "B", "int",
                     "bytes the re-placements moved (unit weights, KV slices)"),
        SummaryValue("retries", len(doc.get("retries") or []), "", "int", "RPC retries after a stall"),
        SummaryValue("bytes_total", sum(bytes_per_token), "B", "int", "bytes moved between processes"),
        SummaryValue("bytes_per_token", statistics.fmean(bytes_per_token) if tokens else None, "B", "float",
                     "mean bytes moved per token"),
    ]  # fmt: skip
    control = doc.get("control")
    if isinstance(control, str):  # absent from a results file of before dataflow control: rpc's
        values.append(SummaryValue("control", control, "", "str",
                                   "how tokens were driven: dataflow (pushed) or rpc (controller calls)"))  # fmt: skip
    placement = doc.get("placement")
    if isinstance(placement, Mapping) and isinstance(placement.get("planning_ns"), int):
        values.append(
            SummaryValue("placement_planning", placement["planning_ns"], "ns", "int", "initial placement")
        )
    if isinstance(placement, Mapping) and placement.get("predicted_token_s") is not None:
        values.append(
            SummaryValue("placement_predicted_token", round(float(placement["predicted_token_s"]) * 1e9), "ns",
                         "int", "the cost model's time per generated token of the initial placement "
                         "(no speculation)")
        )  # fmt: skip
    costs = placement.get("costs") if isinstance(placement, Mapping) else None
    if isinstance(costs, Mapping):
        said = f"profile {costs.get('run_id')}" if costs["source"] == "profile" else str(costs["source"])
        values.append(
            SummaryValue("placement_costs", said, "", "str", "where the placement's per-unit costs came from")
        )
    placed = _placement_table(doc, out)
    if placed is not None:
        tables.append(placed)
    oom = doc.get("oom")
    if isinstance(oom, Mapping):
        values += [
            SummaryValue(
                "oom_token", int(oom["token"]), "", "int", "token at which a worker ran out of memory"
            ),
            SummaryValue("oom_worker", str(oom["worker"]), "", "str", "the worker that ran out of memory"),
        ]
    decoded = _generated(run, doc, out)
    if decoded is not None:
        tables.append(decoded[0])
        if decoded[1] is not None:
            values.append(SummaryValue("generated_text", decoded[1], "", "str",
                                       "the generated tokens decoded by the model's own tokenizer"))  # fmt: skip
    quality = _quality(run, doc, out)
    if quality is not None:
        tables.append(quality[0])
        values.append(SummaryValue("perplexity", quality[1], "", "float",
                                   "teacher-forced perplexity of the held-out paragraph, as the run ran"))  # fmt: skip
    start, end = int(doc["start_ns"]), int(doc["end_ns"])
    hosts = [
        controller,
        *(str(w["host"]) for w in doc.get("workers") or [] if isinstance(w.get("host"), str)),
    ]
    values += energy_summary(run, hosts, start, end, int(doc["tokens_generated"]), "the generation")
    return Results(tables=tuple(tables), summary=tuple(values))
