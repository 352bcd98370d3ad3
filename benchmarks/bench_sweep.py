"""Per-variant overhead of a sweep in local mode: what each variant after the first costs beyond its own
profile, with the sweep run as one unit on its nodes and with every variant a whole run of its own.

The sweep's variants differ only in a runtime parameter (``--vary repetitions``, the default: the
inference repetitions, 1 to N) or in the scenario's seed (``--vary seed``: the fake model's weights, and
the link emulator's loss draws, so with ``--delay-ms`` its link changes with every variant); with
``repetitions`` no condition changes between them: the overhead is orchestration. For N variants and for 1,

    overhead per variant = ((T(N) - T(1)) - (P(N) - P(1))) / (N - 1)

where T is the wall time of running them and P the sum of their profile stages (status.json). ``unit``
runs them as `dit run` of a sweep does (dit.run.sweep: one preflight, the difference applied, one
teardown); ``separate`` runs each variant through its own Driver, as `dit run` did before issue 48.
Each figure is printed with the load average (``/proc/loadavg``) as it was measured: on a shared
machine a figure means little without it. Issue 48's target, on the emulated rack: <= 6 s per variant.

    .venv/bin/python benchmarks/bench_sweep.py [--variants 5] [--devices 2] [--modes unit,separate]
    .venv/bin/python benchmarks/bench_sweep.py --inventory /var/lib/dit/rack/inventory.yml \
        --devices 4 --delay-ms 5 --modes unit       # on the emulated rack (`dit rack up`), issue 48's target
    .venv/bin/python benchmarks/bench_sweep.py --smoke     # 2 variants, 1 device, unit only: the same path
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console

from dit.run.driver import Driver, RunOptions
from dit.run.rundir import RunDir
from dit.run.sweep import driver_runner, run_sweep
from dit.scenario import Scenario, load

SWEPT = {"repetitions": "inference.repetitions", "seed": "seed"}


def variants(
    directory: Path, count: int, devices: int, delay_ms: float = 0.0, vary: str = "repetitions"
) -> list[Scenario]:
    doc: dict[str, object] = {
        "name": "bench_sweep",
        "model": {"name": "fake", "params": {"profile": "tiny"}},
        "devices": [f"device{i}" for i in range(1, devices + 1)],
        "repetitions": 1,
        "warmup": 0,
        "inference": {"enabled": True, "partition_points": [0], "repetitions": 1},
        "optimisation": {"enabled": False},
        "edge_server": {"profile_min_s": 0.2},
        "timing": {"start_lead_s": 1.0},
        "sweep": {"path": SWEPT[vary], "values": list(range(1, count + 1))},
    }
    if delay_ms:
        doc["network"] = {"device1": {"delay_ms": delay_ms}}
    path = directory / f"bench_sweep_{count}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return load(path)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])


def timed(
    mode: str, scenarios: list[Scenario], runs_root: Path, inventory: str | None = None
) -> tuple[float, float]:
    """(wall time, sum of the variants' profile stages) in seconds, running ``scenarios`` in ``mode``
    (on ``inventory``'s nodes, or in local mode)."""
    options = RunOptions(runs_root=runs_root, inventory=inventory, console=Console(file=io.StringIO()))
    start = time.monotonic()
    if mode == "unit":
        outcomes = run_sweep(
            scenarios, runs_root, Console(file=io.StringIO()), driver_runner(options), rerun=True
        )
        dirs = [o.run_dir for o in outcomes]
        states = [o.state for o in outcomes]
        errors = [o.error for o in outcomes]
    else:
        results = [Driver(s, options).execute() for s in scenarios]
        dirs = [r.run_dir for r in results]
        states = [r.state for r in results]
        errors = [r.error for r in results]
    wall = time.monotonic() - start
    if any(state != "completed" for state in states):
        raise SystemExit(f"bench_sweep: {mode}: variants ended {states}: {dirs}: {errors}")
    profile = sum(RunDir(d).status()["stage_ns"]["profile"] / 1e9 for d in dirs if d is not None)
    return wall, profile


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", type=int, default=5)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--modes", default="unit,separate", help="unit, separate or both (comma-separated)")
    parser.add_argument("--inventory", help="run on these nodes (e.g. the emulated rack's inventory.yml)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added delay on device1's link")
    parser.add_argument("--smoke", action="store_true", help="2 variants, 1 device, unit only (CI)")
    parser.add_argument(
        "--vary", choices=sorted(SWEPT), default="repetitions", help="what the variants differ in"
    )
    parser.add_argument("--keep", type=Path, help="keep the run directories under this directory")
    args = parser.parse_args()
    if args.smoke:
        args.variants, args.devices, args.modes = 2, 1, "unit"
    if args.variants < 2:
        parser.error("--variants: at least 2 (the overhead is per variant after the first)")
    os.environ.setdefault("DIT_LOCAL_LEASE_DIR", tempfile.mkdtemp(prefix="dit-bench-lease-"))
    for mode in args.modes.split(","):
        kept = args.keep / mode if args.keep is not None else None
        if kept is not None:
            kept.mkdir(parents=True, mode=0o700)
        place = (
            contextlib.nullcontext(str(kept))
            if kept
            else tempfile.TemporaryDirectory(prefix="dit-bench-sweep-")
        )
        with place as tmp:
            one = variants(Path(tmp), 1, args.devices, args.delay_ms, args.vary)
            many = variants(Path(tmp), args.variants, args.devices, args.delay_ms, args.vary)
            load_one = loadavg()
            wall_1, profile_1 = timed(mode, one, Path(tmp) / "runs1", args.inventory)
            load_many = loadavg()
            wall_n, profile_n = timed(mode, many, Path(tmp) / "runsN", args.inventory)
            load_end = loadavg()
        n = args.variants
        overhead = ((wall_n - wall_1) - (profile_n - profile_1)) / (n - 1)
        print(f"{mode}: T(1) {wall_1:.1f} s (profile {profile_1:.1f} s; load average {load_one})")
        print(
            f"{mode}: T({n}) {wall_n:.1f} s (profile {profile_n:.1f} s; load average {load_many} -> {load_end})"
        )
        print(
            f"{mode}: per-variant overhead {overhead:.1f} s with {args.devices} device(s) + edge "
            f"{'on ' + args.inventory if args.inventory else 'in local mode'} "
            f"(target on the emulated rack: <= 6 s)"
        )


if __name__ == "__main__":
    main()
