"""Tokens/s of HeadSplit and llama.cpp RPC on the same emulated rack, side by side, with the load average.

    sudo .venv/bin/python benchmarks/bench_runtimes_compare.py \\
        [--devices 2] [--tokens 8] [--rtts 0] [--model llama-tiny] [--cpu-share 100] [--memory-mb 1024]
    .venv/bin/python benchmarks/bench_runtimes_compare.py --runs DIR   # figures of runs made before

Runs the runtime sweep of ``scenarios/ch6_compare.yaml`` — HeadSplit greedy + speculation, HeadSplit
layer-wise, llama.cpp RPC F32 and Q8_0 — x the added RTTs of ``--rtts`` (ms between two workers: half
on each worker's egress, as in the scenario) on an emulated rack built for the purpose: ``dit rack up
--devices N`` under its own name, subnet and state directory (so it cannot meet another rack of this
machine), ``dit run`` of the reduced scenario over SSH, and ``dit rack down`` whatever happened. Every
device is a worker of both runtimes; the controllers run on the edge node.

What it needs on this machine (nothing is built or downloaded): the llama.cpp binaries built into
``/var/cache/dit/llamacpp/<sdist hash>/bin`` (``python -m dit_llamacpp.build``), torch in this
interpreter (HeadSplit's processes), and the GGUF files of ``--model`` at F32 and Q8_0 in
``--gguf-dir`` (made there by ``python -m dit_llamacpp.models convert``, run in a child when missing:
it imports torch, and on the seeded weights it only converts). Both runtime packages are pip-installed
offline from ``runtimes/`` into a throwaway directory that dit and the nodes' interpreter (a wrapper,
the HeadSplit block's ``python``) import from.

Prints one row per run: runtime variant, added RTT and whether netem applied it (this kernel has no
``sch_netem``: on the emulated rack the delays are recorded, not applied, so every RTT measures 0),
tokens/s, mean per-token latency (each runtime's ``tokens_per_s`` and ``token_latency_mean``, the
same columns: ``dit.report.rtt``; both runtimes' tokens/s span the whole generation, prefill
included, docs/runtimes.md "LLM summary columns"), the run's state; then the 1/5/15-minute
load average before and after, which every figure here depends on, and where the runs and their
``dit report`` are. Four variants per RTT take about five minutes; run it once on a shared machine.
The rack is removed even when the run fails; a ``--timeout`` kill of ``dit run`` may leave a run to
``dit cleanup``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from dit.extras import require_extras
from dit.report.build import write_report
from dit.report.rtt import RttRun, load_runs
from dit.run.rundir import STATUS, read_json, runs_under

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "ch6_compare.yaml"
RUNTIMES = (REPO / "runtimes" / "headsplit", REPO / "runtimes" / "llamacpp")
DIT = [sys.executable, "-m", "dit"]
QUANTS = ("F32", "Q8_0")
SECURE_BASE = Path("/var/lib/dit/bench")


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def install_runtimes(site: Path, work: Path) -> None:
    """Both runtime distributions into ``site`` (offline, no dependencies): their entry points for dit."""
    for source in RUNTIMES:
        copy = work / source.name  # the build writes into its source tree
        shutil.copytree(
            source, copy, ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info", "build")
        )
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                "--no-index", "--target", str(site), str(copy)]  # fmt: skip
        done = subprocess.run(argv, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")


def node_python(site: Path, work: Path) -> Path:
    """An interpreter for the nodes that imports the installed runtimes (HeadSplit's block ``python``)."""
    wrapper = work / "python"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n',
        encoding="utf-8",
    )
    wrapper.chmod(0o755)
    return wrapper


