"""The inference runtime's thread count, applied inside the frameworks (stdlib only).

``hardware.<device>.threads`` reaches a device process as ``DIT_THREADS`` (and the OpenMP / MKL / OpenBLAS /
TensorFlow variables, see :mod:`dit.conditions.threads`; the profile command also exports them from its
config's ``threads``). Environment variables alone are read only where a library looks at them, and only
before it starts its pools, so the adapters also set the count through the framework's own API the moment
they import it:

- PyTorch (:func:`configure_torch`): ``torch.set_num_threads(n)`` (intra-op) and
  ``torch.set_num_interop_threads(n)``. The latter is allowed once per process, before any parallel work;
  a ``RuntimeError`` (already set, work already started) is recorded, not raised;
- TensorFlow (:func:`configure_tensorflow`): ``tf.config.threading.set_intra_op_parallelism_threads(n)``
  and ``set_inter_op_parallelism_threads(n)``, which must happen before TensorFlow initialises its
  runtime (``RuntimeError`` afterwards: recorded).

Whatever was requested, the values are then *read back* from the framework (``get_num_threads`` /
``get_num_interop_threads``, ``get_intra_op_parallelism_threads`` / ``get_inter_op_parallelism_threads``;
TensorFlow's 0 means "its default: one per core") and kept per process; :func:`effective` returns them,
and the profile command writes them to ``done.json`` as ``threads_effective`` (docs/raw-results.md).
"""

from __future__ import annotations

import os
from typing import Any, Final

THREADS_ENV: Final = "DIT_THREADS"

_effective: dict[str, dict[str, Any]] = {}


def requested(environ: Any = None) -> int | None:
    """The count ``DIT_THREADS`` asks for (None: not set); a bad value is an error naming the variable."""
    env = os.environ if environ is None else environ
    raw = env.get(THREADS_ENV)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{THREADS_ENV}: {raw!r} is not a positive integer") from None
    if value < 1:
        raise ValueError(f"{THREADS_ENV}: {raw!r} is not a positive integer")
    return value


def configure_torch(torch: Any) -> dict[str, Any]:
    """Apply ``DIT_THREADS`` to PyTorch's intra- and inter-op pools; record and return the read-back."""
    count = requested()
    record: dict[str, Any] = {"requested": count, "errors": []}
    if count is not None:
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)
        if torch.get_num_interop_threads() != count:
            try:
                torch.set_num_interop_threads(count)
            except RuntimeError as exc:  # once per process, before any inter-op work
                record["errors"].append(f"set_num_interop_threads({count}): {exc}")
    record["intra_op"] = int(torch.get_num_threads())
    record["inter_op"] = int(torch.get_num_interop_threads())
    _effective["torch"] = record
    return record


def configure_tensorflow(tf: Any) -> dict[str, Any]:
    """Apply ``DIT_THREADS`` to TensorFlow's intra- and inter-op pools; record and return the read-back."""
    count = requested()
    threading = tf.config.threading
    record: dict[str, Any] = {"requested": count, "errors": []}
    if count is not None:
        for what in ("intra_op", "inter_op"):
            if getattr(threading, f"get_{what}_parallelism_threads")() == count:
                continue
            try:
                getattr(threading, f"set_{what}_parallelism_threads")(count)
            except RuntimeError as exc:  # TensorFlow already initialised its runtime
                record["errors"].append(f"set_{what}_parallelism_threads({count}): {exc}")
    record["intra_op"] = int(threading.get_intra_op_parallelism_threads())
    record["inter_op"] = int(threading.get_inter_op_parallelism_threads())
    _effective["tensorflow"] = record
    return record


def effective() -> dict[str, Any]:
    """``{"requested": n | None, "<framework>": {"requested", "intra_op", "inter_op", "errors"}, …}``.

    One entry per framework an adapter configured in this process (none for the stdlib fake model, whose
    stages run on the calling thread: one core).
    """
    return {"requested": requested(), **{name: dict(rec) for name, rec in sorted(_effective.items())}}
