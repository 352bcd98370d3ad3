"""Analysis of a finished run on the controller: nothing here touches a node.

- :mod:`dit.analysis.aggregate` — the aggregate stage: raw per-host results to the interchange files;
- :mod:`dit.analysis.monitors` — monitor, power and load traces on one timeline, throttling, energy;
- :mod:`dit.analysis.tokens` — token generation of decoder models: per-head and per-token tables;
- :mod:`dit.analysis.delay` — the thesis' delay model (pure functions);
- :mod:`dit.analysis.model_validation` — the delay model's prediction against the measured delays.
"""
