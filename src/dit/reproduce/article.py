"""The article's figures each chapter's report sets beside the measurement, with where they come from.

Chapter 4 is the testbed article (``testbed-article``): the delay model validated on four boards under
both policies. Chapters 5 and 6 are the testbed article's Chapter 5 paragraph and the HeadSplit article
(``headsplit-article``). Only what the articles state is here; a quantity they give no figure for has
none (the report says "no figure in the article").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Figure:
    """One published figure: its text as printed, the bounds a measurement is held to, and its source."""

    text: str
    source: str
    low: float | None = None  # a measurement within [low, high] reproduces it
    high: float | None = None

    def holds(self, value: float) -> bool | None:
        """Whether ``value`` reproduces the figure (None: the figure has no bounds to hold it to)."""
        if self.low is None and self.high is None:
            return None
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


TESTBED: Final = "testbed article, “From measurements to partitions” and Chapter 4"
HEADSPLIT: Final = "HeadSplit article"

FIGURES: Final[dict[str, Figure]] = {
    # Chapter 4: the delay model against four boards, RR and SJF (the chart of the testbed article)
    "ch4.mape": Figure("delay model within 10 % of the measurement", TESTBED, None, 10.0),
    "ch4.gap": Figure("exhaustive search measures the heuristics' optimality gap (no figure given)", TESTBED),
    # Chapter 5: decoder-layer profiles on the boards
    "ch5.head_ms": Figure(
        "one attention head 2.4 to 6.5 ms per token on a board", "testbed article, Chapter 5", 2.4, 6.5
    ),
    "ch5.ffn_s": Figure(
        "feed-forward block 0.23 to 0.62 s per token on a board", "testbed article, Chapter 5", 0.23, 0.62
    ),
    "ch5.link_mbps": Figure("link measured at 19.6 Mbit/s", "testbed article, Chapter 5", 15.0, 25.0),
    # Chapter 6: HeadSplit on one controller and four workers
    "ch6.tokens_256_s": Figure("256 tokens: greedy 40.0 s, round-robin 44.8 s, layer-wise 62.4 s", HEADSPLIT),
    "ch6.speedup_heads": Figure(
        "head-level partitioning alone 1.24 to 1.31x over layer-wise", HEADSPLIT, 1.24, 1.31
    ),
    "ch6.speedup_full": Figure("the full system 1.54 to 1.67x over layer-wise", HEADSPLIT, 1.54, 1.67),
    "ch6.rtt": Figure("≥ 1.35x up to 15 ms added RTT; layer-wise better past ~25 ms", HEADSPLIT, 1.35, None),
    "ch6.shares_layerwise": Figure(
        "layer-wise: attention about 55 %, the FFN 35 % of per-layer time", HEADSPLIT
    ),
    "ch6.shares_heads": Figure("heads distributed: attention 24 %, the FFN 48 %", HEADSPLIT),
    "ch6.overtake": Figure("layer-wise better past ~25 ms added RTT", HEADSPLIT),
    "ch6.acceptance": Figure("acceptance 84 % at τ = 0.05 (TinyLlama)", HEADSPLIT, 74.0, 94.0),
    # Memory: the article's only figures on re-placement (no bytes moved, no speed before and after)
    "ch6.replacement": Figure(
        "re-placement at 85 % of a board's memory, about 1.4 times per 512-token run, each planned in under "
        "5 ms (no bytes moved nor speed around it given)",
        HEADSPLIT,
        None,
        5.0,
    ),
    "ch6.static_oom": Figure("a static placement ran out of memory beyond roughly 400 tokens", HEADSPLIT),
}
"""Keyed ``<chapter>.<quantity>``."""

# 256 tokens on the article's rack (HeadSplit article): the simulated projection is set beside these
ARTICLE_256_TOKENS_S: Final = {"greedy": 40.0, "roundrobin": 44.8, "layerwise": 62.4}

# The tolerance sweep (HeadSplit article): what it says of the other tolerances
ARTICLE_TAU: Final = {
    0.02: "acceptance 91 %, speedup 1.48x (re-execution)",
    0.1: "speedup 1.51x",
}
