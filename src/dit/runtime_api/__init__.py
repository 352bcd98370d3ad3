"""The runtime interface and the registry of installed runtimes, below the scenario package.

The scenario schema takes each installed runtime's block from :mod:`dit.runtime_api.registry`, so the
interface (:mod:`dit.runtime_api.interface`) and the registry import nothing of the scenario, the
analysis or the run engine. Runtime authors import the interface from :mod:`dit.runtimes`.
"""
