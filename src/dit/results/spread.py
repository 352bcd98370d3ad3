"""The spread of a measured quantity: the mean with its 95 % confidence interval, and p50 / p95 / p99.

The interval is Student's t-interval, ``mean ± t(0.975, n-1) · s / √n``, with the t quantile computed
here from the regularised incomplete beta function (no SciPy needed, so every machine gives the same
figures); it assumes independent repetitions and a mean that is roughly normal (a few dozen
repetitions of a latency usually are). The percentiles are nearest-rank
(:func:`dit.analysis.lateness.percentile_nearest_rank`): always a measured value, never an
interpolation between two, so with fewer than 100 values the p99 is the maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import pandas as pd

from dit import units
from dit.analysis.lateness import percentile_nearest_rank

CONFIDENCE: Final = 0.95
"""The confidence level of :attr:`Spread.ci_low` … :attr:`Spread.ci_high`."""


@dataclass(frozen=True)
class Spread:
    """Number, mean, the mean's 95 % confidence interval and the nearest-rank p50 / p95 / p99 of a
    sample, in its unit (ns for times). ``ci_low``/``ci_high`` are None below two values."""

    n: int
    mean: float
    ci_low: float | None
    ci_high: float | None
    p50: float
    p95: float
    p99: float

    @property
    def ci_half(self) -> float | None:
        """Half the width of the confidence interval (the t-interval is symmetric about the mean)."""
        return None if self.ci_low is None or self.ci_high is None else (self.ci_high - self.ci_low) / 2

    def mean_text(self) -> str:
        """The mean and its interval as durations: ``12.3 ± 0.41 ms`` (``12.3 ms`` below two values)."""
        half = self.ci_half
        if half is None:
            return units.duration(self.mean)
        return units.durations([self.mean, half], sep=" ± ")

    def percentiles_text(self) -> str:
        """``p50 / p95 / p99`` as durations in one scale: ``12.1 / 13.0 / 13.4 ms``."""
        return units.durations([self.p50, self.p95, self.p99])


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz, Numerical Recipes 6.4)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 <= p < 1) of Student's t distribution with ``df`` degrees of freedom.

    Found by bisection on the two-sided tail ``P(|T| > t) = I_{df/(df+t²)}(df/2, 1/2)``, to double
    precision: t(0.975, 9) = 2.2622, t(0.975, 1) = 12.706.
    """
    if not 0.5 <= p < 1.0:
        raise ValueError(f"t quantile: p {p} is not in [0.5, 1)")
    if df < 1:
        raise ValueError(f"t quantile: {df} degrees of freedom, at least 1")
    tail = 2.0 * (1.0 - p)

    def two_sided(t: float) -> float:
        return _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))

    low, high = 0.0, 1.0
    while two_sided(high) > tail:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        low, high = (middle, high) if two_sided(middle) > tail else (low, middle)
    return (low + high) / 2.0


def spread(values: Iterable[float] | pd.Series[Any]) -> Spread:
    """The :class:`Spread` of ``values`` (missing ones left out); ``ValueError`` when none is left."""
    series = pd.to_numeric(
        pd.Series(list(values) if not isinstance(values, pd.Series) else values), errors="coerce"
    )
    clean = [float(v) for v in series.dropna()]
    if not clean:
        raise ValueError("spread of no values")
    n = len(clean)
    mean = math.fsum(clean) / n
    low = high = None
    if n >= 2:
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in clean) / (n - 1))
        half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
        low, high = mean - half, mean + half
    return Spread(
        n=n,
        mean=mean,
        ci_low=low,
        ci_high=high,
        p50=percentile_nearest_rank(clean, 50),
        p95=percentile_nearest_rank(clean, 95),
        p99=percentile_nearest_rank(clean, 99),
    )
