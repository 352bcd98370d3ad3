"""What a run records about where it came from: ``metadata.json``'s versions, commit and settings.

Written once at preflight (the nodes' facts are known then, nothing is applied yet) and added to later
(:func:`add_metadata`: how each host waited for the start instant).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dit
from dit.conditions import ProcessSettings
from dit.paths import content_root
from dit.run.procs import process_identity
from dit.run.rundir import DRIVER, RunDir, write_json, write_text
from dit.scenario import Scenario

FRAMEWORKS = ("tensorflow", "tensorflow-cpu", "torch", "transformers", "numpy", "pandas")


def versions() -> dict[str, str | None]:
    """The controller's Python, dit, Ansible and framework versions (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version(), "dit": dit.__version__}
    for dist in ("ansible-core", "ansible-runner", *FRAMEWORKS):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def git_commit() -> dict[str, Any]:
    """The commit of the content the run used, and whether the checkout had uncommitted changes."""
    root = content_root()
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        if head.returncode != 0:
            return {"commit": None, "source": "not a git checkout"}
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": None, "source": str(exc)}


def run_metadata(
    run_id: str,
    scenario: Scenario,
    *,
    local: bool,
    inventory: str,
    model: Mapping[str, Any] | None,
    runtime: Mapping[str, Any],
    conditions: Mapping[str, Any],
    processes: Mapping[str, ProcessSettings],
    nodes: Mapping[str, Any],
) -> dict[str, Any]:
    """The document of ``metadata.json`` (docs/raw-results.md)."""
    return {
        "run_id": run_id,
        "scenario": {
            "name": scenario.name,
            "label": scenario.label,
            "hash": scenario.hash,
            "sweep_point": scenario.sweep_point_json(),
            "document": scenario.to_dict(),
        },
        "mode": "local" if local else "inventory",
        "inventory": inventory,
        "model": None if model is None else dict(model),  # None: the runtime brings its own model
        "runtime": dict(runtime),
        "conditions": dict(conditions),
        "processes": {
            host: {"env": settings.env, "cgroup": list(settings.cgroups) or None, "cpus": settings.cpus}
            for host, settings in processes.items()
        },
        "dit": {"version": dit.__version__, "git": git_commit()},
        "versions": versions(),
        "controller": {"hostname": platform.node(), "kernel": platform.release(), "python": sys.version},
        "nodes": dict(nodes),
        "written_wall_ns": time.time_ns(),
    }


def add_metadata(path: Path, **fields: Any) -> None:
    """Add fields to ``metadata.json`` (written at preflight) after the fact; nothing when it is unreadable."""
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(metadata, dict):
        write_json(path, {**metadata, **fields})


def write_run_files(run: RunDir, scenario: Scenario, inventory: str | None, local: bool) -> None:
    """``scenario.yaml`` and ``driver.json`` (who runs it: what ``dit stop`` signals) of a new run.

    Nothing has started yet: a run directory that cannot be written fails here (RunDirError, one line
    naming the file), before any node is touched.
    """
    write_text(run.path / "scenario.yaml", scenario.to_yaml())
    write_json(
        run.path / DRIVER,
        {
            "pid": os.getpid(),
            "host": platform.node(),
            "run_id": run.run_id,
            "inventory": inventory,
            "local": local,
            "scenario_hash": scenario.hash,
            **process_identity(os.getpid()),  # so that `dit stop` never signals a reused pid
        },
    )
