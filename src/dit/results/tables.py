"""The tables of :mod:`dit.results`: one run's files read as frames, and :class:`Results` over runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Final, Literal, cast

import pandas as pd

from dit.analysis.inputs import read_csv
from dit.analysis.monitors import ENERGY_COLUMNS, MONITOR_COLUMNS
from dit.analysis.phases import PHASE_COLUMNS
from dit.analysis.run import AggregateError, LoadedRun, raw_file
from dit.models.decoder_profile import TOKEN_COLUMNS
from dit.report import labels
from dit.results.spread import Spread, spread
from dit.run.rundir import RunDir, expand_runs, read_json, read_json_object
from dit.scenario.spec import content_hash

RUN_COLUMNS: Final = ("run_id", "run_dir", "scenario_hash")
"""The run's identity, the first columns of every table."""
TABLES: Final = ("phases", "layers", "tokens", "monitors", "energy", "netem", "summary")
FORMATS: Final = ("csv", "parquet")
HS_TOKENS: Final = "hs_tokens.csv"  # HeadSplit's per-token table (runtimes/headsplit)


# --------------------------------------------------------------------------- one run's tables


def _read(path: Path, columns: Sequence[str]) -> pd.DataFrame | None:
    """The file as a frame (None when the run has none); an unreadable one names itself."""
    if not path.is_file():
        return None
    try:
        return read_csv(path, columns)
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # pandas' parser errors are ValueErrors
        raise AggregateError(f"{path}: not a readable CSV ({exc})") from None


def read_phases(run_dir: Path) -> pd.DataFrame | None:
    """``aggregate/phases.csv``: one row per inference request."""
    return _read(run_dir / "aggregate" / "phases.csv", ("host", "round", "partition_point", *PHASE_COLUMNS))


def read_layers(run_dir: Path) -> pd.DataFrame | None:
    """``aggregate/layers.csv``: the layer profile, one row per (host, stage)."""
    return _read(run_dir / "aggregate" / "layers.csv", ("host", "stage", "latency_ns"))


def read_tokens(run_dir: Path) -> pd.DataFrame | None:
    """Every generated token's latency: each host's raw ``tokens.csv`` (every repetition), then
    HeadSplit's ``aggregate/hs_tokens.csv`` (its ``total_ns`` as ``latency_ns``)."""
    frames: list[pd.DataFrame] = []
    raw = run_dir / "raw"
    for host in sorted(p.name for p in raw.iterdir() if p.is_dir()) if raw.is_dir() else []:
        frame = _read(raw_file(run_dir, host, "tokens.csv"), TOKEN_COLUMNS)
        if frame is not None:
            frames.append(frame.assign(host=host, source="tokens.csv"))
    hs = _read(run_dir / "aggregate" / HS_TOKENS, ("token", "total_ns"))
    if hs is not None:
        frames.append(hs.assign(latency_ns=hs["total_ns"], source=HS_TOKENS))
    if not frames:
        return None
    out = pd.concat(frames, ignore_index=True)
    first = [c for c in ("host", "rep", "token", "latency_ns") if c in out.columns]
    return out[[*first, *(c for c in out.columns if c not in first)]]


def read_monitors(run_dir: Path) -> pd.DataFrame | None:
    """``aggregate/monitors.csv``: long, one row per (node, time, metric)."""
    return _read(run_dir / "aggregate" / "monitors.csv", MONITOR_COLUMNS)


def read_energy(run_dir: Path) -> pd.DataFrame | None:
    """``aggregate/energy.csv`` with ``modelled``: true on the rows of a node whose sensor is fake."""
    agg = run_dir / "aggregate"
    frame = _read(agg / "energy.csv", ENERGY_COLUMNS[:1])
    if frame is None:
        return None
    fake = labels.fake_power_nodes(agg)
    return frame.assign(modelled=frame["device"].astype(str).isin(fake))


def read_netem(run_dir: Path) -> pd.DataFrame | None:
    """``aggregate/netem_check.csv``: every shaped link, intended against measured."""
    return _read(run_dir / "aggregate" / "netem_check.csv", ("device", "target"))


