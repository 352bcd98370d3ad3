"""NNPM's HTTP API, one router per concern: nodes, scenarios, runs, runtimes (see :mod:`dit.web.app`)."""
