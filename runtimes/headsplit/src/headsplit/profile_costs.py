"""Placement costs measured by a profile run instead of the start-up micro-benchmark.

A *profile run* is a run of dit's built-in ``layers`` runtime with ``runtime: {tokens: N}`` on a
decoder model: every device generates N tokens with the per-head hooks of
``dit.models.decoder_profile`` and the run's results parser writes every device's rows to
``aggregate/heads.csv`` (``host,rep,token,layer,unit,head,latency_ns,ops,kv_len``; docs/models.md).
Each row times one unit of one token on one device under that run's conditions (CPU share, memory
limit, frequency): ``head`` one attention head on its own kernels (as a HeadSplit worker runs it),
``projection`` the output projection, ``ffn`` the feed-forward block; ``ops`` is the unit's
multiply-accumulate count for that token.

The rule (:func:`read_profile`). Per device and per unit kind, over the decode rows (token > 0; token
0 is the prompt's prefill) of every repetition::

    rate(device, kind) = sum of 2 * ops / sum of latency      (FLOP/s; 1 multiply-accumulate = 2 FLOPs)

the work over the time it took, not the median row: under a CPU share (a CFS quota) short kernels run
at full speed until the period's quota is spent and the process then stalls for the rest of the
period, so the quota shows as a few rows holding a whole stall. Their median hides it, their sum does
not (measured in local mode, a device at 20 % of a CPU against one at 80 %: median head 88.6 against
82.8 us, summed heads 21.2 against 3.7 ms). A profile long enough to span many quota periods (100 ms
each) gives a steady rate; a short one samples few stalls.

A HeadSplit unit of that kind on the worker running on that device costs
``FLOPs(unit) / rate`` (headsplit.placement's cost model, :meth:`WorkerSpec.rate`). When the
profiled model is the run's own the costs are the measured times (to the decomposition's rounding:
a profiled head counts its share of the K and V projections, a HeadSplit head adds them once per KV
copy); when it is another model the measured rates are scaled to the run's units by their FLOPs,
which assumes a device sustains the same FLOP/s on units of another size: a profile of a much
smaller model, whose kernels are dominated by per-call overhead, makes every unit look slower. The
controller records the FLOPs of a profiled unit beside the run's own (``placement.costs.kinds``) so
the size of that extrapolation is in the results.

Standard library only (the plug-in reads the run directory where dit runs, at ``dit validate`` and at
launch; the controller reads the document :func:`costs_document` makes, shipped as a file).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The profile run's table, relative to its run directory.
HEADS_CSV = "aggregate/heads.csv"
#: Its columns (``host`` + ``dit.models.decoder_profile.HEAD_COLUMNS``, dit.analysis.tokens).
COLUMNS = ("host", "rep", "token", "layer", "unit", "head", "latency_ns", "ops", "kv_len")
#: The profile's unit names -> HeadSplit's unit kinds (headsplit.units).
KINDS = {"head": "head", "projection": "proj", "ffn": "ffn"}
FLOPS_PER_OP = 2  # dit's ``ops`` count multiply-accumulates
FORMAT = "headsplit-placement-costs/1"
RULE = (
    "per device and unit kind, over the profile's decode rows (token > 0): sum of 2 * ops / sum of latency "
    "(FLOP/s); a unit costs FLOPs(unit) / that rate on the worker of that device"
)


class ProfileError(ValueError):
    """A profile run directory or costs document that cannot be used; the message names the file and
    the field."""


@dataclass(frozen=True)
class KindCost:
    """One unit kind on one device: its rate and what it was taken from."""

    flops_per_s: float  # sum of 2 * ops / sum of latency over the rows
    rows: int
    mean_latency_ns: float
    median_latency_ns: float
    median_unit_flops: float  # 2 * ops of one profiled unit (median): the size of what was timed

    def to_json(self) -> dict[str, Any]:
        return {
            "flops_per_s": self.flops_per_s,
            "rows": self.rows,
            "mean_latency_ns": self.mean_latency_ns,
            "median_latency_ns": self.median_latency_ns,
            "median_unit_flops": self.median_unit_flops,
        }


@dataclass(frozen=True)
class ProfileCosts:
    """The costs a profile run measured: per device (its host name there), per unit kind."""

    path: str  # the run directory, absolute
    run_id: str
    model: Mapping[str, Any] | None  # metadata.json's model of the profile run ({name, params})
    devices: Mapping[str, Mapping[str, KindCost]]

    def rates(self, device: str) -> tuple[float, float, float]:
        """(head, proj, ffn) FLOP/s of ``device``: headsplit.placement.WorkerSpec.unit_flops_per_s."""
        kinds = self.devices[device]
        return (kinds["head"].flops_per_s, kinds["proj"].flops_per_s, kinds["ffn"].flops_per_s)

    def source(self) -> dict[str, Any]:
        return {"path": self.path, "run_id": self.run_id, "model": self.model, "file": HEADS_CSV}


def _int(file: Path, line: int, row: Mapping[str, str], column: str) -> int:
    try:
        return int(row[column])
    except (TypeError, ValueError):
        raise ProfileError(f"{file}:{line}: {column} {row[column]!r} is not an integer") from None


def _run_identity(run_dir: Path) -> tuple[str, Mapping[str, Any] | None]:
    """The run id and model of the profile run from its ``metadata.json`` (``<runs subdirectory>-<name>``
    and no model when it has none: the id ``dit run`` gives, RunDir.run_id)."""
    run_id, model = f"{run_dir.parent.name}-{run_dir.name}", None
    try:
        meta = json.loads((run_dir / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return run_id, model
    if isinstance(meta, dict):
        if isinstance(meta.get("run_id"), str):
            run_id = meta["run_id"]
        found = meta.get("model")
        spec = found.get("spec") if isinstance(found, dict) else None  # metadata.json: model.spec
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            model = {k: spec[k] for k in ("name", "params") if k in spec}
    return run_id, model


def read_profile(run_dir: str | Path) -> ProfileCosts:
    """The per-device, per-kind rates of the profile run in ``run_dir`` (the rule in the module's
    docstring). Raises :class:`ProfileError` naming the file, and the line or device, when the
    directory is not a profile run, a row is malformed, or a device lacks decode rows of a kind."""
    root = Path(run_dir).expanduser().resolve()
    if not root.is_dir():
        raise ProfileError(f"{root}: not a directory (give the run directory of a profile run)")
    file = root / HEADS_CSV
    if not file.is_file():
        raise ProfileError(
            f"{file}: missing; a profile run is a run of the layers runtime with runtime.tokens on a "
            "decoder model (its per-head, projection and FFN times per device)"
        )
    samples: dict[str, dict[str, list[tuple[int, int]]]] = {}
    hosts: list[str] = []
    try:
        with file.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ProfileError(f"{file}: missing column(s) {', '.join(missing)}")
            for line, row in enumerate(reader, start=2):
                host = row["host"]
                if not host:
                    raise ProfileError(f"{file}:{line}: host is empty")
                if host not in samples:
                    samples[host] = {kind: [] for kind in KINDS.values()}
                    hosts.append(host)
                kind = KINDS.get(row["unit"])
                if kind is None or _int(file, line, row, "token") <= 0:
                    continue
                latency, ops = _int(file, line, row, "latency_ns"), _int(file, line, row, "ops")
                if latency <= 0 or ops <= 0:
                    raise ProfileError(
                        f"{file}:{line}: latency_ns {latency} and ops {ops} of a {row['unit']} must be > 0"
                    )
                samples[host][kind].append((latency, ops))
    except OSError as exc:
        raise ProfileError(f"{file}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not hosts:
        raise ProfileError(f"{file}: no rows (the profile run generated no tokens)")
    devices: dict[str, dict[str, KindCost]] = {}
    for host in hosts:
        kinds: dict[str, KindCost] = {}
        for unit, kind in KINDS.items():
            rows = samples[host][kind]
            if not rows:
                raise ProfileError(f"{file}: {host} has no decode rows (token > 0) of unit {unit}")
            total_ns = sum(ns for ns, _ in rows)
            kinds[kind] = KindCost(
                flops_per_s=FLOPS_PER_OP * sum(ops for _, ops in rows) / (total_ns * 1e-9),
                rows=len(rows),
                mean_latency_ns=total_ns / len(rows),
                median_latency_ns=float(statistics.median(ns for ns, _ in rows)),
                median_unit_flops=float(statistics.median(FLOPS_PER_OP * ops for _, ops in rows)),
            )
        devices[host] = kinds
    run_id, model = _run_identity(root)
    return ProfileCosts(str(root), run_id, model, devices)


def device_problem(profile: ProfileCosts, workers: Sequence[str]) -> str | None:
    """What is wrong with using ``profile`` for a run whose workers run on ``workers`` (devices), or
    None: it must profile every worker's device and no other device."""
    others = [d for d in profile.devices if d not in workers]
    if others:
        return (
            f"{profile.path} profiles {', '.join(others)}, not a worker of this run "
            f"(workers: {', '.join(workers)}); profile the run's workers"
        )
    absent = [w for w in workers if w not in profile.devices]
    if absent:
        return (
            f"{profile.path} has no profile of {', '.join(absent)} (profiled: {', '.join(profile.devices)})"
        )
    return None


