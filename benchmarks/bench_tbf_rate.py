"""Accuracy of the token-bucket rate cap: dit.conditions.netem.tc's tbf argv on a veth between two namespaces,
iperf3 TCP goodput across it, per cap. Needs root, ``ip netns``, ``tc`` and ``iperf3``.

    python benchmarks/bench_tbf_rate.py [--caps 5 10 20 50] [--seconds 3]

Prints one line per cap: the cap, the measured goodput and their ratio. TCP goodput is below the
cap by the header overhead (1448 payload bytes per 1514-byte frame: 95.6 %).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

from dit.conditions.netem.tc import build_tree

NS_A, NS_B, DEV, PEER = "ditbencha", "ditbenchb", "ditbencha0", "ditbenchb0"


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True)


def setup() -> None:
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    sh("ip", "link", "add", DEV, "type", "veth", "peer", "name", PEER)
    sh("ip", "link", "set", DEV, "netns", NS_A)
    sh("ip", "link", "set", PEER, "netns", NS_B)
    sh("ip", "-n", NS_A, "addr", "add", "10.204.0.1/24", "dev", DEV)
    sh("ip", "-n", NS_B, "addr", "add", "10.204.0.2/24", "dev", PEER)
    sh("ip", "-n", NS_A, "link", "set", DEV, "up")
    sh("ip", "-n", NS_B, "link", "set", PEER, "up")


def teardown() -> None:
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def measure(seconds: int) -> float:
    server = subprocess.Popen(
        ["ip", "netns", "exec", NS_B, "iperf3", "-s", "-1", "-p", "5201"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                NS_A,
                "iperf3",
                "-c",
                "10.204.0.2",
                "-p",
                "5201",
                "-t",
                str(seconds),
                "-J",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6
    finally:
        server.wait(timeout=seconds + 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--caps", type=float, nargs="+", default=[5, 10, 20, 50])
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.caps, args.seconds = [20.0], 1
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    teardown()
    setup()
    try:
        print(f"{'cap Mbit/s':>10} {'measured':>9} {'ratio':>6}")
        for cap in args.caps:
            shaping = build_tree({"rate_mbit": cap}, DEV, device="bench", netns=NS_A)
            assert shaping is not None
            for argv in shaping.argv:
                sh(*argv)
            measured = measure(args.seconds)
            print(f"{cap:>10g} {measured:>9.2f} {measured / cap:>6.3f}")
            sh("tc", "-n", NS_A, "qdisc", "del", "dev", DEV, "root")
    finally:
        teardown()


if __name__ == "__main__":
    main()