def read_summary(run_dir: Path) -> pd.DataFrame | None:
    """The runtime's ``aggregate/summary.json`` values, one row each; ``modelled`` true for a power,
    energy or EDP figure a fake sensor gave (:func:`dit.report.labels.modelled_tag`)."""
    agg = run_dir / "aggregate"
    path = agg / "summary.json"
    if not path.is_file():
        return None
    try:
        doc = read_json(path)
    except (OSError, ValueError) as exc:  # RunDirError names the file; invalid JSON is a ValueError
        raise AggregateError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise AggregateError(f"{path}: not a JSON object")
    fake = labels.fake_power_nodes(agg)
    rows = [
        {
            "runtime": str(doc.get("runtime", "")),
            "metric": str(v["name"]),
            "value": v.get("value"),
            "unit": str(v.get("unit", "")),
            "description": str(v.get("description", "")),
            "modelled": bool(labels.modelled_tag(str(v.get("unit", "")), fake)),
        }
        for v in doc.get("values") or []
        if isinstance(v, Mapping) and "name" in v
    ]
    return pd.DataFrame(rows, columns=["runtime", "metric", "value", "unit", "description", "modelled"])


READERS: Final[Mapping[str, Callable[[Path], pd.DataFrame | None]]] = {
    "phases": read_phases,
    "layers": read_layers,
    "tokens": read_tokens,
    "monitors": read_monitors,
    "energy": read_energy,
    "netem": read_netem,
    "summary": read_summary,
}


# --------------------------------------------------------------------------- spreads the screens show


def phase_total_spreads(run_dir: Path) -> dict[tuple[str, int, int], Spread]:
    """The spread of ``total_ns`` per (host, round, partition point): one entry per row of
    ``aggregate/phases_summary.csv`` (empty without ``phases.csv``)."""
    frame = read_phases(run_dir)
    if frame is None or frame.empty:
        return {}
    grouped = frame.groupby(["host", "round", "partition_point"], sort=False)["total_ns"]
    out: dict[tuple[str, int, int], Spread] = {}
    for key, rows in grouped:
        host, round_, point = cast("tuple[Any, Any, Any]", key)
        out[(str(host), int(round_), int(point))] = spread(rows)
    return out


def decode_tokens(run_dir: Path) -> pd.DataFrame | None:
    """:func:`read_tokens` without token 0, the prompt's prefill: the rows a token latency's spread is
    over (a prefill processes the whole prompt, another operation; HeadSplit's ``token_latency_mean``
    leaves it out too)."""
    frame = read_tokens(run_dir)
    return None if frame is None else frame[pd.to_numeric(frame["token"], errors="coerce") > 0]


def token_spreads(run_dir: Path) -> dict[str, Spread]:
    """The spread of the decode tokens' latency per host (:func:`decode_tokens`: every repetition, the
    prefill left out); HeadSplit's tokens under ``headsplit``."""
    frame = decode_tokens(run_dir)
    if frame is None or frame.empty:
        return {}
    hosts = (
        frame["host"].fillna("headsplit") if "host" in frame else pd.Series("headsplit", index=frame.index)
    )
    return {str(h): spread(rows) for h, rows in frame.groupby(hosts, sort=False)["latency_ns"]}


# --------------------------------------------------------------------------- many runs


def flatten_scenario(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a scenario document by its dotted path; a list, or an empty mapping, is one leaf."""
    if isinstance(doc, Mapping) and doc:
        out: dict[str, Any] = {}
        for key in sorted(doc, key=str):
            out.update(flatten_scenario(doc[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: doc} if prefix else {}


def _cell(value: Any) -> Any:
    """A scenario value as a table cell: scalars as they are, lists and mappings as JSON text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, tuple, Mapping)) else value


