"""Parsing a llama.cpp RPC run: the controller's timings and the workers' samples, into the same summary
columns as HeadSplit's (``tokens_generated``, ``tokens_per_s``, ``prompt_tokens_per_s``,
``generation_tokens_per_s``, ``token_latency_*``, ``prefill_latency``,
``bytes_total``, ``bytes_per_token``, ``energy``, ``energy_per_token``, ``edp``) plus its own.

Pure functions over text and rows (no dit import), so the parser is tested on recorded output.

Timings: llama.cpp's own performance lines (``prompt eval time = X ms / N tokens``, ``eval time = X ms /
N runs``). ``eval`` counts the decode calls after the prompt: the first generated token comes out of
the prompt's evaluation, so ``tokens_generated = runs + 1`` (with ``--ignore-eos`` that is the requested
count). The rates are computed from those times with the shared definitions (docs/runtimes.md, "LLM
summary columns"), not copied from llama.cpp's printed rates: its eval rate leaves the prefill out, so
it is ``generation_tokens_per_s``, not ``tokens_per_s``. The per-token latency percentiles are the gaps
between the controller's standard-output chunks after the first (llama-completion writes each token as
it is sampled; a chunk may hold more than one token when the reader is late, so they are an upper bound
per chunk, and the mean is taken from llama.cpp's own eval time).

Bytes: rpc-server reports nothing, so each worker's samples give (a) the TCP payload bytes of the
server's connections (the kernel's per-socket ``tcp_info`` counters, read with sock_diag by
``sockdiag.py``: bytes sent and acknowledged plus bytes received, summed over every connection to its
port, a closed one with its last sampled value) and (b) the rx/tx counters of the interface it is bound
to. In local mode that interface is ``lo``, shared by every worker and anything else on the machine, so
(b) is not per worker there and (a) is the per-worker figure. Where a worker could not read (a) its
samples say why (``tcp_error``), and the byte values are absent with that reason, never 0. The weights
are uploaded to the workers while the model loads; the first standard-output chunk (the prompt, printed
before the first evaluation) splits ``bytes_load`` from the inference traffic, at the samples'
resolution.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NUM = r"([0-9]+(?:\.[0-9]+)?|inf|nan)"
PROMPT_RE = re.compile(
    rf"prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens \(\s*{_NUM} ms per token,\s*{_NUM} tokens per second\)"
)
EVAL_RE = re.compile(
    rf"(?<!prompt )eval time =\s*{_NUM} ms /\s*(\d+) runs\s*\(\s*{_NUM} ms per token,\s*{_NUM} tokens per second\)"
)
LOAD_RE = re.compile(rf"load time =\s*{_NUM} ms")


class ParseError(ValueError):
    """Output that is not what llama.cpp prints; the message names the file and what is missing."""


@dataclass(frozen=True)
class Timings:
    load_ms: float | None
    prompt_ms: float
    prompt_tokens: int
    prompt_tokens_per_s: float
    eval_ms: float
    eval_runs: int
    eval_ms_per_token: float
    eval_tokens_per_s: float

    @property
    def tokens_generated(self) -> int:
        return self.eval_runs + 1

    # The shared LLM columns (docs/runtimes.md), from llama.cpp's times rather than its printed rates, so
    # they mean what HeadSplit's mean; None where the run has nothing to divide by.

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens / (prompt eval + eval) time: the prefill is part of generating them."""
        ms = self.prompt_ms + self.eval_ms
        return self.tokens_generated * 1e3 / ms if ms > 0 else None

    @property
    def prompt_rate(self) -> float | None:
        """Prompt tokens / prompt eval time."""
        return self.prompt_tokens * 1e3 / self.prompt_ms if self.prompt_ms > 0 else None

    @property
    def generation_tokens_per_s(self) -> float | None:
        """Tokens after the first (eval runs) / eval time."""
        return self.eval_runs * 1e3 / self.eval_ms if self.eval_runs > 0 and self.eval_ms > 0 else None

    @property
    def token_latency_ns(self) -> int | None:
        """Mean decode time of a token after the first (eval time / runs), ns."""
        return round(self.eval_ms * 1e6 / self.eval_runs) if self.eval_runs > 0 else None


def _f(text: str) -> float:
    return float(text)


