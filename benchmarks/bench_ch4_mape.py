"""ch4_validation's delay-model MAPE per policy, and the start lateness p99 per device, in local mode or on a rack.

    sudo .venv/bin/python benchmarks/bench_ch4_mape.py                       # local mode
    sudo .venv/bin/python benchmarks/bench_ch4_mape.py -i /var/lib/dit/rack/inventory.yml
    .venv/bin/python benchmarks/bench_ch4_mape.py --runs runs/ch4_validation  # figures of runs made before
    sudo .venv/bin/python benchmarks/bench_ch4_mape.py --keep /tmp/ch4   # keep the runs for a closer look

Runs ``dit run scenarios/ch4_validation.yaml`` (four devices, the RR and SJF sweep) once, with the
fake model standing in for AlexNet (same stages and cut sizes: the catalogue's stand-in profile; the
scenario is copied with that model, in local mode too, where the stand-in is otherwise only the
fallback when TensorFlow is missing),
then validates every run of the sweep (``dit.analysis.model_validation.validate_run``) and prints:

- the MAPE of the delay model against the measured delays per policy (target: at most 10 % under
  both), with the number of points;
- per device, the start lateness over the sweep's runs: median, p99 (nearest rank) and max (targets:
  p99 below 200 µs without load, below 1 ms under ch4's load — devices 2-4 carry load here);
- how each device waited for the start (absolute-clock sleep, scheduling policy);
- the 1-minute load average before and after, which every figure here depends on.

A sweep takes minutes (two runs of about 5 x 50 inference rounds); do not run it more than once on a
shared machine. ``--runs DIR`` prints the figures of runs made before, without running anything.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from dit.analysis.lateness import lateness_over_runs
from dit.analysis.model_validation import validate_run
from dit.models.catalogue import BUILTIN
from dit.run.rundir import STATUS, read_json, runs_under

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "ch4_validation.yaml"


def load1() -> float:
    return os.getloadavg()[0]


def smoke(doc: dict[str, Any]) -> None:
    """``doc`` cut to one short run (CI): two devices, the second loaded, few rounds, one policy."""
    devices = list(doc.get("devices") or [])[:2]
    doc["devices"] = devices
    doc["repetitions"] = 1
    inference = doc.get("inference")
    if isinstance(inference, dict):
        inference["repetitions"] = 3
        points = list(inference.get("partition_points") or [])
        if len(points) > 2:
            inference["partition_points"] = [points[0], points[-1]]
    if isinstance(doc.get("load"), dict):
        doc["load"] = {d: v for d, v in doc["load"].items() if d in devices}
    sweep = doc.get("sweep")
    if isinstance(sweep, dict) and sweep.get("values"):
        sweep["values"] = sweep["values"][-1:]


def parse_delays(values: list[str]) -> dict[str, float]:
    """``DEVICE=MS`` items (``--delay``) as {device: added delay in ms}; a bad item names itself."""
    out: dict[str, float] = {}
    for item in values:
        device, sep, ms = item.partition("=")
        try:
            delay = float(ms)
        except ValueError:
            delay = -1.0
        if not sep or not device or delay < 0:
            raise SystemExit(f"--delay {item!r}: expected DEVICE=MS with MS >= 0, e.g. device1=10")
        out[device] = delay
    return out


def with_stand_in(
    scenario: Path,
    out_dir: Path,
    start_lead_s: float | None = None,
    smoke_run: bool = False,
    delays: dict[str, float] | None = None,
) -> Path:
    """A copy of ``scenario`` whose model is its catalogue stand-in (the fake model, same stages),
    with ``timing.start_lead_s`` set when given, cut to one short run with ``smoke_run``, and each
    device of ``delays`` given that added delay (``network.<device>.delay_ms``: netem where the kernel
    has it, else the userspace link emulator)."""
    doc: dict[str, Any] = yaml.safe_load(scenario.read_text(encoding="utf-8"))
    if smoke_run:
        smoke(doc)
    for device, ms in (delays or {}).items():
        if device not in (doc.get("devices") or []):
            raise SystemExit(f"--delay {device}={ms:g}: {device} is not a device of {scenario.name}")
        network: dict[str, Any] = doc["network"] if isinstance(doc.get("network"), dict) else {}
        block: dict[str, Any] = network.get(device) or {}
        doc["network"] = {**network, device: {**block, "delay_ms": ms}}
    if start_lead_s is not None:
        doc.setdefault("timing", {})["start_lead_s"] = start_lead_s
    model = doc["model"] if isinstance(doc["model"], str) else doc["model"]["name"]
    entry = BUILTIN.get(model)
    if entry is not None and entry.stand_in:
        doc["model"] = {"name": "fake", "params": {"profile": entry.stand_in}}
    path = out_dir / scenario.name
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def run_sweep(scenario: Path, inventory: str | None, runs_dir: Path) -> tuple[float, int]:
    """The sweep's wall time (s) and ``dit run``'s exit status."""
    argv = [sys.executable, "-m", "dit", "run", str(scenario), "--runs-dir", str(runs_dir)]
    if inventory:
        argv += ["-i", inventory]
    start = time.perf_counter()
    result = subprocess.run(argv, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        # One failed variant (e.g. its load not ready on an overloaded machine) must not hide the
        # figures of the others: report() prints a failed run's state and error in its row.
        message = f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr[-2000:]}"
        if not list(runs_dir.glob(f"*/*/{STATUS}")):
            raise SystemExit(message + result.stdout[-4000:])
        print(message, file=sys.stderr)
    return time.perf_counter() - start, result.returncode


def _ms(value: str | None) -> str:
    """A self-check difference for the report: signed ms, or why there is none."""
    try:
        return f"{float(value or ''):+.3f} ms"
    except ValueError:
        return "not measured"


def network_note(run_dir: Path) -> str:
    """How the run's network conditions applied (the self-check's rows: backend, pass), or ''."""
    path = run_dir / "aggregate" / "netem_check.csv"
    if not path.is_file():
        return ""
    with path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return "; ".join(
        f"{r['device']}->{r['target']} +{float(r['intended_delay_ms']):g} ms by {r['backend'] or r['shaping']}, "
        f"measured - baseline - intended {_ms(r['difference_ms'])} (pass: {r['pass'] or 'not checked'})"
        for r in rows
        if r.get("intended_delay_ms") not in (None, "", "0", "0.0")
    )


def report(dirs: list[Path]) -> None:
    print(f"{'policy':<8} {'MAPE %':>8} {'points':>7}  run")
    lateness: list[dict[str, int]] = []
    waits: dict[str, str] = {}
    for run_dir in dirs:
        status = read_json(run_dir / STATUS)
        lateness.append({str(k): int(v) for k, v in (status.get("lateness_ns") or {}).items()})
        for device, wait in (status.get("start_wait") or {}).items():
            waits[str(device)] = f"{wait.get('policy', '?')} {wait.get('wait', '?')}"
        if status.get("state") not in ("completed", "degraded"):
            print(
                f"{'-':<8} {'-':>8} {'-':>7}  {run_dir.name}: {status.get('state')} {status.get('error', '')}"
            )
            continue
        summary = validate_run(run_dir)
        for policy, mape in summary.mape_by_policy.items():
            print(f"{policy:<8} {mape:>8.2f} {summary.points:>7}  {run_dir.name}")
        note = network_note(run_dir)
        if note:
            print(f"{'':<8} network: {note}")
    print()
    print(f"{'device':<9} {'runs':>4} {'median_us':>10} {'p99_us':>8} {'max_us':>8}  start wait")
    for item in lateness_over_runs(lateness):
        print(
            f"{item.device:<9} {item.runs:>4} {item.median_ns / 1e3:>10.1f} {item.p99_ns / 1e3:>8.1f} "
            f"{item.max_ns / 1e3:>8.1f}  {waits.get(item.device, '')}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "-i", "--inventory", help="A rack inventory (dit rack up writes one); local mode without."
    )
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--runs", type=Path, help="Print the figures of these runs; run nothing.")
    parser.add_argument("--keep", type=Path, help="Make the runs under this directory and keep them.")
    parser.add_argument(
        "--start-lead", type=float, help="timing.start_lead_s for the runs (default: the scenario's)."
    )
    parser.add_argument(
        "--smoke", action="store_true", help="one short run: 2 devices, 3 rounds, one policy (CI)"
    )
    parser.add_argument(
        "--delay",
        action="append",
        default=[],
        metavar="DEVICE=MS",
        help="Add this delay to the device's link (repeatable): the delay model's MAPE with it applied.",
    )
    args = parser.parse_args()
    delays = parse_delays(args.delay)
    if args.runs:
        report(runs_under(args.runs))
        return
    before = load1()
    with tempfile.TemporaryDirectory(prefix="dit-bench-ch4-") as tmp:
        # the fake model always: with TensorFlow installed, local mode would build the real AlexNet
        scenario = with_stand_in(args.scenario, Path(tmp), args.start_lead, args.smoke, delays)
        runs_dir = args.keep if args.keep else Path(tmp) / "runs"
        wall, status = run_sweep(scenario, args.inventory, runs_dir)
        print(
            f"mode: {'inventory ' + args.inventory if args.inventory else 'local'}; sweep wall time {wall:.0f} s"
        )
        print(f"load average (1 min): {before:.2f} before, {load1():.2f} after")
        report(runs_under(runs_dir))
    if status != 0:  # the figures of the variants that ran are printed above; still a failure
        raise SystemExit(status)


if __name__ == "__main__":
    main()
