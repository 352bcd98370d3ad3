"""Delay variation over time: the schedule (pure) and the ``netem-vary`` device command (stdlib only).

The scenario's ``network.<device>.variation`` block describes how the added delay changes:

- ``constant``: ``delay_ms`` throughout; no process runs.
- ``uniform``: a new delay drawn uniformly from ``[low_ms, high_ms]`` every ``interval_s`` seconds.
  The generator is ``random.Random(f"{seed}:{device}")`` (a string seed is hashed with SHA-512 by
  :mod:`random`, so the sequence is the same on every Python and every run, independent of
  ``PYTHONHASHSEED``), one generator per device so that adding a device changes nobody else's
  sequence. Draws are rounded to the microsecond, the resolution ``tc`` is given.
- ``square``: ``low_ms`` for half a period, then ``high_ms`` for half a period, starting low.

Step ``i`` takes effect ``offset_ns`` after the process starts (step 0 at offset 0: the process
first re-applies the initial value, so its log starts with the value in force). The process
changes the qdisc with the ``tc qdisc change`` argv the controller built, with the one element
``"{delay}"`` replaced by the step's delay, and appends every change to ``netem_changes.csv``
in the results directory with its ``time.monotonic_ns()``; aggregate aligns it onto the device's
origin. In dry-run mode (local mode: this kernel has no ``sch_netem``) it appends the argv to a
JSON-lines log instead of running it. With the userspace backend (no ``sch_netem``, the link
emulator of :mod:`dit.device.link_emulator` holds the packets) each step goes to the emulator's
control socket (``control_socket``: a UNIX datagram ``{"delay_ms": ...}``) instead of ``tc``, and is
logged the same way.
"""

from __future__ import annotations

import csv
import json
import math
import random
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.device.common import ConfigError, require, write_json
from dit.device.sampling import StopSignal

KINDS = ("constant", "uniform", "square")
PLACEHOLDER = "{delay}"
CHANGES_FILE = "netem_changes.csv"
CHANGES_COLUMNS = ("step", "t_mono_ns", "delay_ms", "ok", "dry_run", "error")


@dataclass(frozen=True)
class Step:
    index: int
    offset_ns: int  # from the start of the variation process
    delay_ms: float


def generator(seed: int | str, device: str) -> random.Random:
    """The per-device generator of the ``uniform`` kind (documented in the module docstring)."""
    return random.Random(f"{seed}:{device}")


def _us(ms: float) -> float:
    """Round a delay in ms to the microsecond."""
    return round(ms * 1000.0) / 1000.0


def steps(variation: Mapping[str, Any], seed: int | str, device: str) -> Iterator[Step]:
    """The infinite schedule of ``variation`` (kind ``uniform`` or ``square``)."""
    kind = variation.get("kind", "constant")
    low, high = float(variation["low_ms"]), float(variation["high_ms"])
    if low > high:
        raise ValueError(f"variation.low_ms ({low}) is greater than high_ms ({high})")
    if kind == "uniform":
        interval_ns = round(float(variation["interval_s"]) * 1e9)
        if interval_ns <= 0:
            raise ValueError("variation.interval_s must be positive")
        rng = generator(seed, device)
        index = 0
        while True:
            yield Step(index, index * interval_ns, _us(rng.uniform(low, high)))
            index += 1
    elif kind == "square":
        half_ns = round(float(variation["period_s"]) * 1e9 / 2)
        if half_ns <= 0:
            raise ValueError("variation.period_s must be positive")
        index = 0
        while True:
            yield Step(index, index * half_ns, _us(low if index % 2 == 0 else high))
            index += 1
    else:
        raise ValueError(f"variation.kind {kind!r} has no schedule (expected uniform or square)")


def schedule(variation: Mapping[str, Any], seed: int | str, device: str, count: int) -> list[Step]:
    """The first ``count`` steps of :func:`steps`."""
    out: list[Step] = []
    for step in steps(variation, seed, device):
        if len(out) >= count:
            break
        out.append(step)
    return out


