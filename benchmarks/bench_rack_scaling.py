"""The emulated rack at N = 5, 10, 25 devices: seconds for `rack up` and `rack down`, memory per node.

    sudo .venv/bin/python benchmarks/bench_rack_scaling.py [--sizes 5,10,25]

Each size builds a rack of its own name, subnet and state dir (so it cannot meet a user's rack),
reads every node cgroup's memory charge (v1 ``memory.usage_in_bytes``, v2 ``memory.current``: the
sshd and what it holds), and removes the rack again. Prints one row per size with the 1-minute load
average, which these wall times depend on. Apply and teardown of a run are not timed here.
"""

from __future__ import annotations

import argparse
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


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, check=False, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5,10,25", help="Comma-separated device counts.")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, cgroups)")
    print(f"{'devices':>7} {'up_s':>7} {'down_s':>7} {'up_s/node':>9} {'mem_MiB/node':>12} {'load1':>6}")
    for index, size in enumerate(int(s) for s in args.sizes.split(",")):
        name, subnet = f"bs{index}", f"10.213.{200 + index}"
        with tempfile.TemporaryDirectory(prefix="dit-bench-rack-") as tmp:
            state = str(Path(tmp) / "rack")
            up = [*DIT, "rack", "up", "--devices", str(size), "--name", name, "--subnet", subnet]
            up_s = timed([*up, "--state-dir", state])
            memory = node_memory_bytes(name)
            down_s = timed([*DIT, "rack", "down", "--state-dir", state])
        per_node_mib = sum(memory) / max(len(memory), 1) / 2**20
        print(
            f"{size:>7} {up_s:>7.2f} {down_s:>7.2f} {up_s / (size + 1):>9.3f} {per_node_mib:>12.2f} "
            f"{os.getloadavg()[0]:>6.2f}"
        )


if __name__ == "__main__":
    main()
