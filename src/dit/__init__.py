"""dit - the Distributed Inference Testbed."""

__version__ = "0.1.0"
