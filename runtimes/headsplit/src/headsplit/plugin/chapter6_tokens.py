"""Chapter 6's measured token: where its time goes per strategy, how it grows with the links' delay, and,
where a strategy misses the article, which part of the token is why (issue 47).

The numbers come from HeadSplit's own reading of its runs (``headsplit.breakdown``: the median decode
token of ``aggregate/hs_tokens.csv``, the prefill left out).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from dit.report.section import Section
from dit.reproduce.article import FIGURES
from dit.units import MISSING
from headsplit.breakdown import PARTS, Token, lines, overtaking_rtt_ms, token
from headsplit.compare import CompareError

#: The strategy the article gives its token's shares for, per name (greedy: the heads distributed).
_SHARE_FIGURES = {"layerwise": "ch6.shares_layerwise", "greedy": "ch6.shares_heads"}
_WORKERS = 4


def tokens(run_dirs: Sequence[Path]) -> tuple[dict[Path, Token], list[str]]:
    """Every run's median decode token, and why a run has none."""
    found: dict[Path, Token] = {}
    problems: list[str] = []
    for run in run_dirs:
        try:
            found[run] = token(run)
        except CompareError as exc:
            problems.append(str(exc))
    return found, problems


def why(baseline: Token, other: Token) -> str:
    """Which part of ``other``'s token keeps it from beating layer-wise's by more: the parts side by side,
    what the heads saved and what grew, and the bound the attention's share sets over the workers."""
    names = [n for _, n in PARTS]
    changes = {n: other.parts_ms[n] - baseline.parts_ms[n] for n in names}
    side = ", ".join(f"{n} {baseline.parts_ms[n]:.1f} → {other.parts_ms[n]:.1f} ms" for n in names)
    saved = -sum(v for v in changes.values() if v < 0)
    grown = {n: v for n, v in changes.items() if v > 0}
    share = baseline.share("attention") + baseline.share("projection")
    bound = 1 / (1 - share + share / _WORKERS) if share < 1 else float(_WORKERS)
    text = f"per token (layer-wise → {other.name}): {side}"
    if grown:
        worst = max(grown, key=lambda n: grown[n])
        text += (
            f"; it saved {saved:.1f} ms and spent {sum(grown.values()):.1f} ms more, most of it on "
            f"{worst} (+{grown[worst]:.1f} ms)"
        )
    return text + (
        f"; attention and projection are {100 * share:.0f} % of layer-wise's token, so spreading them over "
        f"{_WORKERS} workers can give at most {bound:.2f}x"
    )


def breakdown_section(found: Mapping[Path, Token], where: str, problems: Sequence[str] = ()) -> Section:
    """Per run, the median decode token's parts and shares, beside the article's shares."""
    section = Section("Where a token's time goes", "breakdown")
    rows = []
    for t in sorted(found.values(), key=lambda t: (t.one_way_ms, t.control, t.name, t.repeat)):
        figure = None if t.speculation else _SHARE_FIGURES.get(t.strategy)
        again = f", repeat {t.repeat}" if t.repeat > 1 else ""
        cells = [f"{t.name}{again}, +{2 * t.one_way_ms:g} ms, control {t.control}", f"{t.total_ms:.1f} ms"]
        cells += [f"{t.parts_ms[n]:.1f} ms ({100 * t.share(n):.0f} %)" for _, n in PARTS]
        cells.append(MISSING if t.messages is None else f"{t.messages:g}")
        cells.append(FIGURES[figure].text if figure else "no figure in the article")
        rows.append(cells)
    columns = ["run", "decode token", *(n for _, n in PARTS), "messages on its path", "the article"]
    section.table("", columns, rows)
    geometry = sorted({t.geometry for t in found.values()})
    section.note = (
        f"Measured on {where}; {'; '.join(geometry) or 'no run'}. The median decode token (the prefill left "
        "out): attention is the slowest head worker's compute per layer, communication the token's time "
        "off its compute chain (messages, waits, dispatch), docs/headsplit.md. The article's shares are of "
        "per-layer time on its boards." + (" Not read: " + "; ".join(problems) if problems else "")
    )
    return section


def delay_section(found: Mapping[Path, Token], where: str) -> Section:
    """Per strategy and control: the decode token at each added RTT, its growth per ms of one-way delay
    and the added RTT past which layer-wise is faster, beside the article's ~25 ms."""
    section = Section("A token against the added delay", "delay")
    fitted = lines(found.values())
    columns = sorted({x for line in fitted for x, _ in line.points})
    rows = []
    for line in fitted:
        at = {x: statistics.fmean(y for px, y in line.points if px == x) for x, _ in line.points}
        cells = [f"{line.name}, control {line.control}"]
        cells += [f"{at[x]:.1f} ms" if x in at else MISSING for x in columns]
        cells.append(MISSING if line.slope is None else f"{line.slope:.2f}")
        base = next((b for b in fitted if b.name == "layerwise" and b.control == line.control), None)
        if line.name == "layerwise" or base is None:
            cells += ["the baseline" if line.name == "layerwise" else MISSING, "—"]
        else:
            cross = overtaking_rtt_ms(base, line)
            if line.slope is None or base.slope is None:
                cells.append("one column only")
            else:
                cells.append("not within reach of these lines" if cross is None else f"+{cross:.1f} ms")
            cells.append(FIGURES["ch6.overtake"].text)
        rows.append(cells)
    heads = [f"+{2 * x:g} ms" for x in columns]
    section.table(
        "", ["strategy", *heads, "ms per ms of one-way delay", "layer-wise overtakes at", "the article"], rows
    )
    section.note = (
        f"Measured on {where}. The median decode token at each added RTT (half of it on every worker's "
        "egress; a strategy timed more than once there: the mean of its repeats); the slope is a "
        "least-squares line's through the columns: the delayed messages on a "
        "token's path (dataflow: layer-wise over 4 workers crosses 4 delayed links and the controller's "
        "start is not delayed; rpc: every call's round trip). Layer-wise overtakes where the lines cross."
    )
    return section
