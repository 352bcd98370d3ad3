"""Results for analysis: runs as tidy pandas DataFrames, and the spread of a measured quantity.

Load one run, a sweep (a directory of runs) or any list of runs::

    from dit import results

    res = results.load(["runs/ch4_validation"])      # every variant of the sweep
    res.phases.groupby("network.device1.delay_ms")["total_ns"].describe()

Each table holds the rows of every run, with the run's identity (``run_id``, ``run_dir``,
``scenario_hash``) and the values of its resolved ``scenario.yaml`` that are not the same in every
loaded run as columns, named by their dotted scenario path (``network.device1.delay_ms``;
``scenario_columns="all"`` adds every value; :attr:`Results.runs` always has every value). A list or a
mapping left empty is one value, written as JSON text. A scenario path that is also a column of the
table (the scenario's ``description`` in ``summary``) is named ``scenario.<path>`` there.

========== ====================================================== ========================================
table      one row per                                            read from
========== ====================================================== ========================================
phases     inference request: local … return, ``total_ns``       ``aggregate/phases.csv``
layers     (host, stage) of the layer profile                     ``aggregate/layers.csv``
tokens     generated token of a repetition: ``latency_ns``        ``raw/<host>/<host>_tokens.csv``
           (``source`` ``tokens.csv``), or of HeadSplit's         (layers runtime, every repetition),
           generation (``latency_ns`` = ``total_ns``,              ``aggregate/hs_tokens.csv``
           ``source`` ``hs_tokens.csv``)
monitors   sample of a metric on a node (long: node, t_ns,        ``aggregate/monitors.csv``
           metric, value)
energy     inference request or generation with a power trace;   ``aggregate/energy.csv``
           ``modelled`` true where a fake sensor gave the power
netem      shaped link: intended vs measured delay                ``aggregate/netem_check.csv``
summary    runtime summary value: ``runtime, metric, value,``     ``aggregate/summary.json``
           ``unit, description, modelled``
========== ====================================================== ========================================

Times are integer nanoseconds, as in the files (docs/interchange.md, docs/raw-results.md). A run
without a file has no rows in that table; a file that is there but not readable raises
:class:`~dit.analysis.run.AggregateError` naming it. :func:`export` writes every table to one CSV or
Parquet file (``dit export``; Parquet needs ``pyarrow``).

**Spread** (:func:`spread`, :mod:`dit.results.spread`): the number of values, the mean with its 95 %
confidence interval (Student's t) and the nearest-rank p50 / p95 / p99, as ``dit show``, the report
and NNPM show them.
"""

from dit.results.spread import CONFIDENCE, Spread, spread, t_quantile
from dit.results.tables import (
    FORMATS,
    READERS,
    RUN_COLUMNS,
    TABLES,
    Results,
    decode_tokens,
    export,
    flatten_scenario,
    load,
    parquet_missing,
    phase_total_spreads,
    read_energy,
    read_layers,
    read_monitors,
    read_netem,
    read_phases,
    read_summary,
    read_tokens,
    token_spreads,
)

__all__ = [
    "CONFIDENCE",
    "FORMATS",
    "READERS",
    "RUN_COLUMNS",
    "TABLES",
    "Results",
    "Spread",
    "decode_tokens",
    "export",
    "flatten_scenario",
    "load",
    "parquet_missing",
    "phase_total_spreads",
    "read_energy",
    "read_layers",
    "read_monitors",
    "read_netem",
    "read_phases",
    "read_summary",
    "read_tokens",
    "spread",
    "t_quantile",
    "token_spreads",
]