def parse_timings(stderr: str, where: str = "controller") -> Timings:
    """The last ``prompt eval time`` and ``eval time`` lines of llama.cpp's output."""
    prompts = PROMPT_RE.findall(stderr)
    evals = EVAL_RE.findall(stderr)
    if not prompts:
        raise ParseError(f"{where}: no 'prompt eval time' line (did llama-completion finish?)")
    if not evals:
        raise ParseError(f"{where}: no 'eval time = ... runs' line (did llama-completion finish?)")
    loads = LOAD_RE.findall(stderr)
    p, e = prompts[-1], evals[-1]
    return Timings(
        load_ms=_f(loads[-1]) if loads else None,
        prompt_ms=_f(p[0]),
        prompt_tokens=int(p[1]),
        prompt_tokens_per_s=_f(p[3]),
        eval_ms=_f(e[0]),
        eval_runs=int(e[1]),
        eval_ms_per_token=_f(e[2]),
        eval_tokens_per_s=_f(e[3]),
    )


def token_gaps(chunks: Sequence[Sequence[int]]) -> list[int]:
    """Gaps (ns) between consecutive standard-output chunks after the first (the prompt's)."""
    times = [int(c[0]) for c in chunks]
    return [b - a for a, b in itertools.pairwise(times[1:])]