def costs_document(profile: ProfileCosts, workers: Sequence[str]) -> dict[str, Any]:
    """The file shipped to the controller: the source, the rule and the rates of the workers' devices
    (in worker order). Raises :class:`ProfileError` when :func:`device_problem` finds one."""
    problem = device_problem(profile, workers)
    if problem is not None:
        raise ProfileError(problem)
    return {
        "format": FORMAT,
        "source": profile.source(),
        "rule": RULE,
        "devices": {d: {k: c.to_json() for k, c in profile.devices[d].items()} for d in workers},
    }


def _number(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ProfileError(f"{where}: expected a number > 0, got {value!r}")
    return float(value)


def costs_from_document(doc: Any, where: str = "placement_profile") -> ProfileCosts:
    """Read :func:`costs_document`'s form back, every field checked (errors start with ``where``)."""
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        raise ProfileError(f"{where}: not a placement costs document ({FORMAT})")
    source, devices = doc.get("source"), doc.get("devices")
    if not isinstance(source, Mapping) or not isinstance(source.get("path"), str):
        raise ProfileError(f"{where}.source.path: missing")
    if not isinstance(source.get("run_id"), str):
        raise ProfileError(f"{where}.source.run_id: missing")
    model = source.get("model")
    if model is not None and not isinstance(model, Mapping):
        raise ProfileError(f"{where}.source.model: expected null or a mapping")
    if not isinstance(devices, Mapping) or not devices:
        raise ProfileError(f"{where}.devices: expected a mapping of device -> unit kind -> costs")
    parsed: dict[str, dict[str, KindCost]] = {}
    for device, kinds in devices.items():
        if not isinstance(kinds, Mapping):
            raise ProfileError(f"{where}.devices.{device}: expected a mapping of unit kind -> costs")
        parsed[str(device)] = {}
        for kind in KINDS.values():
            cost = kinds.get(kind)
            at = f"{where}.devices.{device}.{kind}"
            if not isinstance(cost, Mapping):
                raise ProfileError(f"{at}: missing")
            rows = cost.get("rows")
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
                raise ProfileError(f"{at}.rows: expected an integer >= 1, got {rows!r}")
            parsed[str(device)][kind] = KindCost(
                _number(cost.get("flops_per_s"), f"{at}.flops_per_s"),
                rows,
                _number(cost.get("mean_latency_ns"), f"{at}.mean_latency_ns"),
                _number(cost.get("median_latency_ns"), f"{at}.median_latency_ns"),
                _number(cost.get("median_unit_flops"), f"{at}.median_unit_flops"),
            )
    return ProfileCosts(str(source["path"]), str(source["run_id"]), model, parsed)
