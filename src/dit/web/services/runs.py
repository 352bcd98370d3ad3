"""Runs as NNPM sees them: started with the CLI's own driver, stopped with ``dit stop``, read from disk.

- **Start**: a saved version is written to ``<runs>/.nnpm/scenarios/<hash>.yaml`` and run as
  ``python -m dit run FILE --runs-dir RUNS [-i INVENTORY]`` in its own session (so the run lives in
  its own process, survives a restart of the server, and the server stays responsive). The driver
  writes ``driver.json`` with its pid; NNPM finds the run directories of its launch by that pid and
  writes ``nnpm.json`` (version hash, launch id, kind, mode) into each.
- **Stop**: ``python -m dit stop RUN_DIR``, exactly what the CLI does (``STOP`` file + SIGTERM; the
  driver tears down fully).
- **Read**: ``status.json``, ``driver.json``, ``nnpm.json``, ``metadata.json``, the aggregate CSVs.
  A run started from the CLI is traced to its version through the variant hashes in the store.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit import units
from dit.device.tags import RUN_ENV
from dit.report import labels
from dit.run.collect import edge_channel_warning
from dit.run.procs import pid_alive
from dit.run.rundir import (
    DRIVER,
    FINISHED_STATES,
    STATUS,
    RunDir,
    find_runs,
    read_json,
    write_json,
    write_text,
)
from dit.run.sweep import progress_of
from dit.trusted import UntrustedPath, trusted_dir
from dit.web.services import runpage
from dit.web.services.store import Store, Version

NNPM_FILE = "nnpm.json"
# \Z, not $: `$` also matches before a final newline, and "name\n" is no directory dit made
SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
STATES_DONE = FINISHED_STATES


class RunNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Launch:
    id: str
    version: str
    kind: str
    mode: str
    pid: int
    log: Path
    argv: list[str]


def run_key(run: RunDir, runs_root: Path) -> str:
    """``<scenario>/<directory>``: how the API names a run."""
    return str(run.path.relative_to(runs_root.resolve()))


def run_dir_of(runs_root: Path, scenario: str, name: str) -> RunDir:
    if not (SEGMENT.match(scenario) and SEGMENT.match(name)):
        raise RunNotFound(f"{scenario}/{name}")
    path = runs_root / scenario / name
    if not (path / STATUS).is_file() and not (path / DRIVER).is_file():
        raise RunNotFound(f"{scenario}/{name}")
    return RunDir(path)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return {}
    return dict(data) if isinstance(data, dict) else {}


def run_summary(run: RunDir, runs_root: Path, store: Store) -> dict[str, Any]:
    status = run.status() if (run.path / STATUS).exists() else {}
    driver = _read(run.path / DRIVER)
    nnpm = _read(run.path / NNPM_FILE)
    pid = int(driver.get("pid") or 0)
    state = str(status.get("state") or "starting")
    alive = bool(pid) and pid_alive(pid)
    if state == "running" and not alive and pid and driver.get("host") == os.uname().nodename:
        state = "dead"  # the driver died without finishing: `dit cleanup` undoes it
    started = status.get("started_wall_ns")
    finished = status.get("finished_wall_ns")
    end = finished if finished else (time.time_ns() if state == "running" else status.get("updated_wall_ns"))
    variant = driver.get("scenario_hash")
    version = nnpm.get("version") or (store.version_of_variant(str(variant)) if variant else None)
    return {
        "key": run_key(run, runs_root),
        "run_id": run.run_id,
        "scenario": run.path.parent.name,
        "label": status.get("label", run.path.parent.name),
        "state": state,
        "stage": status.get("stage"),
        "error": status.get("error"),
        "degraded": status.get("degraded") or [],  # device processes that failed (state "degraded")
        "started_wall_ns": started,
        "finished_wall_ns": finished,
        "duration_s": round((int(end) - int(started)) / 1e9, 3) if started and end else None,
        "version": version,
        "variant_hash": variant,
        "kind": nnpm.get("kind"),
        "mode": nnpm.get("mode") or ("local" if driver.get("local", True) else "inventory"),
        "launch": nnpm.get("launch"),
        "driver_pid": pid or None,
        "driver_alive": alive,
        "note": run.note(),  # the researcher's note (note.md), shown in the list and on the run page
        "sweep": progress_of(run.path),  # a variant of a sweep run as one unit: its place and the ETA
    }


def list_runs(runs_root: Path, store: Store) -> list[dict[str, Any]]:
    rows = [run_summary(run, runs_root, store) for run in find_runs(runs_root)]
    rows.sort(key=lambda r: r.get("started_wall_ns") or 0, reverse=True)
    return rows


def archive_file(run_dir: Path, top: str, scratch: Path) -> Path:
    """``run_dir`` as a gzip'd tar under the top directory ``top`` (links stored as links), written to a
    new file in ``scratch`` (the caller removes it once sent; a failure leaves none behind)."""
    scratch.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f"{top}-", suffix=".tar.gz", dir=scratch)
    os.close(handle)
    try:
        with tarfile.open(name, mode="w:gz") as tar:
            tar.add(run_dir, arcname=top, recursive=True)  # tarfile never dereferences unless asked
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def nnpm_dir(runs_root: Path) -> Path:
    return runs_root / ".nnpm"


def version_file(version: Version, runs_root: Path) -> Path:
    """``<runs>/.nnpm/scenarios/<hash>.yaml``: the saved version as a file ``dit run`` can read."""
    folder = nnpm_dir(runs_root) / "scenarios"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{version.hash}.yaml"
    if not path.exists():
        write_text(path, version.yaml(), what="NNPM's directory")  # the driver runs what it says, as root
    return path


def launch(
    version: Version,
    kind: str,
    mode: str,
    runs_root: Path,
    inventory: Path | None,
    store: Store,
    python: str = sys.executable,
) -> Launch:
    """Start ``dit run`` on ``version`` in its own session; recorded in the store."""
    base = nnpm_dir(runs_root)
    (base / "launches").mkdir(parents=True, exist_ok=True)
    scenario_file = version_file(version, runs_root)
    argv = [python, "-m", "dit", "run", str(scenario_file), "--runs-dir", str(runs_root)]
    if mode == "inventory":
        if inventory is None:
            raise ValueError("no inventory: start dit web with --inventory to run on the nodes")
        argv += ["-i", str(inventory)]
    launch_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
    log = base / "launches" / f"{launch_id}.log"
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop(RUN_ENV, None)
    env["DIT_NNPM_LAUNCH"] = launch_id
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=str(Path.cwd()),
        )
    record = Launch(launch_id, version.hash, kind, mode, proc.pid, log, argv)
    store.add_launch(launch_id, version.hash, kind, mode, proc.pid, argv, str(log))
    _CHILDREN[proc.pid] = proc
    return record


# Popen objects of launched runs, so their exit status is collected (no zombies) while the server lives.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def alive_launches() -> list[int]:
    """The pids of this server's launched drivers still running (their exit status collected)."""
    reap_children()
    return list(_CHILDREN)


