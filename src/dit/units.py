"""Numbers as a person reads them: a unit and a sensible scale, never raw nanoseconds.

One set of formatters for ``dit report``, ``dit show`` and the runtime summaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

MISSING: Final = "\u2013"  # an en dash: no value
_TIME: Final = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
_BYTES: Final = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))


def _number(value: float, digits: int = 3) -> str:
    """``digits`` significant figures, no exponent for the magnitudes used here."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{value:.{decimals}f}"


def _missing(value: float | int | None) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _scaled(value: float | int | None, scales: tuple[tuple[float, str], ...]) -> str:
    """``value`` in the largest of ``scales`` (largest first, ending at 1) it reaches."""
    if value is None or _missing(float(value)):
        return MISSING
    number = float(value)
    scale, unit = next((s, u) for s, u in scales if abs(number) >= s or s == 1.0)
    return f"{_number(number / scale)} {unit}"


def duration(ns: float | int | None) -> str:
    """``12.3 ms``, ``1.25 s``, ``850 µs``; :data:`MISSING` for a missing value."""
    return _scaled(ns, _TIME)


def durations(values: Sequence[float | int | None], sep: str = " / ") -> str:
    """Several durations in the scale of the largest, the unit said once: ``12.1 / 13.0 / 13.4 ms``
    (figures read side by side compare digit by digit); a missing one is :data:`MISSING`."""
    present = [float(v) for v in values if v is not None and not _missing(float(v))]
    if not present:
        return sep.join(MISSING for _ in values)
    largest = max(abs(v) for v in present)
    scale, unit = next((s, u) for s, u in _TIME if largest >= s or s == 1.0)
    shown = [MISSING if v is None or _missing(float(v)) else _number(float(v) / scale) for v in values]
    return f"{sep.join(shown)} {unit}"


def size(num_bytes: float | int | None) -> str:
    """``393 kB``, ``1.20 MB`` (decimal units)."""
    return _scaled(num_bytes, _BYTES)


def power(watts: float | None) -> str:
    return MISSING if watts is None or _missing(watts) else f"{_number(watts)} W"


def energy(joules: float | None) -> str:
    """``621 mJ``, ``1.20 J``."""
    if joules is None or _missing(joules):
        return MISSING
    if abs(joules) >= 1 or joules == 0:
        return f"{_number(joules)} J"
    return f"{_number(joules * 1e3)} mJ"


def percent(value: float | None) -> str:
    return MISSING if value is None or _missing(value) else f"{_number(value)} %"


def rate(bits_per_s: float | None) -> str:
    if bits_per_s is None or _missing(bits_per_s):
        return MISSING
    return f"{_number(bits_per_s / 1e6)} Mbit/s"


def with_unit(value: object, unit: str) -> str:
    """A runtime summary value (``dit.runtime_api.interface.SummaryValue``) in its unit, rescaled where known."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value} {unit}".strip()
    if unit == "ns":
        return duration(value)
    if unit == "B":
        return size(value)
    if unit == "J":
        return energy(float(value))
    if unit == "W":
        return power(float(value))
    if unit == "%":
        return percent(float(value))
    if unit == "ns^2":  # a variance of delays
        return f"{_number(float(value) / 1e12)} ms²"
    if unit == "J*s":  # an energy-delay product: in J·s from 1 J·s, like energy()
        edp = float(value)
        return f"{_number(edp)} J·s" if abs(edp) >= 1 else f"{_number(edp * 1e3)} mJ·s"
    if isinstance(value, int):
        return f"{value:,} {unit}".strip()
    return f"{_number(float(value))} {unit}".strip()
