"""Correlated loss for real: the link emulator behind NFQUEUE drops numbered UDP datagrams between two
network namespaces as netem's ``loss P% C%`` would, and the receiver sees its runs of losses.

Three destinations, one queue each (seeded: the same draws on every run): 10 % loss with a 50 %
correlation (the issue's case), 50 % independent and 50 % with a 50 % correlation. netem's
correlated draw narrows around 1/2 (``dit.device.link_emulator``), so 10 % with C = 50 % loses far
less than 10 % (``expected_loss``: 0.11 %), while at 50 % the mean stays and the runs of losses
grow (mean run 2.8 against 2.0). Every loss on the wire is one the emulator counted, none a full
queue's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dit.device.link_emulator import expected_loss
from dit.devtools.datagrams import receiver_script, sender_script

REPO = Path(__file__).resolve().parents[2]
NET = "10.206.0"
PORT = 7009
PACKETS = 3000  # per destination
CASES = {  # address -> (queue, loss %, correlation %)
    f"{NET}.2": (3201, 10.0, 50.0),
    f"{NET}.3": (3202, 50.0, 0.0),
    f"{NET}.4": (3203, 50.0, 50.0),
}


def _skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, iptables, NFQUEUE)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/proc/net/netfilter").is_dir():
        return "no nfnetlink here"
    return None


SKIP = _skip()
pytestmark = [pytest.mark.root, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

RECEIVER = receiver_script(PORT)
SENDER = sender_script(PORT)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str, str]]:
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b, dev, peer = f"ditloss{tag}a", f"ditloss{tag}b", f"dls{tag}a", f"dls{tag}b"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", ns_a)
    ip("netns", "add", ns_b)
    try:
        ip("link", "add", dev, "type", "veth", "peer", "name", peer)
        ip("link", "set", dev, "netns", ns_a)
        ip("link", "set", peer, "netns", ns_b)
        ip("-n", ns_a, "addr", "add", f"{NET}.1/24", "dev", dev)
        for address in CASES:
            ip("-n", ns_b, "addr", "add", f"{address}/24", "dev", peer)
        for ns, link in ((ns_a, dev), (ns_b, peer)):
            ip("-n", ns, "link", "set", link, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield ns_a, ns_b, dev
    finally:
        subprocess.run(["ip", "netns", "del", ns_a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns_b], capture_output=True)


def _runs(received: set[int], count: int) -> tuple[int, float]:
    """Lost datagrams and the mean length of their runs (consecutive sequence numbers)."""
    lost = [i not in received for i in range(count)]
    runs = sum(1 for i, gone in enumerate(lost) if gone and (i == 0 or not lost[i - 1]))
    return sum(lost), (sum(lost) / runs if runs else 0.0)


def test_correlated_loss_drops_runs_of_datagrams_as_netem_s_draw_does(
    namespaces: tuple[str, str, str], tmp_path: Path
) -> None:
    ns_a, ns_b, dev = namespaces
    ipt = ["ip", "netns", "exec", ns_a, "iptables", "-w", "-t", "mangle"]
    chain = "DIT-0000000c0aa1"
    subprocess.run([*ipt, "-N", chain], check=True)
    for address, (queue, _, _) in CASES.items():
        subprocess.run([*ipt, "-A", chain, "-d", f"{address}/32", "-j", "NFQUEUE", "--queue-num", str(queue)],
                       check=True)  # fmt: skip
    subprocess.run([*ipt, "-I", "POSTROUTING", "1", "-o", dev, "-j", chain], check=True)
    config = {
        "run_id": "loss-test", "host": "device1", "seed": 31, "results_dir": str(tmp_path / "results"),
        "ready_file": str(tmp_path / "ready"), "realtime": False,
        "queues": [
            {"queue": q, "name": address, "loss_pct": loss, "loss_correlation_pct": corr}
            for address, (q, loss, corr) in CASES.items()
        ],
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "DIT_RUN_ID": "loss-test"}
    emulator = subprocess.Popen(
        ["ip", "netns", "exec", ns_a, sys.executable, "-m", "dit.device", "link-emulator",
         "--config", str(tmp_path / "config.json")], env=env,
    )  # fmt: skip
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", ns_b, sys.executable, "-c", RECEIVER, *CASES],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(200):
            if (tmp_path / "ready").exists():
                break
            time.sleep(0.05)
        assert (tmp_path / "ready").exists(), "the link emulator did not bind its queues"
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        started = time.monotonic()
        subprocess.run(
            ["ip", "netns", "exec", ns_a, sys.executable, "-c", SENDER, str(PACKETS), "0.0005", *CASES],
            check=True, timeout=60,
        )  # fmt: skip
        out, _ = receiver.communicate("", timeout=30)
        elapsed = time.monotonic() - started
    finally:
        if receiver.poll() is None:
            receiver.kill()
        emulator.terminate()
        emulator.wait(timeout=10)
    got = {address: set(seqs) for address, seqs in json.loads(out.splitlines()[-1]).items()}
    stats = json.loads((tmp_path / "results" / "link_emulator.json").read_text())
    profiles = {p["name"]: p for p in stats["profiles"]}
    measured = {address: _runs(got[address], PACKETS) for address in CASES}
    print(f"{3 * PACKETS} datagrams in {elapsed:.1f} s; lost, mean run: {measured}")

    # Every loss on the wire is one the emulator drew: nothing lost to a full queue or socket.
    for address, (lost, _) in measured.items():
        assert profiles[address]["packets"] == PACKETS and profiles[address]["dropped_loss"] == lost
    assert stats["socket_overflows"] == 0
    assert all(c["queue_dropped"] == 0 and c["user_dropped"] == 0 for c in stats["kernel"].values())

    # 10 % with C = 50 %: netem's draw loses about 0.11 %, not 10 % (about 3 of 3000); the bound is five
    # standard deviations of a count whose runs are short (binomial, variance doubled for the runs).
    lost, _ = measured[f"{NET}.2"]
    expected = expected_loss(0.10, 0.50) * PACKETS
    assert abs(lost - expected) <= 5 * math.sqrt(2 * expected) + 1, (lost, expected)
    assert lost < 0.02 * PACKETS  # far below the 300 an independent 10 % would lose

    # 50 %: the mean loss stays; independent runs average 1 / (1 - P) = 2, correlated ones clearly more
    # (2.8 expected; the mean of ~500 runs has a standard error near 0.1).
    for address in (f"{NET}.3", f"{NET}.4"):
        lost, _ = measured[address]
        assert abs(lost - PACKETS / 2) <= 5 * math.sqrt(PACKETS / 4 * 2 * 3), (address, lost)
    independent, correlated = measured[f"{NET}.3"][1], measured[f"{NET}.4"][1]
    assert abs(independent - 2.0) < 0.35 and correlated > independent + 0.4, (independent, correlated)
    assert profiles[f"{NET}.4"]["mean_loss_burst"] == pytest.approx(correlated)
