"""The old name of :mod:`dit.analysis.aggregate`'s documented entry points, kept for callers of them.

docs/interchange.md documented ``dit.aggregate.aggregate_run`` and ``read_model_inputs`` before the
analysis package existed; new code imports :mod:`dit.analysis.aggregate`.
"""

from dit.analysis.aggregate import AggregateSummary, aggregate_run, read_model_inputs
from dit.analysis.links import DEFAULT_RATE_BPS
from dit.analysis.run import AggregateError

__all__ = ["DEFAULT_RATE_BPS", "AggregateError", "AggregateSummary", "aggregate_run", "read_model_inputs"]
