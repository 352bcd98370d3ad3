"""NNPM, the web manager of the testbed (``dit web``): a client of the same driver the CLI uses.

Modules: :mod:`~dit.web.app` (the FastAPI application and its routes), :mod:`~dit.web.nodes` (the
NNPM-managed YAML inventory), :mod:`~dit.web.topology` (great-circle link latencies → netem
per-destination profiles), :mod:`~dit.web.probe` (three pings every two seconds per node),
:mod:`~dit.web.store` (immutable scenario versions in SQLite), :mod:`~dit.web.runs` (runs started as
``python -m dit run`` subprocesses, stopped with ``dit stop``), :mod:`~dit.web.terminal` (``run.log``
tailed over a WebSocket), :mod:`~dit.web.runtimes` (readiness checks and maintenance actions),
:mod:`~dit.web.plots` (server-rendered PNG plots). The page itself is ``static/`` (vanilla JS
modules; Leaflet from the ``xstatic-leaflet`` package).
"""
