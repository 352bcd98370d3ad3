"""HeadSplit: head-level distributed inference of decoder LMs (see docs/headsplit.md).

The core (config, units, model, engine, placement, memory, speculation, rpc) needs only torch and
the standard library; ``headsplit.dit_runtime`` is the one module that imports the testbed's runtime
interface, and only when dit loads it through the ``dit.runtimes`` entry point.
"""

__version__ = "0.1.0"
