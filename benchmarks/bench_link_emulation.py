"""Precision of the userspace link emulator (the network condition's backend without sch_netem).

Two network namespaces joined by a veth; the emulator (``dit-device link-emulator``, the same code a
node runs) holds the packets iptables sends to its queues. Needs root, ``ip``, ``iptables``, ``ping``
and ``iperf3``.

    python benchmarks/bench_link_emulation.py [--delays 1 5 15 25 50 100] [--pings 200] [--loss-packets 10000]
        [--loss-correlation 0 25 50 75] [--correlated-loss 10 50]

Prints, with the load average:

- per added delay, 0 ms first (the way through the queue and the emulator alone): a UDP echo's RTT
  (microsecond timestamps; ping prints 100 µs steps above 10 ms) minus the unshaped median RTT, its
  median and p99 error against the delay, and the shaped p99 against the unshaped p99 (the tail the
  emulator adds, without the unshaped path's own spread),
  and the emulator's own ``actual - scheduled`` hold-time histogram (p50 / p99 bucket bounds);
- loss 1 % and 10 % over ``--loss-packets`` pings each, against the binomial 99.7 % interval;
- correlated loss (netem's ``loss P% C%``): for each ``--correlated-loss`` P and ``--loss-correlation``
  C, ``--loss-packets`` numbered UDP datagrams through a queue of their own, the receiver's loss rate
  against ``expected_loss(P, C)`` and the mean and longest run of consecutive losses;
- jitter: the standard deviation of the RTT with 20 ms ± 5 ms (uniform: 5/sqrt(3) = 2.89 ms asked);
- TCP throughput (iperf3) through the emulator at 0 ms, and unshaped;
- the emulator's CPU time per 1000 packets/s (a UDP stream at a fixed rate through a 1 ms delay).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dit.device.link_emulator import expected_loss, quantile_upto_us
from dit.devtools.datagrams import receiver_script, sender_script

NS_A, NS_B, DEV, PEER = "ditlinka", "ditlinkb", "ditlinka0", "ditlinkb0"
NET = "10.205.0"
CHAIN = "DIT-00000000bead"
Q_MAIN, Q_LOSS1, Q_LOSS10, Q_JITTER = 3100, 3101, 3102, 3103
# .2: main (delay set per step), .3: 1 % loss, .4: 10 % loss, .5: 20 ms ± 5 ms, .6: unshaped
ADDRESSES = {
    "main": f"{NET}.2",
    "loss1": f"{NET}.3",
    "loss10": f"{NET}.4",
    "jitter": f"{NET}.5",
    "plain": f"{NET}.6",
}


def sh(*argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout


def in_a(*argv: str) -> list[str]:
    return ["ip", "netns", "exec", NS_A, *argv]


# Correlated loss: one address and queue per (P, C), from .10 and queue 3110 on.
CORRELATED_NET, Q_CORRELATED, CORRELATED_PORT = 10, 3110, 7008


def correlated_cases(losses: list[float], correlations: list[float]) -> list[tuple[str, int, float, float]]:
    """``(address, queue, loss %, correlation %)`` of every correlated-loss profile."""
    pairs = [(p, c) for p in losses for c in correlations]
    if len(pairs) > 100:
        raise SystemExit("at most 100 (loss, correlation) pairs")
    return [(f"{NET}.{CORRELATED_NET + i}", Q_CORRELATED + i, p, c) for i, (p, c) in enumerate(pairs)]


def setup(correlated: list[tuple[str, int, float, float]]) -> None:
    teardown()
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    sh("ip", "link", "add", DEV, "type", "veth", "peer", "name", PEER)
    sh("ip", "link", "set", DEV, "netns", NS_A)
    sh("ip", "link", "set", PEER, "netns", NS_B)
    sh("ip", "-n", NS_A, "addr", "add", f"{NET}.1/24", "dev", DEV)
    for address in [*ADDRESSES.values(), *(case[0] for case in correlated)]:
        sh("ip", "-n", NS_B, "addr", "add", f"{address}/24", "dev", PEER)
    for ns, dev in ((NS_A, DEV), (NS_B, PEER)):
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    ipt = in_a("iptables", "-w", "-t", "mangle")
    sh(*ipt, "-N", CHAIN)
    for name, queue in (("loss1", Q_LOSS1), ("loss10", Q_LOSS10), ("jitter", Q_JITTER)):
        sh(*ipt, "-A", CHAIN, "-d", f"{ADDRESSES[name]}/32", "-j", "NFQUEUE", "--queue-num", str(queue))
    for address, queue, _, _ in correlated:
        sh(*ipt, "-A", CHAIN, "-d", f"{address}/32", "-j", "NFQUEUE", "--queue-num", str(queue))
    sh(*ipt, "-A", CHAIN, "-d", f"{ADDRESSES['plain']}/32", "-j", "RETURN")
    sh(*ipt, "-A", CHAIN, "-j", "NFQUEUE", "--queue-num", str(Q_MAIN))
    sh(*ipt, "-I", "POSTROUTING", "1", "-o", DEV, "-j", CHAIN)


def teardown() -> None:
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def start_emulator(
    work: Path, spin_us: float, correlated: list[tuple[str, int, float, float]]
) -> subprocess.Popen[bytes]:
    config = {
        "spin_us": spin_us,
        "run_id": "bench", "host": "bench", "seed": 1, "results_dir": str(work / "results"),
        "ready_file": str(work / "ready"), "control_socket": str(work / "ctl"),
        "queues": [
            {"queue": Q_MAIN, "name": "main", "delay_ms": 0},
            {"queue": Q_LOSS1, "name": "loss1", "loss_pct": 1},
            {"queue": Q_LOSS10, "name": "loss10", "loss_pct": 10},
            {"queue": Q_JITTER, "name": "jitter", "delay_ms": 20, "jitter_ms": 5},
            *({"queue": q, "name": f"loss{p:g}c{c:g}", "loss_pct": p, "loss_correlation_pct": c}
              for _, q, p, c in correlated),
        ],
    }  # fmt: skip
    (work / "config.json").write_text(json.dumps(config))
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "DIT_RUN_ID": "bench-link-emulation"}
    argv = in_a(sys.executable, "-m", "dit.device", "link-emulator", "--config", str(work / "config.json"))
    proc = subprocess.Popen(argv, env=env)
    for _ in range(200):
        if (work / "ready").exists():
            return proc
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the link emulator did not become ready")


def set_delay(work: Path, delay_ms: float) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(json.dumps({"delay_ms": delay_ms}).encode(), str(work / "ctl"))
    time.sleep(0.05)


def ping(address: str, count: int, interval: str) -> tuple[int, list[float]]:
    out = subprocess.run(
        in_a("ping", "-n", "-q" if count > 2000 else "-n", "-c", str(count), "-i", interval, "-W", "2", address),
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    rtts = [
        float(w.split("=")[1]) for line in out.splitlines() for w in line.split() if w.startswith("time=")
    ]
    received = len(rtts)
    for line in out.splitlines():
        if "received" in line:
            received = int(line.split(",")[1].split()[0])
    return received, rtts


ECHO_PORT = 7007
# The probes run at SCHED_FIFO as the emulator does: on a loaded machine a SCHED_OTHER Python echo
# waits milliseconds for a core, which would be measured as the emulator's error.
REALTIME = ("chrt", "-f", "10") if shutil.which("chrt") else ()
ECHO_SERVER = (
    "import socket\n"
    "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.bind(('0.0.0.0',PORT))\n"
    "while True:\n"
    "    d,a=s.recvfrom(2048)\n"
    "    s.sendto(d,a)\n"
).replace("PORT", str(ECHO_PORT))
# UDP probes with microsecond timestamps (ping prints 3 significant digits: 100 µs steps above 10 ms).
ECHO_CLIENT = """
import json, select, socket, struct, sys, time
address, count, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)
sent, rtts, start = {}, {}, time.monotonic_ns()
i, deadline = 0, None
while True:
    now = time.monotonic_ns()
    if i < count and now >= start + int(i * gap * 1e9):
        sent[i] = time.monotonic_ns(); s.sendto(struct.pack("!I", i) + b"x" * 60, (address, PORT)); i += 1
        if i == count: deadline = now + 3_000_000_000
    if deadline is not None and (len(rtts) == count or now > deadline): break
    wait = max(0.0, (start + int(i * gap * 1e9) - now) / 1e9) if i < count else 0.05
    if select.select([s], [], [], min(wait, 0.05))[0]:
        while True:
            try: data = s.recv(2048)
            except BlockingIOError: break
            seq = struct.unpack("!I", data[:4])[0]; rtts[seq] = (time.monotonic_ns() - sent[seq]) / 1e3
