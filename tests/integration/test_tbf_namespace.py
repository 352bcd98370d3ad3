"""Rate shaping for real: two network namespaces joined by a veth pair, the netem role applied
through Ansible (builder -> role -> journaled dit_tc), iperf3 across, teardown from the journal.

This kernel has no sch_netem, so the profiles here are rate-only: a root tbf (one cap) and an htb
tree with u32 filters (a cap per destination). Every test snapshots the interface's tc state
(``tc -j qdisc show``, ``tc -d class show``, ``tc filter show``) before apply and after teardown and
asserts they are equal, with and without a qdisc of its own there before, and after a failure in
the middle of apply.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dit.conditions import HostContext
from dit.conditions.netem import build
from dit.run.ansible_exec import ansible_env
from dit.run.journal import Journal
from dit.scenario import loads

REPO = Path(__file__).resolve().parents[2]
PORT = 5201  # inside fresh namespaces: nothing else listens there


def _netns_works() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc", "iperf3"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"ditprobe{os.getpid()}"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"ip netns does not work here: {proc.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


SKIP = _netns_works()
# serial: the rates are measured with iperf3 (./dev test runs these alone, after the parallel pass)
pytestmark = [pytest.mark.root, pytest.mark.serial, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


@dataclass
class Link:
    ns_a: str  # the "device": its veth end is shaped
    ns_b: str  # the far end (iperf3 server)
    dev: str
    peer: str
    addresses: tuple[str, ...]  # of ns_b


@pytest.fixture
def link() -> Iterator[Link]:
    tag = f"{os.getpid() % 100000}"
    ln = Link(f"dittbf{tag}a", f"dittbf{tag}b", f"dtb{tag}a", f"dtb{tag}b", ("10.203.0.2", "10.203.0.3"))

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", ln.ns_a)
    ip("netns", "add", ln.ns_b)
    try:
        ip("link", "add", ln.dev, "type", "veth", "peer", "name", ln.peer)
        ip("link", "set", ln.dev, "netns", ln.ns_a)
        ip("link", "set", ln.peer, "netns", ln.ns_b)
        ip("-n", ln.ns_a, "addr", "add", "10.203.0.1/24", "dev", ln.dev)
        for address in ln.addresses:
            ip("-n", ln.ns_b, "addr", "add", f"{address}/24", "dev", ln.peer)
        for ns, dev in ((ln.ns_a, ln.dev), (ln.ns_b, ln.peer)):
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield ln
    finally:
        subprocess.run(["ip", "netns", "del", ln.ns_a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ln.ns_b], capture_output=True)


def snapshot(ln: Link) -> tuple[Any, str, str]:
    def tc(*args: str) -> str:
        return subprocess.run(["tc", "-n", ln.ns_a, *args], check=True, capture_output=True, text=True).stdout

    qdiscs = json.loads(tc("-j", "qdisc", "show", "dev", ln.dev))
    for qdisc in qdiscs:
        # A counter, not configuration: packets htb sent straight through (an IPv6 router
        # solicitation on the freshly raised veth is enough to move it).
        qdisc.get("options", {}).pop("direct_packets_stat", None)
    roots = [q["handle"] for q in qdiscs if q.get("root")]
    filters = "".join(tc("filter", "show", "dev", ln.dev, "parent", r) for r in roots if r != "0:")
    return qdiscs, tc("-d", "class", "show", "dev", ln.dev), filters


def variables(ln: Link, network: str) -> dict[str, Any]:
    (scenario,) = loads(f"name: tbf\nmodel: fake\ndevices: [device1]\nnetwork:\n  device1: {network}\n")
    ctx = HostContext(
        "device1", "device", False, "tbf-test", "/nonexistent", "/", "edge", "10.203.0.2",
        {"dit_inference_interface": ln.dev, "dit_netns": ln.ns_a},
    )  # fmt: skip
    built = build(scenario, "device1", ctx)
    assert built is not None
    return built


def playbook(tmp: Path, name: str, tasks: str, extra: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    book = tmp / f"{name}.yml"
    book.write_text(f"- hosts: localhost\n  gather_facts: false\n  tasks:\n{tasks}", encoding="utf-8")
    vars_file = tmp / f"{name}-vars.json"
    vars_file.write_text(json.dumps(extra), encoding="utf-8")
    env = {**os.environ, **ansible_env(), "ANSIBLE_ROLES_PATH": str(REPO / "roles")}
    bindir = Path(sys.executable).parent
    return subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{vars_file}", str(book)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def apply(tmp: Path, built: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    tasks = "    - ansible.builtin.include_role:\n        name: netem\n"
    return playbook(tmp, "apply", tasks, {**built, "dit_journal_path": str(tmp / "journal.jsonl")})


def teardown(tmp: Path, ln: Link) -> None:
    journal = Journal(tmp / "journal.jsonl")
    records = journal.pending_by_host().get("localhost", [])
    tasks = (
        "    - dit_restore:\n        run_id: tbf-test\n        host: localhost\n"
        "        records: '{{ dit_records }}'\n        interfaces: '{{ dit_interfaces }}'\n"
    )
    shaped = [{"dev": ln.dev, "netns": ln.ns_a, "log": ""}]  # the undo scope: tc only on this link
    proc = playbook(tmp, "teardown", tasks, {"dit_records": records, "dit_interfaces": shaped})
    assert proc.returncode == 0, proc.stdout[-3000:]


def iperf3_mbit(ln: Link, address: str, seconds: int = 3) -> float:
    server = subprocess.Popen(
        ["ip", "netns", "exec", ln.ns_b, "iperf3", "-s", "-1", "-B", address, "-p", str(PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            probe = subprocess.run(
                ["ip", "netns", "exec", ln.ns_b, "ss", "-Hltn", f"sport = :{PORT}"],
                capture_output=True,
                text=True,
            )
            if probe.stdout.strip():
                break
            time.sleep(0.05)
        client = subprocess.run(
            ["ip", "netns", "exec", ln.ns_a, "iperf3", "-c", address, "-p", str(PORT), "-t", str(seconds), "-J"],
            capture_output=True, text=True, timeout=seconds + 30,
        )  # fmt: skip
        doc = json.loads(client.stdout)
        assert "error" not in doc, doc.get("error")
        return float(doc["end"]["sum_received"]["bits_per_second"]) / 1e6
    finally:
        server.wait(timeout=10) if server.poll() is not None else server.kill()
        server.wait(timeout=10)


def test_a_rate_only_profile_caps_throughput_with_tbf_and_teardown_restores_it(
    link: Link, tmp_path: Path
) -> None:
    before = snapshot(link)
    assert before[0][0]["handle"] == "0:"  # the kernel's default root
    built = variables(link, "{rate_mbit: 10}")
    assert [o["argv"][4:] for o in built["netem_tree"]] == [
        ["replace", "dev", link.dev, "root", "handle", "1:", "tbf", "rate", "10mbit", "burst", "12500",
         "latency", "50ms"],
    ]  # fmt: skip
    proc = apply(tmp_path, built)
    assert proc.returncode == 0, proc.stdout[-3000:]
    shaped = snapshot(link)[0]
    assert [(q["kind"], q["handle"], q["options"]["rate"]) for q in shaped] == [("tbf", "1:", 1_250_000)]
    # A second apply finds the tree in place and changes nothing.
    again = apply(tmp_path, built)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-2000:]
    measured = iperf3_mbit(link, link.addresses[0])
    print(f"tbf cap 10 Mbit/s: iperf3 measured {measured:.2f} Mbit/s (TCP goodput)")
    assert 8.0 <= measured <= 10.5
    teardown(tmp_path, link)
    assert snapshot(link) == before


def test_per_destination_caps_with_htb_and_u32(link: Link, tmp_path: Path) -> None:
    before = snapshot(link)
    built = variables(link, "{rate_mbit: 20, destinations: {10.203.0.2: {rate_mbit: 5}}}")
    proc = apply(tmp_path, built)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "match 0acb0002/ffffffff at 16" in snapshot(link)[2]
    capped = iperf3_mbit(link, link.addresses[0], seconds=2)
    default = iperf3_mbit(link, link.addresses[1], seconds=2)
    print(
        f"htb per destination: 5 Mbit/s class measured {capped:.2f}, 20 Mbit/s default {default:.2f} Mbit/s"
    )
    assert 4.0 <= capped <= 5.3
    assert 16.0 <= default <= 21.0
    teardown(tmp_path, link)
    assert snapshot(link) == before


def test_a_prior_qdisc_of_its_own_is_put_back_exactly(link: Link, tmp_path: Path) -> None:
    def tc(*args: str) -> None:
        subprocess.run(["tc", "-n", link.ns_a, *args], check=True, capture_output=True)

    tc("qdisc", "add", "dev", link.dev, "root", "handle", "7:", "htb", "default", "3")
    tc("class", "add", "dev", link.dev, "parent", "7:", "classid", "7:3", "htb", "rate", "7mbit")
    tc("qdisc", "add", "dev", link.dev, "parent", "7:3", "handle", "30:", "pfifo", "limit", "77")
    tc("filter", "add", "dev", link.dev, "parent", "7:", "protocol", "ip", "prio", "4", "u32",
       "match", "ip", "dst", "10.203.0.3/32", "flowid", "7:3")  # fmt: skip
    before = snapshot(link)
    proc = apply(tmp_path, variables(link, "{rate_mbit: 10}"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [q["kind"] for q in snapshot(link)[0]] == ["tbf"]
    teardown(tmp_path, link)
    assert snapshot(link) == before


def test_a_failure_in_the_middle_of_apply_is_undone_from_the_journal(link: Link, tmp_path: Path) -> None:
    subprocess.run(
        [
            "tc",
            "-n",
            link.ns_a,
            "qdisc",
            "add",
            "dev",
            link.dev,
            "root",
            "handle",
            "5:",
            "pfifo",
            "limit",
            "55",
        ],
        check=True,
    )
    before = snapshot(link)
    built = variables(link, "{rate_mbit: 20, destinations: {10.203.0.2: {rate_mbit: 5}}}")
    # The destination's class cannot be created (its class id is taken): the root and the default
    # class are already in place when it fails.
    third = built["netem_tree"][2]
    assert third["id"] == "1:11"
    third["argv"] = [a if a != "1:11" else "1:1" for a in third["argv"]]
    proc = apply(tmp_path, built)
    assert proc.returncode != 0 and "File exists" in proc.stdout, proc.stdout[-3000:]
    assert [q["kind"] for q in snapshot(link)[0]] == ["htb"]  # half applied
    teardown(tmp_path, link)
    assert snapshot(link) == before


def _ping(ln: Link, address: str, count: int, interval: str) -> tuple[int, list[float]]:
    """``(replies, rtts_ms)`` of ``count`` pings from the shaped namespace."""
    proc = subprocess.run(
        ["ip", "netns", "exec", ln.ns_a, "ping", "-n", "-c", str(count), "-i", interval, "-W", "1", address],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    rtts = [
        float(w.split("=")[1])
        for line in proc.stdout.splitlines()
        for w in line.split()
        if w.startswith("time=")
    ]
    return len(rtts), rtts


def _chains(ln: Link) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ln.ns_a, "iptables", "-w", "-t", "mangle", "-S"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


@pytest.mark.skipif(shutil.which("iptables") is None, reason="iptables is not installed")
def test_the_userspace_backend_delays_and_drops_per_destination_fails_closed_and_is_undone(
    link: Link, tmp_path: Path
) -> None:
    """No sch_netem here: the link emulator behind NFQUEUE applies a 20 ms delay towards one address,
    10 % loss towards another, a square-wave delay (netem-vary through its control socket) to the
    rest, and leaves a rate-only destination alone; killed, it drops (fail closed); the journal
    replay removes the rules, the tc tree and the processes, and refuses a record for a chain
    outside the run."""
    from dit.conditions import PreflightFacts
    from dit.conditions.netem import resolve
    from dit.device.build import build_zipapp

    before = snapshot(link)
    unshaped, varying = "10.203.0.4", "10.203.0.5"
    for address in (unshaped, varying):
        subprocess.run(["ip", "-n", link.ns_b, "addr", "add", f"{address}/24", "dev", link.peer], check=True)
    # The main profile's delay is a square wave (5 / 30 ms, 1 s period) driven by netem-vary; the
    # unshaped address is a rate-only destination (a RETURN rule and an htb class, no queue).
    network = (
        "{variation: {kind: square, low_ms: 5, high_ms: 30, period_s: 1}, destinations: {10.203.0.2: "
        "{delay_ms: 20}, 10.203.0.3: {loss_pct: 10}, 10.203.0.4: {rate_mbit: 1000}}}"
    )
    (scenario,) = loads(f"name: ns\nmodel: fake\ndevices: [device1]\nnetwork:\n  device1: {network}\n")
    node_root = tmp_path / "node"
    (node_root / "results").mkdir(parents=True)
    build_zipapp(node_root / "dit-device.pyz")
    ctx = HostContext(
        "device1", "device", False, "ns-test", str(node_root), "/", "edge", "10.203.0.2",
        {"dit_inference_interface": link.dev, "dit_netns": link.ns_a},
    )  # fmt: skip
    built = build(scenario, "device1", ctx)
    assert built is not None
    nodes = {"device1": {"netem": {"available": False}, "nfqueue": {"available": True}}}
    facts = PreflightFacts(scenario, nodes, {"device1": {"netem": built}}, {}, local=False)
    variables = resolve(facts)["device1"]
    assert variables["netem_backend"] == "userspace"
    assert {o["expect"]["kind"] for o in variables["netem_tree"]} == {"htb", "u32"}  # the rate part only
    plan = variables["netem_userspace"]
    extra = {
        **variables, "dit_journal_path": str(tmp_path / "journal.jsonl"), "dit_run_id": "ns-test",
        "dit_node_root": str(node_root), "dit_python": sys.executable,
    }  # fmt: skip
    proc = playbook(tmp_path, "apply", "    - ansible.builtin.include_role:\n        name: netem\n", extra)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"-A POSTROUTING -o {link.dev} -j {plan['chain']}" in _chains(link)
    again = playbook(tmp_path, "apply", "    - ansible.builtin.include_role:\n        name: netem\n", extra)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]  # idempotent
    ready = json.loads((node_root / "link-emulator.ready").read_text())
    print(f"link emulator: SCHED_FIFO {ready['sched_fifo']}, mlockall {ready['mlockall']}")

    replies, delayed = _ping(link, "10.203.0.2", 20, "0.05")
    _, direct = _ping(link, unshaped, 5, "0.05")
    lossy, _ = _ping(link, "10.203.0.3", 400, "0.005")
    _, square = _ping(link, varying, 60, "0.04")  # 2.4 s: both halves of the wave, at least twice
    delayed.sort()
    print(f"userspace 20 ms: ping min {delayed[0]:.3f} median {delayed[10]:.3f} ms; unshaped max {max(direct):.3f} ms;"
          f" 10 % loss: {400 - lossy}/400 lost")  # fmt: skip
    assert replies == 20 and delayed[0] >= 20.0  # every reply held at least the delay
    assert delayed[10] < 35.0  # not a timing check: catches a delay applied twice
    assert max(direct) < 20.0  # per destination only: another address is not delayed
    assert 12 <= 400 - lossy <= 72  # 10 % of 400 within about 4.7 standard deviations (6)
    print(f"square 5/30 ms: {sum(r < 20 for r in square)} pings low, {sum(r >= 30 for r in square)} high")
    assert min(square) >= 5.0 and any(r < 20 for r in square) and any(r >= 30 for r in square)
    changes = (node_root / "results" / "netem_changes.csv").read_text().splitlines()
    assert len(changes) >= 3 and all(line.split(",")[3] == "1" for line in changes[1:])  # every step ok

    # Fail closed: with the emulator gone, the shaped traffic is dropped, never passed undelayed.
    pid = int(
        subprocess.run(["pgrep", "-f", "link-emulator.json"], capture_output=True, text=True).stdout.split()[
            0
        ]
    )
    os.kill(pid, 9)
    time.sleep(0.2)
    assert _ping(link, "10.203.0.2", 3, "0.1")[0] == 0
    # killed: its last snapshot says running, never stopped (collect's process check names it failed)
    assert json.loads((node_root / "results" / "link_emulator.json").read_text())["state"] == "running"

    # The journal replay (teardown, dit cleanup) with the run's scope, plus a record outside the run.
    journal = Journal(tmp_path / "journal.jsonl")
    foreign = {"op": "command", "undo": {"argv": ["ip", "netns", "exec", link.ns_a, "iptables", "-w", "-t",
                                                  "mangle", "-X", "DIT-ffffffffffff"]}}  # fmt: skip
    records = [foreign, *journal.pending_by_host().get("localhost", [])]
    tasks = (
        "    - dit_restore:\n        run_id: ns-test\n        host: localhost\n"
        "        records: '{{ dit_records }}'\n        interfaces: '{{ dit_interfaces }}'\n"
        "      register: restored\n      ignore_errors: true\n"
    )
    scope = [{"dev": link.dev, "netns": link.ns_a, "log": "", "chain": plan["chain"]}]
    restore = playbook(tmp_path, "teardown", tasks, {"dit_records": records, "dit_interfaces": scope})
    # The foreign record fails the task (named, nothing done for it); every record of the run is undone.
    assert "DIT-ffffffffffff is not the chain this run installed" in restore.stdout, restore.stdout[-3000:]
    assert "1 journal record(s) refused" in restore.stdout
    assert "DIT-" not in _chains(link)
    assert subprocess.run(["pgrep", "-f", "link-emulator.json"], capture_output=True).returncode == 1
    assert (
        subprocess.run(["pgrep", "-f", str(node_root / "netem-vary.json")], capture_output=True).returncode
        == 1
    )
    assert snapshot(link) == before  # the rate part's htb tree is gone too
    assert _ping(link, "10.203.0.2", 3, "0.1")[1] and max(_ping(link, "10.203.0.2", 3, "0.1")[1]) < 20.0
