"""Where a decode token's time goes, and how it grows with the links' delay (issue 47).

Reads HeadSplit's run directories (``aggregate/hs_tokens.csv``, ``metadata.json``) and gives, per run, the
median decode token (the prefill, token 0, left out) split into attention, projection, FFN, the messages
and waits on its path (``comm_ns``) and the controller's own compute; then, per strategy and control, a
least-squares line of the decode time against the added one-way delay (its slope: milliseconds per
millisecond, the messages a token's path crosses a delayed link with) and the added RTT at which
layer-wise overtakes a head-level strategy (where their lines cross).

    python -m headsplit.breakdown RUNS_DIR [RUNS_DIR ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from headsplit.compare import CompareError, load_variant, run_dirs

#: The parts of a token, in the order they are printed: (field of hs_tokens.csv, name).
PARTS: Final = (
    ("attention_ns", "attention"),
    ("projection_ns", "projection"),
    ("ffn_ns", "FFN"),
    ("comm_ns", "communication"),
    ("controller_ns", "controller"),
)


@dataclass(frozen=True)
class Token:
    """One run's median decode token, in ms, and where it was measured."""

    path: Path
    strategy: str
    speculation: bool
    control: str
    one_way_ms: float  # the added one-way delay on every worker's egress (half the added RTT)
    total_ms: float
    parts_ms: Mapping[str, float]  # PARTS' names -> median ms
    messages: float | None  # median messages on the token's critical path (dataflow only)
    geometry: str  # "tinyllama: 22 layers, 32 heads (4 KV) of 64, hidden 2048, FFN 5632"
    repeat: int = 1  # which timing of its configuration (the block's ``repeat``)

    @property
    def name(self) -> str:
        return self.strategy + (" + speculation" if self.speculation else "")

    def share(self, part: str) -> float:
        return self.parts_ms[part] / self.total_ms if self.total_ms > 0 else 0.0


@dataclass(frozen=True)
class Line:
    """Decode ms per token against the added one-way delay, for one strategy and control."""

    name: str
    control: str
    points: tuple[tuple[float, float], ...]  # (one-way ms, decode ms), by delay
    slope: float | None  # ms per ms of one-way delay (None: one column only)
    intercept: float


def _median(rows: Sequence[Mapping[str, str]], field: str) -> float:
    return statistics.median(float(r[field]) for r in rows) / 1e6


def _controller_doc(run: Path) -> Mapping[str, Any]:
    """The controller's results (``raw/<controller>/<controller>_headsplit.json``), read once per run;
    empty when none is readable."""
    for raw in sorted(run.glob("raw/*/*_headsplit.json")):
        try:
            doc = json.loads(raw.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, Mapping):
            return doc
    return {}


def _geometry(doc: Mapping[str, Any]) -> str:
    model = doc.get("model")
    if not isinstance(model, Mapping):
        return "geometry not recorded"
    return (
        f"{model.get('name')}: {model.get('n_layers')} layers, {model.get('n_heads')} heads "
        f"({model.get('n_kv_heads')} KV) of {_head_dim(model)}, hidden {model.get('hidden')}, "
        f"FFN {model.get('ffn_hidden')}"
    )