def read_samples(text: str, where: str) -> list[dict[str, Any]]:
    """A worker's JSON-lines samples (a torn last line, from a kill, is dropped)."""
    rows: list[dict[str, Any]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ParseError(f"{where}: line {i + 1} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("t_ns"), int):
            raise ParseError(f"{where}: line {i + 1}: t_ns is missing")
        rows.append(row)
    if not rows:
        raise ParseError(f"{where}: no samples")
    return rows


def _at_or_before(rows: Sequence[Mapping[str, Any]], t: int) -> Mapping[str, Any]:
    before = [r for r in rows if r["t_ns"] <= t]
    return before[-1] if before else rows[0]


def _at_or_after(rows: Sequence[Mapping[str, Any]], t: int) -> Mapping[str, Any]:
    after = [r for r in rows if r["t_ns"] >= t]
    return after[0] if after else rows[-1]


TCP_KEYS = ("tcp_acked", "tcp_received")
NO_TCP = (
    "the samples carry no TCP counters (recorded before dit-llamacpp read them with sock_diag; "
    "/proc/<pid>/io's rchar/wchar do not count rpc-server's send/recv)"
)


@dataclass(frozen=True)
class WorkerTraffic:
    worker: str
    host: str
    # TCP payload bytes through rpc-server's connections over the run (sent and acknowledged + received);
    # None when not measured, ``rpc_bytes_missing`` saying why
    rpc_bytes: int | None
    rpc_bytes_load: int | None  # of which up to the first sample at or after the first output (the upload)
    rpc_bytes_sent: int | None  # of rpc_bytes: sent by the server and acknowledged (tcpi_bytes_acked)
    rpc_bytes_received: int | None  # received by the server (tcpi_bytes_received)
    rpc_connections: int | None  # connections to the server's port over the run
    if_rx: int  # interface counters over the run (lo in local mode: shared)
    if_tx: int
    rss_peak: int  # bytes, VmHWM of rpc-server
    samples: int
    rpc_bytes_missing: str = ""
    split_ns: int | None = None  # the time of the sample that ends the load (None: no first output)
    # the bytes up to the last sample before the first output: the load where no token came after split_ns
    rpc_bytes_before_output: int | None = None
    # why a closed connection may lack what it moved after its last sample (no destroy notices); "" if none
    rpc_bytes_lower_bound: str = ""


def _int(row: Mapping[str, Any], key: str) -> int:
    value = row.get(key, 0)
    return int(value) if isinstance(value, int | float) else 0


def worker_traffic(
    worker: str,
    host: str,
    rows: Sequence[Mapping[str, Any]],
    start_ns: int,
    end_ns: int,
    first_token_ns: int | None,
) -> WorkerTraffic:
    a, b = _at_or_before(rows, start_ns), _at_or_after(rows, end_ns)
    # The first sample at or after the first output: llama.cpp prints the prompt as the last tensors'
    # upload ends (on the rack a worker's upload ended 2 ms after it), so the sample before it can fall
    # inside the upload and count up to a sampling period of it as inference; what this sample counts of
    # the generation instead, the tokens per worker leave out (``split_ns``, ``tokens_after``)
    split = _at_or_after(rows, first_token_ns) if first_token_ns is not None else b
    peak = max((_int(r, "hwm") or _int(r, "rss") for r in rows if r["t_ns"] <= b["t_ns"]), default=0)
    errors = [str(r["tcp_error"]) for r in rows if r.get("tcp_error")]
    missing = (
        errors[0] if errors else ("" if all(k in r for r in (a, b, split) for k in TCP_KEYS) else NO_TCP)
    )

    def delta(key: str, to: Mapping[str, Any] = b) -> int | None:
        return None if missing else _int(to, key) - _int(a, key)

    def tcp(to: Mapping[str, Any]) -> int | None:
        sent, received = delta("tcp_acked", to), delta("tcp_received", to)
        return None if sent is None or received is None else sent + received

    return WorkerTraffic(
        worker=worker,
        host=host,
        rpc_bytes=tcp(b),
        rpc_bytes_load=tcp(split),
        rpc_bytes_sent=delta("tcp_acked"),
        rpc_bytes_received=delta("tcp_received"),
        rpc_connections=delta("tcp_sockets"),
        if_rx=_int(b, "rx") - _int(a, "rx"),
        if_tx=_int(b, "tx") - _int(a, "tx"),
        rss_peak=peak,
        samples=len(rows),
        rpc_bytes_missing=missing,
        rpc_bytes_lower_bound=next((str(r["tcp_final_error"]) for r in rows if r.get("tcp_final_error")), ""),
        split_ns=int(split["t_ns"]) if first_token_ns is not None else None,
        rpc_bytes_before_output=tcp(_at_or_before(rows, first_token_ns))
        if first_token_ns is not None
        else None,
    )


def tokens_after(t_ns: int, token_times: Sequence[int], generated: int) -> int:
    """Tokens generated after ``t_ns``: ``generated`` less the outputs printed by then (``token_times``: the
    controller's output chunks after the prompt's, one per token as llama.cpp flushes them)."""
    return max(0, generated - sum(1 for t in token_times if t <= t_ns))


def bytes_per_token(
    traffic: Sequence[WorkerTraffic], token_times: Sequence[int], generated: int
) -> float | None:
    """TCP bytes per generated token after the load: each worker's bytes after its split sample over the
    tokens generated after it, summed; a worker whose split sample came after the last token (a generation
    shorter than the sampling interval) counts from its sample before the first output over every token.
    None where a worker's bytes are missing."""
    total = 0.0
    for t in traffic:
        if t.rpc_bytes is None or t.rpc_bytes_load is None or t.split_ns is None:
            return None
        n = tokens_after(t.split_ns, token_times, generated)
        if n > 0:
            total += (t.rpc_bytes - t.rpc_bytes_load) / n
        elif t.rpc_bytes_before_output is not None:
            # the whole generation fell within one sampling interval (a small model): no sample between
            # the upload and the tokens; the one before the first output ends the load, as the upload ends
            # about then (its last moments may count as inference)
            total += (t.rpc_bytes - t.rpc_bytes_before_output) / generated
        else:
            return None
    return total


def bytes_missing(traffic: Sequence[WorkerTraffic]) -> str:
    """Why the run's byte totals are not measured ("" when every worker's are)."""
    return "; ".join(f"{t.worker}: {t.rpc_bytes_missing}" for t in traffic if t.rpc_bytes_missing)


def bytes_lower_bound(traffic: Sequence[WorkerTraffic]) -> str:
    """Why the run's byte totals may miss a closed connection's last bytes ("" when they cannot)."""
    return "; ".join(f"{t.worker}: {t.rpc_bytes_lower_bound}" for t in traffic if t.rpc_bytes_lower_bound)


def percentile(ordered: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of sorted values (HeadSplit's definition)."""
    import math

    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def controller_doc(text: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ParseError(f"{where}: the top level is not a mapping")
    for key in ("start_ns", "end_ns", "returncode"):
        if not isinstance(doc.get(key), int):
            raise ParseError(f"{where}: {key} is missing or not an integer")
    if not isinstance(doc.get("stderr"), str):
        raise ParseError(f"{where}: stderr is missing")
    return doc


def mean_or_none(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None
