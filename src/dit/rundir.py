"""The run directory: ``runs/<scenario name>/<UTC time>-<hash8>-<random8>/`` and its files."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STATUS = "status.json"
DRIVER = "driver.json"
STOP = "STOP"
RANDOM_BYTES = 4  # 32 random bits in every run id
# The states a run ends in; "degraded": every stage completed but a device process failed (status.json
# "degraded" lists them). Every state but "completed" makes `dit run` exit 1.
FINISHED_STATES = ("completed", "degraded", "failed", "stopped")


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (rename over the old file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file's content, or ``{}`` when it is missing, unreadable or not an object (a
    report shows what a run has, a failed run's files may be absent)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def runs_under(root: Path) -> list[Path]:
    """The run directories (with ``status.json``) directly under ``root``, else one level deeper (a
    runs directory holds ``<scenario>/<run>``), sorted; SystemExit naming ``root`` when there is none."""
    found = sorted(p.parent for p in root.glob(f"*/{STATUS}")) or sorted(
        p.parent for p in root.glob(f"*/*/{STATUS}")
    )
    if not found:
        raise SystemExit(f"no run directories under {root}")
    return found


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        # Absolute, always: ansible-runner runs each stage from its own project directory, so a
        # relative run directory (the default `runs/`) would point the stages at nothing.
        object.__setattr__(self, "path", Path(self.path).resolve())

    @classmethod
    def create(cls, runs_root: Path, name: str, scenario_hash: str) -> RunDir:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        parent = runs_root / name
        parent.mkdir(parents=True, exist_ok=True)
        # The run id (scenario name + this directory's name) tags every process, cgroup and node
        # directory of the run, and nodes are shared: two runs of one scenario started in the same
        # second from different runs directories must still differ, hence the random part.
        base = f"{stamp}-{scenario_hash[:8]}-{secrets.token_hex(RANDOM_BYTES)}"
        for attempt in range(1, 1000):
            candidate = parent / (base if attempt == 1 else f"{base}-{attempt}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            for sub in ("raw", "aggregate", "ansible", "optimise"):
                (candidate / sub).mkdir()
            return cls(candidate)
        raise RuntimeError(f"cannot create a run directory under {parent}")

    @property
    def run_id(self) -> str:
        """The tag every process of the run carries (``DIT_RUN_ID``)."""
        return f"{self.path.parent.name}-{self.path.name}"

    @property
    def journal(self) -> Path:
        return self.path / "journal.jsonl"

    @property
    def log(self) -> Path:
        return self.path / "run.log"

    def status(self) -> dict[str, Any]:
        path = self.path / STATUS
        return dict(read_json(path)) if path.exists() else {}

    def set_status(self, **fields: Any) -> None:
        try:
            status = self.status()
        except (OSError, ValueError, TypeError):  # a torn or hand-edited file: kept aside, written anew
            broken = self.path / STATUS
            broken.replace(broken.with_name(STATUS + ".unreadable"))
            status = {}
        if not isinstance(status, dict):
            status = {}
        status.update(fields)
        status["updated_wall_ns"] = time.time_ns()
        write_json(self.path / STATUS, status)

    def stop_requested(self) -> bool:
        return (self.path / STOP).exists()


def find_runs(runs_root: Path) -> list[RunDir]:
    if not runs_root.is_dir():
        return []
    found = [RunDir(p.parent) for p in runs_root.glob(f"*/*/{STATUS}")]
    return sorted(found, key=lambda r: r.path.name)