def _head_dim(model: Mapping[str, Any]) -> Any:
    hidden, heads = model.get("hidden"), model.get("n_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else "?"


def one_way_ms(others: str) -> float:
    """The added one-way delay of a sweep point: the largest device ``delay_ms`` in its network block."""
    try:
        point = json.loads(others)
    except ValueError:
        return 0.0
    delays = [
        float(block.get("delay_ms", 0))
        for path, value in (point if isinstance(point, list) else [])
        if path == "network" and isinstance(value, dict)
        for block in value.values()
        if isinstance(block, dict)
    ]
    return max(delays, default=0.0)


def token(run: Path) -> Token:
    """The run's median decode token (:class:`CompareError` naming the file when it cannot be read)."""
    variant = load_variant(run)
    path = run / "aggregate" / "hs_tokens.csv"
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = [r for r in csv.DictReader(handle) if r.get("token") not in (None, "", "0")]
    except OSError as exc:
        raise CompareError(f"{path}: cannot be read ({exc.strerror})") from None
    needed = ["total_ns", *(f for f, _ in PARTS)]
    if not rows:
        raise CompareError(f"{path}: no decode token (only the prefill, or nothing)")
    missing = [f for f in needed if f not in rows[0]]
    if missing:
        raise CompareError(f"{path}: no column {', '.join(missing)}")
    doc = _controller_doc(run)
    return Token(
        path=run,
        strategy=variant.strategy,
        speculation=variant.speculation,
        control=variant.control,
        one_way_ms=one_way_ms(variant.others),
        total_ms=_median(rows, "total_ns"),
        parts_ms={name: _median(rows, field) for field, name in PARTS},
        messages=_messages(doc),
        geometry=_geometry(doc),
        repeat=variant.repeat,
    )


def _messages(doc: Mapping[str, Any]) -> float | None:
    tokens = doc.get("tokens")
    counts = [
        t["critical_messages"]
        for t in (tokens if isinstance(tokens, list) else [])[1:]
        if isinstance(t, Mapping) and isinstance(t.get("critical_messages"), int)
    ]
    return float(statistics.median(counts)) if counts else None


def lines(tokens: Iterable[Token]) -> list[Line]:
    """One least-squares line per (strategy + speculation, control) over the delay columns measured."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for t in tokens:
        groups.setdefault((t.name, t.control), []).append((t.one_way_ms, t.total_ms))
    out = []
    for (name, control), points in sorted(groups.items()):
        points.sort()
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        if len(set(xs)) < 2:
            out.append(Line(name, control, tuple(points), None, statistics.fmean(ys)))
            continue
        slope, intercept = statistics.linear_regression(xs, ys)
        out.append(Line(name, control, tuple(points), slope, intercept))
    return out


def overtaking_rtt_ms(baseline: Line, other: Line) -> float | None:
    """The added RTT (twice the one-way delay) past which ``baseline`` (layer-wise) is faster than
    ``other``: where their lines cross, None when they do not (parallel, or ``other`` faster for every
    delay ahead of 0) or a line has one column only."""
    if baseline.slope is None or other.slope is None or other.slope <= baseline.slope:
        return None
    one_way = (baseline.intercept - other.intercept) / (other.slope - baseline.slope)
    return 2 * one_way if one_way >= 0 else 0.0


def render(tokens: Sequence[Token]) -> str:
    """The two tables: where a token's time goes per run, and its growth with the delay per line."""
    out = ["decode token (median, prefill left out), ms and share of the token:"]
    head = ["strategy", "control", "+RTT ms", "token ms", *(n for _, n in PARTS), "messages"]
    out.append(" | ".join(head))
    for t in sorted(tokens, key=lambda t: (t.name, t.control, t.one_way_ms, t.repeat)):
        name = t.name + (f" (repeat {t.repeat})" if t.repeat > 1 else "")
        cells = [name, t.control, f"{2 * t.one_way_ms:g}", f"{t.total_ms:.1f}"]
        cells += [f"{t.parts_ms[n]:.1f} ({100 * t.share(n):.0f} %)" for _, n in PARTS]
        cells.append("—" if t.messages is None else f"{t.messages:g}")
        out.append(" | ".join(cells))
    fitted = lines(tokens)
    out.append("")
    out.append("decode ms per token against the added one-way delay (least squares over the columns):")
    for line in fitted:
        slope = "—" if line.slope is None else f"{line.slope:.2f} ms/ms"
        base = next((b for b in fitted if b.name == "layerwise" and b.control == line.control), None)
        cross = None if base is None or line.name == "layerwise" else overtaking_rtt_ms(base, line)
        over = (
            ""
            if base is None or line.name == "layerwise"
            else f", layer-wise overtakes at +{cross:.1f} ms RTT"
            if cross is not None
            else ", layer-wise does not overtake"
        )
        out.append(f"{line.name} ({line.control}): {slope}, {line.intercept:.1f} ms at +0{over}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headsplit.breakdown", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories or directories of runs")
    args = parser.parse_args(argv)
    try:
        tokens = [token(run) for run in run_dirs(args.runs)]
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