class Results:
    """The tables of some runs; each is read on first use and kept (``res.phases``, ``res.tables()``)."""

    def __init__(
        self, run_dirs: Sequence[Path], scenario_columns: Literal["varying", "all"] = "varying"
    ) -> None:
        if scenario_columns not in ("varying", "all"):
            raise ValueError(f"scenario_columns: {scenario_columns!r} is neither 'varying' nor 'all'")
        self.run_dirs = [Path(p) for p in run_dirs]
        self.scenario_columns = scenario_columns

    def __repr__(self) -> str:
        return f"Results({len(self.run_dirs)} runs)"

    @cached_property
    def _scenarios(self) -> list[dict[str, Any]]:
        return [LoadedRun(path).scenario for path in self.run_dirs]

    @cached_property
    def runs(self) -> pd.DataFrame:
        """One row per run: its identity, ``label`` and ``state`` (status.json) and every scenario value."""
        rows = []
        for path, scenario in zip(self.run_dirs, self._scenarios, strict=True):
            status = read_json_object(path / "status.json")
            rows.append({
                **self._identity(path, scenario),
                "label": status.get("label"), "state": status.get("state"),
                **{k: _cell(v) for k, v in flatten_scenario(scenario).items()},
            })  # fmt: skip
        return pd.DataFrame(rows)

    @cached_property
    def varying(self) -> list[str]:
        """The scenario paths whose values are not the same in every run, sorted."""
        leaves = [flatten_scenario(s) for s in self._scenarios]
        paths = sorted(set().union(*leaves)) if leaves else []
        return [p for p in paths if len({json.dumps(leaf.get(p), sort_keys=True) for leaf in leaves}) > 1]

    @staticmethod
    def _identity(path: Path, scenario: Mapping[str, Any]) -> dict[str, Any]:
        return {"run_id": RunDir(path).run_id, "run_dir": str(path), "scenario_hash": content_hash(scenario)}

    def table(self, name: str) -> pd.DataFrame:
        """Table ``name`` (one of :data:`TABLES`) of every run, with the run and scenario columns."""
        if name not in READERS:
            raise KeyError(f"table {name!r}: one of {', '.join(TABLES)}")
        frames = []
        for path, scenario in zip(self.run_dirs, self._scenarios, strict=True):
            frame = READERS[name](path)
            if frame is None:
                continue
            leaves = flatten_scenario(scenario)
            chosen = leaves if self.scenario_columns == "all" else {p: leaves.get(p) for p in self.varying}
            extra = {**self._identity(path, scenario)}
            for key, value in chosen.items():
                extra[f"scenario.{key}" if key in frame.columns else key] = _cell(value)
            head = pd.DataFrame({k: [v] * len(frame) for k, v in extra.items()}, index=frame.index)
            frames.append(pd.concat([head, frame], axis=1))
        if not frames:
            return pd.DataFrame(columns=list(RUN_COLUMNS))
        return pd.concat(frames, ignore_index=True)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by name, in the order of :data:`TABLES`."""
        return {name: self.table(name) for name in TABLES}

    @cached_property
    def phases(self) -> pd.DataFrame:
        return self.table("phases")

    @cached_property
    def layers(self) -> pd.DataFrame:
        return self.table("layers")

    @cached_property
    def tokens(self) -> pd.DataFrame:
        return self.table("tokens")

    @cached_property
    def monitors(self) -> pd.DataFrame:
        return self.table("monitors")

    @cached_property
    def energy(self) -> pd.DataFrame:
        return self.table("energy")

    @cached_property
    def netem(self) -> pd.DataFrame:
        return self.table("netem")

    @cached_property
    def summary(self) -> pd.DataFrame:
        return self.table("summary")


def load(paths: Iterable[Path | str], scenario_columns: Literal["varying", "all"] = "varying") -> Results:
    """The runs ``paths`` name: run directories, directories of runs (a sweep) or both
    (:func:`dit.run.rundir.expand_runs`); :class:`dit.run.rundir.NoRunsError` for a path that is neither."""
    return Results(expand_runs(Path(p) for p in paths), scenario_columns)


def parquet_missing() -> str | None:
    """Why Parquet cannot be written here (one line saying what to install), or None when it can."""
    import importlib.util

    if any(importlib.util.find_spec(engine) for engine in ("pyarrow", "fastparquet")):  # pandas' engines
        return None
    return "--format parquet needs pyarrow: pip install pyarrow (or use --format csv)"


def export(res: Results, out_dir: Path, fmt: str = "csv") -> list[Path]:
    """Write every table of ``res`` to ``out_dir/<table>.<fmt>`` (``csv`` or ``parquet``), also an empty
    one (its header), and ``runs.<fmt>``; the files written, in order. ``ValueError`` for another format
    or Parquet without pyarrow."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    if fmt == "parquet" and (missing := parquet_missing()):
        raise ValueError(missing)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in {"runs": res.runs, **res.tables()}.items():
        target = out_dir / f"{name}.{fmt}"
        if fmt == "csv":
            frame.to_csv(target, index=False)
        else:
            frame.to_parquet(target, index=False)
        written.append(target)
    return written