def ensure_gguf(model: str, gguf_dir: Path, site: Path, quants: tuple[str, ...] = QUANTS) -> None:
    """The GGUF files of ``model`` at every quantisation the sweep uses (converted in a child: torch)."""
    if all((gguf_dir / f"{model}-{q}.gguf").is_file() for q in quants):
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "src")])}
    argv = [sys.executable, "-m", "dit_llamacpp.models", "convert", model, *quants, "--out", str(gguf_dir)]
    done = subprocess.run(argv, env=env, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
    print(done.stdout.strip())


def scenario(
    devices: int,
    tokens: int,
    rtts: list[float],
    model: str,
    python: Path,
    gguf_dir: Path,
    quants: tuple[str, ...] = QUANTS,
) -> dict[str, Any]:
    """ch6_compare reduced: ``devices`` workers, ``tokens`` tokens of ``model``, the RTTs asked for,
    the runtime variants whose llama.cpp quantisation is among ``quants``."""
    doc: dict[str, Any] = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    names = [f"device{i}" for i in range(1, devices + 1)]
    doc["devices"] = names
    values: list[dict[str, Any]] = []
    for value in next(a for a in doc["sweep"] if a["path"] == "runtime")["values"]:
        if value.get("quant", quants[0]) not in quants:
            continue
        block = {**value, "model": model, "tokens": tokens}
        if block["name"] == "headsplit":
            block["python"] = str(python)
        else:
            block["models_dir"] = str(gguf_dir)
        values.append(block)
    network = [{d: {"delay_ms": rtt / 2} for d in names} if rtt else {} for rtt in rtts]
    doc["sweep"] = [{"path": "runtime", "values": values}, {"path": "network", "values": network}]
    return doc


def report(dirs: list[Path]) -> None:
    runs: list[RttRun] = load_runs(dirs)
    width = max(len(r.variant) for r in runs)
    print(
        f"{'runtime variant':<{width}}  {'RTT ms':>6}  {'netem':<21}  {'tokens/s':>9}  {'ms/token':>9}  state"
    )
    for run in runs:
        rate = "-" if run.tokens_per_s is None else f"{run.tokens_per_s:.2f}"
        latency = "-" if run.token_latency_ns is None else f"{run.token_latency_ns / 1e6:.2f}"
        netem = run.netem or "no delay"
        line = f"{run.variant:<{width}}  {run.rtt_ms:>6g}  {netem:<21}  {rate:>9}  {latency:>9}  {run.state}"
        error = read_json(next(d for d in dirs if d.name == run.run) / STATUS).get("error")
        print(
            line + (f": {str(error)[:300]}" if error and run.state not in ("completed", "degraded") else "")
        )


def dit(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DIT, *argv], env=env, check=False, capture_output=True, text=True, timeout=timeout
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=Path, help="Print the figures of these runs; run nothing.")
    parser.add_argument("--devices", type=int, default=2, help="Workers (rack devices).")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--rtts", default="0", help="Comma-separated added RTTs between workers, ms.")
    parser.add_argument("--model", default="llama-tiny", help="A reduced decoder both runtimes know.")
    parser.add_argument(
        "--cpu-share", type=int, default=100, help="Each device node's CPU quota, %% of a CPU."
    )
    parser.add_argument("--memory-mb", type=int, default=1024, help="Each device node's memory limit.")
    parser.add_argument("--gguf-dir", type=Path, default=Path.home() / ".cache" / "dit" / "gguf")
    parser.add_argument("--out", type=Path, help="Keep the runs here (default: a new directory under /tmp).")
    parser.add_argument("--name", default="rc", help="The rack's name (namespaces dit-<name>-*).")
    parser.add_argument(
        "--subnet", default="10.213.170", help="The rack's inference /24 (first three octets)."
    )
    parser.add_argument("--timeout", type=float, default=3600, help="Seconds for the whole dit run.")
    parser.add_argument(
        "--smoke", action="store_true", help="2 devices, 2 tokens, no added RTT, llama.cpp at F32 only (CI)"
    )
    args = parser.parse_args()
    require_extras("bench_runtimes_compare.py", "llm")
    quants: tuple[str, ...] = QUANTS
    if args.smoke:
        args.devices, args.tokens, args.rtts, quants = 2, 2, "0", ("F32",)
    if args.runs:
        report(runs_under(args.runs))
        return
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, cgroups)")
    rtts = [float(v) for v in args.rtts.split(",")]
    out = args.out or Path(tempfile.mkdtemp(prefix="dit-bench-compare-"))
    out.mkdir(parents=True, exist_ok=True)
    # the rack's state dir root's all the way up: dit rack up refuses one below /tmp (its keys, sshd)
    SECURE_BASE.mkdir(parents=True, exist_ok=True)
    SECURE_BASE.chmod(0o755)
    site, state = out / "site", Path(tempfile.mkdtemp(prefix="rc-", dir=SECURE_BASE)) / "rack"
    install_runtimes(site, out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "src")])}
    ensure_gguf(args.model, args.gguf_dir, site, quants)
    doc = scenario(
        args.devices, args.tokens, rtts, args.model, node_python(site, out), args.gguf_dir.resolve(), quants
    )
    path = out / "ch6_compare_bench.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    before = load()
    up = ["rack", "up", "--devices", str(args.devices), "--cpu-share", str(args.cpu_share),
          "--memory-mb", str(args.memory_mb), "--name", args.name, "--subnet", args.subnet,
          "--state-dir", str(state)]  # fmt: skip
    started = dit(up, env, 600)
    if started.returncode != 0:
        raise SystemExit(f"dit {' '.join(up)} failed:\n{started.stdout}{started.stderr}")
    print(started.stdout.strip())
    try:
        start = time.perf_counter()
        done = dit(["run", str(path), "-i", str(state / "inventory.yml"), "--runs-dir", str(out / "runs")], env,
                   args.timeout)  # fmt: skip
        wall = time.perf_counter() - start
    finally:
        down = dit(["rack", "down", "--state-dir", str(state)], env, 600)
        if down.returncode != 0:
            print(f"dit rack down failed:\n{down.stdout}{down.stderr}", file=sys.stderr)
        else:
            shutil.rmtree(state.parent, ignore_errors=True)
    after = load()
    if done.returncode != 0:
        print(f"dit run exited {done.returncode}:\n{done.stderr[-3000:]}", file=sys.stderr)
    print(f"rack: {args.devices} devices at {args.cpu_share} % of a CPU, {args.memory_mb} MiB; "
          f"{args.model}, {args.tokens} tokens; sweep wall time {wall:.0f} s")  # fmt: skip
    print(f"load average (1/5/15 min): {before} before, {after} after")
    dirs = runs_under(out / "runs")
    report(dirs)
    print(f"runs: {out / 'runs'}; report: {write_report(dirs[0].parent)}")
    if done.returncode != 0:  # the figures of the variants that ran are printed above; still a failure
        raise SystemExit(done.returncode)


if __name__ == "__main__":
    main()