def reap_children() -> None:
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def tag_runs(runs_root: Path, store: Store) -> list[Path]:
    """Write ``nnpm.json`` into the run directories of NNPM's launches that do not have it yet."""
    launches = {int(row["pid"]): row for row in store.launches() if row.get("pid")}
    tagged: list[Path] = []
    if not launches:
        return tagged
    for run in find_runs(runs_root):
        marker = run.path / NNPM_FILE
        if marker.exists() or not trusted(run):
            continue
        driver = _read(run.path / DRIVER)
        row = launches.get(int(driver.get("pid") or 0))
        if row is None:
            continue
        if (run.path / DRIVER).stat().st_mtime_ns < int(row["created_ns"]) - 1_000_000_000:
            continue  # an older run whose driver had the same (since reused) pid
        write_json(
            marker,
            {
                "version": row["version_hash"],
                "launch": row["id"],
                "kind": row["kind"],
                "mode": row["mode"],
                "argv": row["argv"],
                "variant_hash": driver.get("scenario_hash"),
            },
        )
        tagged.append(run.path)
    return tagged


def trusted(run: RunDir) -> bool:
    """Whether ``run``'s directory is root's alone, it and every directory above it: NNPM writes into
    no other, and acts on no other's identity (:meth:`RunDir.check_trusted`)."""
    try:
        run.check_trusted()
    except (UntrustedPath, OSError):
        return False
    return True


def stop_run(run: RunDir, python: str = sys.executable) -> subprocess.Popen[bytes]:
    """``dit stop RUN_DIR`` in the background (it returns once the teardown has finished); its output
    goes to ``nnpm-stop.log`` in the run. :class:`UntrustedPath` for a run directory that is not root's
    alone (``dit stop`` refuses it too)."""
    argv = [python, "-m", "dit", "stop", str(run.path)]
    with trusted_dir(run.path, what="the run directory") as dir_fd:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        log = os.open("nnpm-stop.log", flags, 0o644, dir_fd=dir_fd)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    finally:
        os.close(log)
    _CHILDREN[proc.pid] = proc
    return proc