def format_ms(ms: float) -> str:
    """A delay as ``tc`` reads it: ``20ms``, ``12.345ms`` (microsecond resolution, no trailing zeros)."""
    if ms < 0 or not math.isfinite(ms):
        raise ValueError(f"delay {ms} ms is not a non-negative number")
    text = f"{_us(ms):.3f}".rstrip("0").rstrip(".")
    return f"{text}ms"


def change_argv(template: list[str], delay_ms: float) -> list[str]:
    """``template`` with its ``"{delay}"`` element replaced by ``delay_ms``."""
    if template.count(PLACEHOLDER) != 1:
        raise ValueError(f"the change template must hold {PLACEHOLDER!r} exactly once: {template}")
    token = format_ms(delay_ms)
    return [token if item == PLACEHOLDER else item for item in template]


def _append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def _send_control(path: str, delay_ms: float) -> tuple[bool, str]:
    """One delay change to the link emulator's control socket."""
    from dit.device.link_emulator import unix_address

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, unix_address(path) as address:
            sock.sendto(json.dumps({"delay_ms": delay_ms}).encode("utf-8"), address)
    except OSError as exc:
        return False, f"link emulator control socket {path}: {exc}"
    return True, ""


def run_netem_vary(cfg: Mapping[str, Any]) -> int:
    """The ``netem-vary`` command.

    Config: ``run_id``, ``host``, ``device``, ``seed``, ``results_dir``, ``variation`` (the
    scenario block), ``template`` (the ``tc qdisc change`` argv with ``"{delay}"``), ``dry_run``
    (bool), ``log`` (the JSON-lines log of recorded argv, with ``dry_run``), optional
    ``ready_file`` (written after step 0) and ``max_steps`` (stop after that many steps; runs until
    SIGTERM otherwise). With ``control_socket`` (the userspace backend's link emulator) the steps
    go there and ``template`` is not needed.
    """
    host = str(require(cfg, "host", str))
    device = str(cfg.get("device", host))
    seed = cfg.get("seed", 0)
    results = Path(require(cfg, "results_dir", str))
    variation = require(cfg, "variation", dict)
    control = str(cfg.get("control_socket") or "")
    template = (
        [str(a) for a in cfg.get("template") or []]
        if control
        else [str(a) for a in require(cfg, "template", list)]
    )
    dry_run = bool(cfg.get("dry_run", False))
    log: Path | None = None
    if dry_run:
        if not cfg.get("log"):
            raise ConfigError("log: is required with dry_run")
        log = Path(str(cfg["log"]))
    max_steps = cfg.get("max_steps")
    ready_file = cfg.get("ready_file")
    try:
        if not control:
            change_argv(template, 0.0)
        iterator = steps(variation, seed, device)
    except (ValueError, KeyError) as exc:
        raise ConfigError(str(exc)) from exc
    results.mkdir(parents=True, exist_ok=True)
    out_path = results / CHANGES_FILE
    new_file = not out_path.exists()
    start = time.monotonic_ns()
    # SIGTERM (teardown) ends a wait at once and the command exits 0: a stop, not a failure.
    with StopSignal() as stop, out_path.open("a", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        if new_file:
            writer.writerow(CHANGES_COLUMNS)
            handle.flush()
        for step in iterator:
            if max_steps is not None and step.index >= int(max_steps):
                break
            due = start + step.offset_ns
            while (remaining := due - time.monotonic_ns()) > 0 and not stop.wait(remaining / 1e9):
                pass
            if stop.requested:
                break
            t_ns = time.monotonic_ns()
            ok, error = True, ""
            if control:
                ok, error = _send_control(control, step.delay_ms)
            elif log is not None:
                argv = change_argv(template, step.delay_ms)
                _append_jsonl(log, {"argv": argv, "t_mono_ns": t_ns, "source": "netem-vary"})
            else:
                argv = change_argv(template, step.delay_ms)
                proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
                ok = proc.returncode == 0
                error = "" if ok else (proc.stderr or proc.stdout).strip()[-300:]
            writer.writerow((step.index, t_ns, f"{step.delay_ms:g}", int(ok), int(dry_run), error))
            handle.flush()
            if step.index == 0 and ready_file:
                write_json(
                    Path(str(ready_file)), {"host": host, "t_mono_ns": t_ns, "delay_ms": step.delay_ms}
                )
    return 0
