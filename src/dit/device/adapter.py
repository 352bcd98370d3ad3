"""The model adapter protocol: what every partitionable model implements.

A model is a chain of ``num_stages`` stages numbered 1..N. Stage 0 is the model input.
Partition point ``p`` (0..N) means stages 1..p run on the device and the output of stage ``p``
is transmitted (p = 0 transmits the input, p = N transmits nothing).

Adapters are built from a *spec* (a plain dict, JSON-serialisable, so it can be shipped to a
board): ``{"name": str, "params": {...}, "input": {...}, "seed": int}``. A builder is a callable
``build(spec) -> StageModel`` referenced as ``"module:function"``; the controller resolves model
names to builders through the ``dit.models`` entry-point group and ships the reference, because
entry points do not exist inside the device zipapp.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StageModel(Protocol):
    """A model split into sequential stages that can run on different hosts."""

    name: str

    @property
    def num_stages(self) -> int:
        """N, the number of stages (partition points are 0..N)."""
        ...

    def make_input(self) -> Any:
        """The model input (stage 0's output), from the spec's input source and seed."""
        ...

    def run_stage(self, stage: int, x: Any) -> Any:
        """Run stage ``stage`` (1..N) on ``x`` (the output of stage ``stage - 1``)."""
        ...

    def encode(self, x: Any) -> bytes:
        """Serialise an activation for transmission."""
        ...

    def decode(self, data: bytes, stage: int) -> Any:
        """Inverse of :meth:`encode` for the output of ``stage`` (0..N)."""
        ...

    def output_bytes(self, stage: int) -> int:
        """Bytes a cut after ``stage`` transmits (stage 0: the input)."""
        ...

    def ops(self, stage: int) -> int:
        """Analytic operation count of stage ``stage`` (1..N)."""
        ...

    def max_abs_diff(self, a: Any, b: Any) -> float:
        """Largest absolute element-wise difference of two final outputs (equivalence check)."""
        ...


@runtime_checkable
class TimedPass(Protocol):
    """Optional: a model that times all its stages inside ONE call (the profiler prefers it).

    A framework whose per-call dispatch is costly (TensorFlow: ~0.2 ms per ``tf.function`` call)
    would otherwise add that cost to every stage's measured latency. ``timed_pass`` runs stages
    1..N back to back in one compiled call and reads a clock between them.
    """

    def timed_pass(self, x: Any) -> tuple[Any, Sequence[int]]:
        """Run stages 1..N on ``x`` (the model input) in one call.

        Returns the final output and ``N + 1`` stage-boundary times in nanoseconds on the wall
        clock (``time.time_ns`` scale): boundary 0 is read before stage 1 starts, boundary ``i``
        after stage ``i``'s output exists and before stage ``i + 1`` starts, so stage ``i`` took
        ``boundary[i] - boundary[i - 1]``. The sequence may be lazy (converted from the framework's
        timestamps when first read): the profiler runs its timing passes back to back and reads
        the boundaries only after the last one, so that no conversion runs between two passes.
        """
        ...


@runtime_checkable
class GeneratesTokens(Protocol):
    """Optional: a decoder whose token generation the agent profiles (``tokens`` > 0).

    The profiler lives with the model (it needs the framework), not in the device code: the model names
    it as ``"module:function"``, called as ``profile(model, tokens=, repetitions=, warmup=,
    origin_mono_ns=, results=, say=)`` and returning the ``generation`` record of ``done.json``.
    """

    generation_profiler: str

    def generate(self, prompt: Any, max_new_tokens: int, stage_hook: Any = None) -> list[int]:
        """Greedy generation of ``max_new_tokens`` tokens after ``prompt``."""
        ...


Builder = Callable[[Mapping[str, Any]], StageModel]


def load_ref(ref: str, what: str = "model builder") -> Any:
    """Import ``"package.module:function"`` and return the function."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} reference {ref!r} is not of the form 'module:function'")
    return getattr(importlib.import_module(module_name), attr)


def load_builder(ref: str) -> Builder:
    """Import ``"package.module:function"`` and return the builder."""
    builder: Builder = load_ref(ref)
    return builder