def run_detail(run: RunDir, runs_root: Path, store: Store) -> dict[str, Any]:
    summary = run_summary(run, runs_root, store)
    status = run.status() if (run.path / STATUS).exists() else {}
    metadata = _read(run.path / "metadata.json")
    agg = run.path / "aggregate"
    phases = runpage.phase_table(agg / "phases_summary.csv")
    settings = runpage.run_settings(read_scenario(run.path))
    optimise = (
        sorted(p.name for p in (run.path / "optimise").glob("*.json"))
        if (run.path / "optimise").is_dir()
        else []
    )
    return {
        **summary,
        "stage_ns": status.get("stage_ns", {}),
        # in run order, with units; a skipped stage (status.json's skipped) with its reason
        "stages": runpage.stage_rows(status.get("stage_ns") or {}, labels.skipped_stages(status)),
        "skipped": [
            {"stage": stage, "reason": why, "text": labels.skipped_text(stage, why)}
            for stage, why in labels.skipped_stages(status).items()
        ],
        "duration_text": units.duration(summary["duration_s"] * 1e9) if summary["duration_s"] else "",
        "model": runpage.model_view(metadata.get("model")),
        "settings": settings,  # the run's own optimisation settings and the policy it measured
        "inference_ran": bool(phases and phases["rows"]),
        "outcome_note": labels.run_outcome(status),  # a stopped, refused or failed run: what happened
        # a stopped run: what it kept (raw/'s files per node) and what of it is aggregated and shown
        "kept_note": labels.kept_text(run.path, status),
        "kept_files": labels.kept_files(run.path) if status.get("state") == "stopped" else {},
        "lateness_ns": status.get("lateness_ns", {}),
        "teardown": status.get("teardown"),
        # frames the edge service refused (its key did not verify them), or that it ran without one
        "edge_channel": edge_channel_warning(status.get("edge_channel")),
        "metadata": {
            "mode": metadata.get("mode"),
            "model": metadata.get("model"),
            "dit": metadata.get("dit"),
            "controller": metadata.get("controller"),
            "versions": metadata.get("versions"),
            "scenario": {k: v for k, v in (metadata.get("scenario") or {}).items() if k != "document"},
        },
        "devices": list((metadata.get("scenario") or {}).get("document", {}).get("devices", [])),
        "phases": phases,
        # which node's power is modelled (a fake sensor), said wherever power or energy is shown
        "power": {
            "sensors": labels.power_sensors(agg),
            "fake_note": labels.fake_sensor_note(labels.fake_power_nodes(agg)),
        },
        "summary": runtime_summary(agg),
        "token_spread": runpage.token_spread(run.path),  # per host: mean ± 95 % CI, p50 / p95 / p99
        "plots": {
            "layers": (agg / "layers.csv").is_file(),
            "monitors": (agg / "monitors.csv").is_file(),
            "validation": (agg / "validation.png").is_file(),
        },
        # each plot's inputs' version: the page asks for the PNG under it, so a reopened page is served
        # from the caches (NNPM's and the browser's) until the run's files change
        "plot_stamps": {
            "layers": runpage.stamp(agg / "layers.csv"),
            "monitors": runpage.stamp(agg / "monitors.csv", agg / "power_summary.csv"),
        },
        "optimise": optimise,
        "finished": summary["state"] in STATES_DONE,
        "aggregated": (agg / "layers.csv").is_file() and (agg / "links.csv").is_file(),
    }


def read_scenario(path: Path) -> dict[str, Any]:
    """The run's ``scenario.yaml`` (resolved by the driver); empty when missing or unreadable."""
    from dit.scenario import ScenarioError, load_yaml

    try:
        return load_yaml(path / "scenario.yaml")
    except (ScenarioError, OSError):
        return {}


def runtime_summary(aggregate: Path) -> dict[str, Any] | None:
    """The runtime's ``aggregate/summary.json`` (runtime, tables, named values with units), if written;
    each value ``modelled`` when a fake sensor gave it (the page says so beside it), with the note why."""
    doc = _read(aggregate / "summary.json")
    if not doc or not isinstance(doc.get("values"), list):
        return None
    fake = labels.fake_power_nodes(aggregate)
    values = [
        {
            **{k: v.get(k) for k in ("name", "value", "unit", "type", "description")},
            # written by dit.units, as dit show and the report write it (the page's own formatter said
            # 13.59 % where they said 13.6 %: issue 49, item 6)
            "text": units.with_unit(v.get("value"), str(v.get("unit") or "")),
            # the label the page shows beside the value ("" when measured or not a power figure)
            "modelled": labels.MODELLED if labels.modelled_tag(str(v.get("unit", "")), fake) else "",
        }
        for v in doc["values"]
        if isinstance(v, dict) and isinstance(v.get("name"), str)
    ]
    note = labels.fake_sensor_note(fake) if any(v["modelled"] for v in values) else ""
    return {"runtime": str(doc.get("runtime", "")), "values": values, "modelled_note": note}
