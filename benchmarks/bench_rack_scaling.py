"""The emulated rack at N = 5, 10, 25 devices: seconds for rack up, apply, teardown, rack down; memory per node.

    sudo .venv/bin/python benchmarks/bench_rack_scaling.py [--sizes 5,10,25]

Each size builds a rack of its own name, subnet and state dir (so it cannot meet a user's rack),
reads every node cgroup's memory charge (v1 ``memory.usage_in_bytes``, v2 ``memory.current``: the
sshd and what it holds), runs one real experiment over SSH on it (:func:`scenario`: the fake model on
all N devices, one round, a tbf rate cap on device1 and a CPU share on device2, so apply and teardown
set and restore a tc tree and a cgroup besides starting and stopping every node's processes), reads
the apply and teardown wall times from the run's ``status.json`` (``stage_ns``), and removes the rack
again. Prints one row per size with the 1-minute load average, which these wall times depend on, and
then apply+teardown of each size relative to the first against the ratio of devices: sub-linear below
0.9 times that ratio, linear within 10 % of it, super-linear above.

On one machine every node's Ansible modules run on the same cores, so apply+teardown costs CPU time
per node and grows at least linearly once the cores are busy (2026-12-01, 2 cores: 25.7 s at 5
devices, 51.1 s at 10, 169.2 s at 25, load 3-20). Sub-linear growth needs nodes with their own CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
DIT = [sys.executable, "-m", "dit"]


def node_memory_bytes(name: str) -> list[int]:
    files = list(CGROUPS.glob(f"memory/dit-{name}/*/memory.usage_in_bytes"))
    files += list(CGROUPS.glob(f"dit-{name}/*/memory.current"))
    return [int(f.read_text()) for f in files]


def scenario(devices: int) -> str:
    """The smallest run that still applies a condition of each kind on the rack."""
    names = [f"device{i}" for i in range(1, devices + 1)]
    doc = {
        "name": f"rack_scaling_{devices}",
        "model": "fake",
        "devices": names,
        "repetitions": 1,
        "seed": 0,
        "edge_server": {"policy": "SJF"},
        "inference": {"enabled": True, "partition_points": [0], "repetitions": 1},
        "network": {"device1": {"rate_mbit": 50}},
        "hardware": {names[-1]: {"cpu_share_pct": 50}},
        "optimisation": {"enabled": False},
    }
    return json.dumps(doc)  # JSON is YAML


def stage_seconds(runs: Path) -> dict[str, float]:
    statuses = list(runs.glob("*/*/status.json")) + list(runs.glob("*/status.json"))
    if len(statuses) != 1:
        raise SystemExit(f"expected one run under {runs}, found {len(statuses)}")
    status = json.loads(statuses[0].read_text())
    if status.get("state") not in ("completed", "degraded"):
        raise SystemExit(f"{statuses[0]}: {status.get('state')} {status.get('error', '')}")
    return {stage: ns / 1e9 for stage, ns in status.get("stage_ns", {}).items()}


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, check=False, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")
    return elapsed


#: Where the racks' state dirs go: root's all the way up (dit rack up refuses one below /tmp, whose
#: writers could replace the rack's keys, and sshd's StrictModes would refuse them).
SECURE_BASE = Path("/var/lib/dit/bench")


def secure_base() -> Path:
    SECURE_BASE.mkdir(parents=True, exist_ok=True)
    SECURE_BASE.chmod(0o755)
    return SECURE_BASE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5,10,25", help="Comma-separated device counts.")
    parser.add_argument("--prefix", default="bs", help="Rack name prefix (one rack per size: <prefix><i>).")
    parser.add_argument("--subnet-base", type=int, default=200, help="Size i uses 10.213.<base + i>.")
    parser.add_argument("--smoke", action="store_true", help="one rack of 1 device (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes = "1"
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, cgroups)")
    header = ("devices", "up_s", "apply_s", "teardown_s", "a+t_s", "run_s", "down_s", "mem_MiB/node", "load1")
    print(" ".join(f"{h:>12}" for h in header))
    totals: list[tuple[int, float]] = []
    for index, size in enumerate(int(s) for s in args.sizes.split(",")):
        name, subnet = f"{args.prefix}{index}", f"10.213.{args.subnet_base + index}"
        with tempfile.TemporaryDirectory(prefix="rack-", dir=secure_base()) as tmp:
            state = str(Path(tmp) / "rack")
            up = [*DIT, "rack", "up", "--devices", str(size), "--name", name, "--subnet", subnet]
            up_s = timed([*up, "--state-dir", state])
            try:
                memory = node_memory_bytes(name)
                path = Path(tmp) / "scenario.yaml"
                path.write_text(scenario(size))
                runs = Path(tmp) / "runs"
                inventory = str(Path(state) / "inventory.yml")
                run_s = timed([*DIT, "run", str(path), "-i", inventory, "--runs-dir", str(runs)])
                stages = stage_seconds(runs)
            finally:
                down_s = timed([*DIT, "rack", "down", "--state-dir", state])
        per_node_mib = sum(memory) / max(len(memory), 1) / 2**20
        both = stages["apply"] + stages["teardown"]
        totals.append((size, both))
        row = (size, up_s, stages["apply"], stages["teardown"], both, run_s, down_s, per_node_mib)
        print(" ".join(f"{v:>12.2f}" if isinstance(v, float) else f"{v:>12}" for v in row), end="")
        print(f" {os.getloadavg()[0]:>12.2f}", flush=True)
    base_size, base = totals[0]
    for size, both in totals[1:]:
        # within 10 % of the device ratio is linear: 1.99x for 2x the devices is not a saving
        ratio, devices_ratio = both / base, size / base_size
        verdict = (
            "sub-linear"
            if ratio < 0.9 * devices_ratio
            else "linear"
            if ratio <= 1.1 * devices_ratio
            else "super-linear"
        )
        print(
            f"apply+teardown at {size} devices / at {base_size}: {both / base:.2f}x "
            f"for {size / base_size:.2f}x the devices ({verdict})"
        )


if __name__ == "__main__":
    main()
