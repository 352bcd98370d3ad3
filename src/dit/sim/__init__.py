"""``dit simulate``: a discrete-event simulator of decoder-only generation over heterogeneous devices.

- :mod:`dit.sim.engine` - the SimPy simulation (per-unit compute, links, KV growth, memory, re-placement);
- :mod:`dit.sim.spec` - a simulation described in YAML (``scenarios/sim/*.yaml``), what-if studies;
- :mod:`dit.sim.replay` - a finished HeadSplit run replayed, simulated beside measured (``--replay``);
- :mod:`dit.sim.placement_model` - HeadSplit's placement model, asked of its plug-in through the runtime registry.

Needs the ``sim`` extra (``pip install dit[sim]``: SimPy; HiGHS for the exact solvers).
"""
