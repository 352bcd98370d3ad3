"""Wall time of the Ansible stages in local mode with five devices and the edge server.

DESIGN.md's target: apply + teardown <= 4 s. Prints the figures of each repetition and the median.

    .venv/bin/python benchmarks/bench_stages.py [--repetitions 3] [--devices 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dit.ansible_exec import HostEvent, run_stage
from dit.device.build import build_zipapp
from dit.driver import teardown
from dit.inventory import local_inventory
from dit.rundir import RunDir


def one(devices: tuple[str, ...]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="dit-bench-") as tmp:
        run = RunDir.create(Path(tmp), "bench", "0" * 64)
        inv = local_inventory(run.path, devices)
        pyz = build_zipapp(run.path / "device", extra_packages=["dit/models"])
        model: dict[str, Any] = {
            "name": "fake",
            "builder": "dit.device.fakemodel:build",
            "params": {"profile": "tiny"},
        }
        common = {"dit_run_id": run.run_id, "dit_journal_path": str(run.journal)}
        events: list[HostEvent] = []
        times: dict[str, float] = {}
        for stage, extra in (
            ("preflight", {}),
            (
                "apply",
                {
                    "dit_device_pyz": str(pyz),
                    "dit_edge_config": {
                        "run_id": run.run_id,
                        "policy": "SJF",
                        "admission": "batch",
                        "devices": list(devices),
                        "model": model,
                        "profile": None,
                    },
                    "dit_conditions": {},
                },
            ),
        ):
            start = time.monotonic()
            outcome = run_stage(
                stage,
                run.path / "ansible" / stage,
                inv.source,
                inv.limit,
                {**common, **extra},
                events.append,
                lambda: False,
                forks=len(inv.hosts),
            )
            times[stage] = time.monotonic() - start
            assert outcome.ok, outcome.failures()
        start = time.monotonic()
        error, _ns = teardown(run, inv, None)
        times["teardown"] = time.monotonic() - start
        assert error is None, error
        return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--devices", type=int, default=5)
    args = parser.parse_args()
    devices = tuple(f"device{i}" for i in range(1, args.devices + 1))
    rows = []
    for rep in range(args.repetitions):
        times = one(devices)
        rows.append(times)
        print(
            f"rep {rep}: preflight {times['preflight']:.2f} s  apply {times['apply']:.2f} s  "
            f"teardown {times['teardown']:.2f} s  apply+teardown {times['apply'] + times['teardown']:.2f} s"
        )
    total = statistics.median(r["apply"] + r["teardown"] for r in rows)
    print(f"median apply+teardown with {args.devices} devices + edge: {total:.2f} s (target <= 4 s)")


if __name__ == "__main__":
    main()
