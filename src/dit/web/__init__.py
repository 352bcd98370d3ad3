"""NNPM, the testbed's web manager: ``dit web`` starts it, :mod:`dit.web` is its code (one name, NNPM, in
the docs and here; ``web`` is only the command and the package). A client of the same driver the CLI uses.

- :mod:`~dit.web.app` builds the FastAPI application from :mod:`~dit.web.config` (``dit web``'s
  options) and :mod:`~dit.web.security` (token, loopback, Origin, body limits);
- :mod:`dit.web.routes`: the HTTP API, one router per concern (nodes, scenarios, runs, runtimes);
- :mod:`dit.web.services`: what the routers call, testable without HTTP: the NNPM-managed YAML inventory
  (``nodes``), great-circle link latencies → netem profiles (``topology``), the floor plan
  (``floorplan``), three pings every two seconds per node (``probe``), immutable scenario versions in
  SQLite (``store``), runs started as ``python -m dit run`` subprocesses and stopped with ``dit stop``
  (``runs``, their page ``runpage``, ``benchmark``), ``run.log`` tailed over a WebSocket (``terminal``),
  readiness checks and maintenance actions (``runtimes``), server-rendered PNG plots (``plots``);
- ``static/``: the page (vanilla JS modules; Leaflet from the ``xstatic-leaflet`` package).
"""
