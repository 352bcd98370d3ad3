"""How a run ends early: a stage that failed, or a stop that was asked for."""

from __future__ import annotations


class StageFailed(Exception):
    """A stage did not complete; the message says which node and why."""


class Stopped(Exception):
    """The run was asked to stop (Ctrl-C, SIGTERM, ``dit stop``)."""
