"""The simulator's replay of every HeadSplit run under a directory: each run fitted on itself, each
predicted from the same strategy at every other added-delay column, and where the error comes from.

    .venv/bin/python benchmarks/bench_sim_replay.py RUNS_DIR [RUNS_DIR ...] [--rates trace,compute]
    .venv/bin/python benchmarks/bench_sim_replay.py --smoke   # the checked-in runs (CI)

``RUNS_DIR``: any directory holding finished run directories (``runs/ch6_headsplit`` of a sweep, the
emulated rack's ``runs/``, a local ``--runs-dir``); every ``raw/<controller>/<controller>_headsplit.json``
below it is a run. A run's column is the delay its devices added (``aggregate/netem_check.csv``, the
device-to-edge rows' intended delay; 0 without them), its group the strategy, speculation and control;
runs of one group at different columns predict each other (``dit simulate --replay RUN --calibration
OTHER``). ``--rates``: the replay's compute rates (``dit.sim.replay.RATES``), each printed in turn:
``trace`` runs each decode step at the speed the replayed run computed it (a prediction takes only the
per-call cost from the other column), ``compute`` at the run's mean rates (a prediction takes the
other column's rates too).

Per run fitted on itself, ``floor``: the MAPE of the measured mean itself, what a simulation with one
latency per token cannot go below. Per prediction, the decode tokens' means, measured beside simulated
(a fit on the run itself matches them by construction): the token, the compute on its critical path
(HeadSplit's ``critical_ns``), the controller's own compute (``controller_ns``), the rest (``comm_ns``:
messages, waits, dispatch) and the messages on the critical path. Replays do
not depend on the machine's load; the runs' own timings do (the load average is printed for the record).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit.sim.engine import SimError
from dit.sim.replay import RATES, Replay, replay


@dataclass(frozen=True)
class Run:
    path: Path
    group: str  # strategy, speculation, control
    delay_ms: float  # the devices' added one-way delay (the column)
    doc: dict[str, Any]


def find_runs(roots: Sequence[Path]) -> list[Run]:
    runs = []
    for root in roots:
        for file in sorted(root.glob("**/raw/*/*_headsplit.json")):
            path = file.parents[2]
            doc = json.loads(file.read_text(encoding="utf-8"))
            if not doc.get("tokens") or doc.get("error"):
                continue
            group = f"{doc.get('strategy')}{'+spec' if doc.get('speculation') else ''} {doc.get('control') or 'rpc'}"
            runs.append(Run(path, group, added_delay_ms(path), doc))
    return runs


def added_delay_ms(run: Path) -> float:
    """The largest delay a device of the run added (its device-to-edge rows of netem_check.csv)."""
    path = run / "aggregate" / "netem_check.csv"
    if not path.is_file():
        return 0.0
    with path.open(encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("target") == "edge"]
    return max((float(r.get("intended_delay_ms") or 0) for r in rows), default=0.0)


def floor_percent(doc: dict[str, Any]) -> float:
    first = 1 if int(doc.get("prompt_tokens") or 0) > 0 else 0
    total = [int(t["total_ns"]) for t in doc["tokens"][first:]]
    mean = statistics.fmean(total)
    return 100 * statistics.fmean(abs(mean - t) / t for t in total)


def components(r: Replay, doc: dict[str, Any]) -> str:
    """Decode means (ms), measured / simulated: token, critical compute, controller, rest; messages."""
    first = r.decode_from
    toks = doc["tokens"][first:]

    def mean_ms(key: str) -> float:
        return statistics.fmean(int(t.get(key) or 0) for t in toks) / 1e6

    sim = r.result
    n = len(sim.token_s) - first
    token = statistics.fmean(sim.token_s[first:]) * 1e3
    crit = statistics.fmean(sim.critical_s[first:]) * 1e3 if len(sim.critical_s) > first else float("nan")
    ctrl = r.controller_s * 1e3
    msgs = statistics.fmean(sim.critical_messages[first:]) if len(sim.critical_messages) > first else 0.0
    measured_msgs = statistics.fmean(float(t.get("critical_messages") or 0) for t in toks)
    return (
        f"token {mean_ms('total_ns'):6.1f}/{token:6.1f}  critical compute {mean_ms('critical_ns'):6.1f}/{crit:6.1f}"
        f"  controller {mean_ms('controller_ns'):5.1f}/{ctrl:5.1f}"
        f"  rest {mean_ms('comm_ns'):6.1f}/{token - crit - ctrl:6.1f}"
        f"  messages {measured_msgs:4.1f}/{msgs:4.1f}  ({n} decode tokens)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="directories holding run directories")
    parser.add_argument("--rates", default="trace,compute", help="comma-separated, of " + ", ".join(RATES))
    parser.add_argument(
        "--smoke", action="store_true", help="the checked-in dataflow runs (tests/fixtures/sim_dataflow): CI"
    )
    args = parser.parse_args()
    if args.smoke:
        args.runs = [Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sim_dataflow"]
    elif not args.runs:
        parser.error("RUNS_DIR: at least one directory of runs (or --smoke)")
    modes = [m.strip() for m in args.rates.split(",") if m.strip()]
    print(f"load average {os.getloadavg()[0]:.2f} (the replays do not depend on it)")
    runs = find_runs(args.runs)
    if not runs:
        raise SystemExit(f"no HeadSplit run under {', '.join(map(str, args.runs))}")
    for mode in modes:
        print(
            f"\n--rates {mode}: each run fitted on itself (MAPE, decode tokens; floor: the measured mean's own)"
        )
        for run in sorted(runs, key=lambda r: (r.group, r.delay_ms)):
            try:
                r = replay(run.path, rates=mode)
            except SimError as exc:
                print(f"  {run.group:<22} delay {run.delay_ms:4.1f} ms  {run.path.name}: {exc}")
                continue
            print(
                f"  {run.group:<22} delay {run.delay_ms:4.1f} ms  MAPE {r.mape_percent:5.1f} %"
                f"  floor {floor_percent(run.doc):5.1f} %  call {r.config.devices[0].call_overhead_s * 1e3:5.2f} ms"
                f"  {run.path.name}"
            )
        print(f"--rates {mode}: predicted from the same group at another column (calibration -> replayed)")
        for target in sorted(runs, key=lambda r: (r.group, r.delay_ms)):
            for cal in runs:
                if cal.group != target.group or cal.delay_ms == target.delay_ms:
                    continue
                try:
                    r = replay(target.path, calibration=cal.path, rates=mode)
                except SimError as exc:
                    print(f"  {target.group:<22} {cal.delay_ms:4.1f} -> {target.delay_ms:4.1f} ms: {exc}")
                    continue
                column = f"{cal.delay_ms:4.1f} -> {target.delay_ms:4.1f} ms"
                print(
                    f"  {target.group:<22} {column}  MAPE {r.mape_percent:5.1f} %"
                    f"  decode mean {1e3 * statistics.fmean(r.result.token_s[r.decode_from :]):6.1f}"
                    f" / {1e3 * statistics.fmean(r.measured_token_s[r.decode_from :]):6.1f} ms"
                )
                print(f"      measured/simulated ms: {components(r, target.doc)}")


if __name__ == "__main__":
    main()