print(json.dumps([rtts[k] for k in sorted(rtts)]))
""".replace("PORT", str(ECHO_PORT))


def echo_rtts_us(address: str, count: int, gap_s: float) -> list[float]:
    out = subprocess.run(
        in_a(*REALTIME, sys.executable, "-c", ECHO_CLIENT, address, str(count), str(gap_s)),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rtts: list[float] = json.loads(out)
    return rtts


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def udp_stream(address: str, rate: int, seconds: float) -> None:
    code = (
        "import socket,time\n"
        f"s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);n={int(rate * seconds)};gap={1 / rate}\n"
        "t=time.monotonic()\n"
        "for i in range(n):\n"
        "    d=t+i*gap-time.monotonic()\n"
        "    if d>0: time.sleep(d)\n"
        f"    s.sendto(b'x'*64,('{address}',9))\n"
    )
    subprocess.run(in_a(sys.executable, "-c", code), check=True)


def iperf3_mbit(address: str, seconds: int) -> float:
    server = subprocess.Popen(
        ["ip", "netns", "exec", NS_B, "iperf3", "-s", "-1", "-B", address, "-p", "5201"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(0.3)
        out = subprocess.run(
            in_a("iperf3", "-c", address, "-p", "5201", "-t", str(seconds), "-J"),
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        doc = json.loads(out or "{}")
        return float(doc.get("end", {}).get("sum_received", {}).get("bits_per_second", 0.0)) / 1e6
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=10)


NUMBERED_RECEIVER = receiver_script(CORRELATED_PORT)
NUMBERED_SENDER = sender_script(CORRELATED_PORT)


def numbered_losses(addresses: list[str], count: int, gap_s: float) -> dict[str, list[bool]]:
    """Per address, which of ``count`` numbered datagrams (sent to every address in turn) were lost."""
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", NS_B, sys.executable, "-c", NUMBERED_RECEIVER, *addresses],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        subprocess.run(
            in_a(sys.executable, "-c", NUMBERED_SENDER, str(count), str(gap_s), *addresses), check=True
        )
        out, _ = receiver.communicate("", timeout=60)
    finally:
        if receiver.poll() is None:
            receiver.kill()
    got = {address: set(seqs) for address, seqs in json.loads(out.splitlines()[-1]).items()}
    return {address: [i not in got[address] for i in range(count)] for address in addresses}


def runs_of(lost: list[bool]) -> list[int]:
    """The lengths of the runs of consecutive losses."""
    runs: list[int] = []
    for i, gone in enumerate(lost):
        if gone:
            if i == 0 or not lost[i - 1]:
                runs.append(0)
            runs[-1] += 1
    return runs


def binomial(n: int, p: float) -> tuple[float, float]:
    sd = math.sqrt(n * p * (1 - p))
    return n * p - 3 * sd, n * p + 3 * sd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--delays", type=float, nargs="+", default=[1, 5, 15, 25, 50, 100])
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--loss-packets", type=int, default=10_000)
    parser.add_argument("--jitter-pings", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2000, help="packets/s of the CPU measurement")
    parser.add_argument(
        "--spin-us", type=float, default=200.0, help="the emulator's busy wait before a release"
    )
    parser.add_argument(
        "--loss-correlation", type=float, nargs="*", default=[0, 25, 50, 75],
        help="loss correlations (%%) to measure at each --correlated-loss, --loss-packets datagrams each",
    )  # fmt: skip
    parser.add_argument(
        "--correlated-loss", type=float, nargs="*", default=[10, 50], help="loss (%%) of those"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.delays, args.pings, args.loss_packets, args.jitter_pings = [5], 20, 200, 40
        args.seconds, args.rate = 1, 500
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    work = Path(tempfile.mkdtemp(prefix="dit-bench-link-"))
    correlated = correlated_cases(args.correlated_loss, args.loss_correlation)
    setup(correlated)
    emulator = start_emulator(work, args.spin_us, correlated)
    echo = subprocess.Popen(["ip", "netns", "exec", NS_B, *REALTIME, sys.executable, "-c", ECHO_SERVER])
    try:
        ready = json.loads((work / "ready").read_text())
        print(
            f"emulator: SCHED_FIFO {ready.get('sched_fifo')}, mlockall {ready.get('mlockall')}, "
            f"spin {args.spin_us:g} µs"
        )
        base = echo_rtts_us(ADDRESSES["plain"], args.pings, 0.01)
        baseline, base_p99 = statistics.median(base), percentile(base, 99)
        print(f"unshaped UDP RTT median {baseline:.1f} µs, p99 {base_p99:.1f} µs")
        # 0 ms first: what the way through the queue and the emulator costs a packet with no hold at all
        # (the kernel's queueing to userspace, the emulator's wake-up, the verdict and the reinjection);
        # p99_vs_p99: the shaped RTT's p99 against the unshaped one's, what the emulator adds to the tail
        print(
            "delay_ms  median_err_us  p99_err_us  max_err_us  p99_vs_p99_us  "
            "(UDP echo RTT - unshaped median RTT - delay)"
        )
        for delay in [0.0, *(d for d in args.delays if d != 0)]:
            set_delay(work, delay)
            rtts = echo_rtts_us(ADDRESSES["main"], args.pings, 0.01)
            errors = [r - baseline - delay * 1000 for r in rtts]
            tail = percentile(rtts, 99) - base_p99 - delay * 1000
            print(
                f"{delay:8g}  {statistics.median(errors):13.1f}  {percentile(errors, 99):10.1f}  "
                f"{max(errors):10.1f}  {tail:13.1f}  ({len(rtts)}/{args.pings} replies)"
                + ("  <- the queue's path alone" if delay == 0 else "")
            )
        for name, p in (("loss1", 0.01), ("loss10", 0.10)):
            received, _ = ping(ADDRESSES[name], args.loss_packets, "0.001")
            lost = args.loss_packets - received
            low, high = binomial(args.loss_packets, p)
            inside = "within" if low <= lost <= high else "OUTSIDE"
            print(
                f"loss {p:.0%}: {lost}/{args.loss_packets} lost, {inside} the binomial ±3 sd [{low:.0f}, {high:.0f}]"
            )
        if correlated:
            losses = numbered_losses(
                [case[0] for case in correlated], args.loss_packets, 0.0002 * len(correlated)
            )
            print(
                "correlated loss (netem's loss P% C%): datagrams lost, rate, expected_loss, mean / longest run"
            )
            for address, _, p, c in correlated:
                lost, runs = losses[address], runs_of(losses[address])
                expected = expected_loss(p / 100, c / 100) if c <= 95 else float("nan")
                mean_run = sum(runs) / len(runs) if runs else 0.0
                print(
                    f"  P {p:g} % C {c:g} %: {sum(lost)}/{len(lost)} lost, {sum(lost) / len(lost):.4%} "
                    f"(expected {expected:.4%}), mean run {mean_run:.2f}, longest {max(runs, default=0)}"
                )
        rtts = [r / 1000 for r in echo_rtts_us(ADDRESSES["jitter"], args.jitter_pings, 0.02)]
        asked = 5 / math.sqrt(3)
        sd = statistics.stdev(rtts) if len(rtts) > 1 else float("nan")
        print(f"jitter 20 ms ± 5 ms: RTT sd {sd:.3f} ms, asked {asked:.3f} ms ({(sd / asked - 1) * 100:+.1f} %), "
              f"mean {statistics.mean(rtts):.3f} ms")  # fmt: skip
        set_delay(work, 0)
        shaped = iperf3_mbit(ADDRESSES["main"], args.seconds)
        plain = iperf3_mbit(ADDRESSES["plain"], args.seconds)
        print(f"TCP at 0 ms: {shaped:.0f} Mbit/s through the emulator, {plain:.0f} Mbit/s unshaped")
        set_delay(work, 1)
        before, started = cpu_s(emulator.pid), time.monotonic()
        udp_stream(ADDRESSES["main"], args.rate, args.seconds)
        time.sleep(0.1)
        used, wall = cpu_s(emulator.pid) - before, time.monotonic() - started
        per_k = used / wall / (args.rate / 1000) * 100
        print(
            f"emulator CPU: {used / wall * 100:.1f} % of a core at {args.rate} packets/s = "
            f"{per_k:.1f} % per 1000 packets/s"
        )
    finally:
        echo.kill()
        echo.wait(timeout=10)
        emulator.terminate()
        emulator.wait(timeout=10)
        teardown()
    stats: dict[str, Any] = json.loads((work / "results" / "link_emulator.json").read_text())
    for profile in stats["profiles"]:
        counts = [row["packets"] for row in profile["error_histogram"]]
        print(
            f"emulator histogram {profile['name']}: {profile['released']} released, actual - scheduled "
            f"p50 <= {quantile_upto_us(counts, 0.5)} µs, p99 <= {quantile_upto_us(counts, 0.99)} µs, "
            f"max {profile['max_error_us']} µs; dropped for loss {profile['dropped_loss']} "
            f"in {profile['loss_bursts']} runs (longest {profile['longest_loss_burst']})"
        )
    print(f"kernel queue counters: {stats['kernel']}, socket overflows {stats['socket_overflows']}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
