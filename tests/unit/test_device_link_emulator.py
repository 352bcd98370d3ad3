"""The userspace link emulator's pure parts: nfnetlink_queue messages, the release schedule, verdicts."""

from __future__ import annotations

import math
import random
import select
import socket
import struct
from pathlib import Path

import pytest

from dit.device import link_emulator as le


def _profile(
    delay_ms: float = 20.0, jitter_ms: float = 0.0, loss_pct: float = 0.0, queue: int = 7
) -> le.Profile:
    return le.Profile(
        "main", queue, round(delay_ms * 1e6), round(jitter_ms * 1e6), loss_pct / 100, random.Random(1)
    )


def _ipv4(src: str, dst: str, sport: int, dport: int, proto: int = 17) -> bytes:
    header = bytes([0x45, 0, 0, 28, 0, 0, 0, 0, 64, proto, 0, 0])
    return (
        header + socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!HH", sport, dport) + b"\0" * 4
    )


def _packet_message(queue: int, packet_id: int, payload: bytes) -> bytes:
    attrs = le.attr(le.NFQA_PACKET_HDR, struct.pack("!IHB", packet_id, 0x0800, 4)) + le.attr(
        le.NFQA_PAYLOAD, payload
    )
    return le.message(le.NFQNL_MSG_PACKET, queue, attrs, flags=0)


def test_config_binds_the_queue_with_fail_open_off_and_gso_on() -> None:
    bind, params = le.config_messages(300, 5000, seq=1)
    length, kind, flags, seq, _ = le.NLMSG_HDR.unpack_from(bind)
    assert (length, kind, flags, seq) == (len(bind), (3 << 8) | 2, le.NLM_F_REQUEST | le.NLM_F_ACK, 1)
    assert le.NFGEN_HDR.unpack_from(bind, 16) == (socket.AF_UNSPEC, 0, 300)
    # NFQA_CFG_CMD: command BIND, pad, pf AF_INET
    assert bind[20:28] == struct.pack("=HH", 8, le.NFQA_CFG_CMD) + struct.pack("!BxH", 1, socket.AF_INET)
    body = params[20:]
    # NFQA_CFG_PARAMS: packed be32 copy_range + u8 copy_mode (9 bytes, padded to 12)
    assert body[:12] == struct.pack("=HH", 9, le.NFQA_CFG_PARAMS) + struct.pack("!IB", 64, 2) + b"\0\0\0"
    assert body[12:20] == struct.pack("=HH", 8, le.NFQA_CFG_QUEUE_MAXLEN) + struct.pack("!I", 5000)
    mask = struct.unpack("!I", body[24:28])[0]
    flags_value = struct.unpack("!I", body[32:36])[0]
    assert mask & le.NFQA_CFG_F_FAIL_OPEN and not flags_value & le.NFQA_CFG_F_FAIL_OPEN
    assert flags_value & le.NFQA_CFG_F_GSO


def test_verdict_message_layout() -> None:
    msg = le.verdict_message(9, 42, le.NF_DROP)
    assert le.NLMSG_HDR.unpack_from(msg)[:2] == (32, (3 << 8) | 1)
    assert msg[20:] == struct.pack("=HH", 12, le.NFQA_VERDICT_HDR) + struct.pack("!II", 0, 42)
    assert le.NLMSG_HDR.unpack_from(le.verdict_message(9, 42, le.NF_ACCEPT, batch=True))[1] == (3 << 8) | 3


def test_parse_reads_queue_id_payload_and_acks() -> None:
    payload = _ipv4("10.0.0.1", "10.0.0.2", 1000, 2000)
    ack = le.NLMSG_HDR.pack(36, le.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -16) + b"\0" * 16
    packets, errors = le.parse(_packet_message(5, 77, payload) + _packet_message(6, 78, payload[:20]) + ack)
    assert [(p.queue, p.packet_id) for p in packets] == [(5, 77), (6, 78)]
    assert packets[0].payload == payload
    assert errors == [16]


def test_schedule_releases_on_time_and_keeps_flow_order_under_jitter() -> None:
    profile = _profile(delay_ms=10, jitter_ms=8)
    schedule = le.Schedule()
    flow = _ipv4("10.0.0.1", "10.0.0.2", 1, 2)
    other = _ipv4("10.0.0.1", "10.0.0.2", 1, 3)
    for i in range(200):
        schedule.hold(profile, le.Packet(7, i, flow if i % 2 == 0 else other), now_ns=i * 1000)
    released = schedule.pop_all()
    assert len(released) == 200
    for parity in (0, 1):
        order = [pid for _, pid, _, _, _ in sorted(released, key=lambda r: (r[2], r[1])) if pid % 2 == parity]
        assert order == sorted(order)  # within a flow: never reordered
    assert profile.held_for_order > 0  # jitter wider than the spacing: some packets waited for order
    assert all(due - arrival >= intended for _, _, due, arrival, intended in released)
    assert all(2_000_000 <= intended <= 18_000_000 for *_, intended in released)


def test_pop_due_takes_only_what_is_due() -> None:
    profile = _profile(delay_ms=5)
    schedule = le.Schedule()
    schedule.hold(profile, le.Packet(7, 1, b""), now_ns=0)
    schedule.hold(profile, le.Packet(7, 2, b"x"), now_ns=1_000_000)
    assert schedule.next_due() == 5_000_000
    assert [r[1] for r in schedule.pop_due(5_500_000)] == [1]
    assert len(schedule) == 1


def test_verdicts_batch_a_prefix_and_answer_singles_otherwise() -> None:
    pending = {7: {1: None, 2: None, 3: None, 4: None}}
    batch = le.verdicts([(7, 1), (7, 2)], pending)
    assert le.NLMSG_HDR.unpack_from(batch)[1] == (3 << 8) | 3 and len(batch) == 32
    assert struct.unpack("!II", batch[24:32]) == (le.NF_ACCEPT, 2)
    singles = le.verdicts([(7, 4)], pending)
    assert le.NLMSG_HDR.unpack_from(singles)[1] == (3 << 8) | 1
    assert list(pending[7]) == [3]


def test_loss_is_close_to_the_asked_rate() -> None:
    profile = _profile(loss_pct=10)
    lost = sum(profile.lost() for _ in range(10_000))
    assert 880 <= lost <= 1120  # 10 % of 10 000 within four standard deviations (30)


class Scripted(random.Random):
    """A generator whose ``random()`` returns the given values in order."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def test_a_correlated_loss_draw_is_netem_s_recurrence() -> None:
    """netem's ``get_crandom``: a first state drawn fresh, then each draw is C * the previous draw +
    (1 - C) * a fresh one, and the packet is lost when the draw is below the loss."""
    profile = le.Profile("main", 7, 0, 0, 0.3, Scripted([0.125, 0.25, 0.875, 0.0, 0.5]), loss_correlation=0.5)
    # u1 = (0.125 + 0.25) / 2 = 0.1875 lost; u2 = (0.1875 + 0.875) / 2 = 0.53125 kept;
    # u3 = 0.53125 / 2 = 0.265625 lost; u4 = (0.265625 + 0.5) / 2 = 0.3828125 kept
    assert [profile.lost() for _ in range(4)] == [True, False, True, False]
    assert profile._loss_draw == 0.3828125
    # Without a correlation every draw is fresh and nothing else is drawn (the seeded sequence of the
    # independent case is unchanged).
    independent = le.Profile("main", 7, 0, 0, 0.3, Scripted([0.25, 0.875]))
    assert [independent.lost(), independent.lost()] == [True, False]


def _runs(profile: le.Profile, n: int) -> tuple[float, float]:
    """The loss rate and the mean run of consecutive losses over ``n`` draws, counted here."""
    lost = runs = 0
    previous = False
    for _ in range(n):
        now = profile.lost()
        lost += now
        runs += now and not previous
        previous = now
    assert (profile.dropped_loss, profile.loss_bursts) == (0, runs)  # receive() counts the drops
    return lost / n, lost / runs if runs else 0.0


def _bound(rate: float, n: int, mean_run: float) -> float:
    """Five standard deviations of a loss rate over ``n`` correlated draws.

    Binomial, times a variance inflation for the runs: for a two-state Markov chain whose losses come
    in runs of mean L1 and whose kept packets come in runs of mean L0 the count's variance is the
    binomial one times (2 - 1/L1 - 1/L0) / (1/L1 + 1/L0), which is at most 2 * L1. The correlated
    draw's memory fades geometrically (C**k), so the chain is a close model of it; 2 * L1 it is."""
    return 5 * math.sqrt(max(rate * (1 - rate), 1 / n) / n * 2 * max(mean_run, 1.0))


def test_correlated_losses_come_in_longer_runs_and_keep_the_mean_only_at_50_percent() -> None:
    n = 100_000
    runs_at_half = []
    for correlation in (0.0, 0.25, 0.5, 0.75):
        profile = le.Profile(
            "m", 1, 0, 0, 0.5, random.Random(f"half:{correlation}"), loss_correlation=correlation
        )
        rate, mean_run = _runs(profile, n)
        # At 50 % the draws' distribution is symmetric about 1/2 whatever C: the mean loss stays P.
        assert abs(rate - 0.5) <= _bound(0.5, n, mean_run), (correlation, rate)
        runs_at_half.append(mean_run)
        assert profile.longest_loss_burst >= mean_run
    # Independent: runs of mean 1 / (1 - P) = 2; then they grow with C, clearly (measured 2.3, 2.8, 4.0).
    assert abs(runs_at_half[0] - 2.0) < 0.05
    assert runs_at_half[1] > runs_at_half[0] + 0.15
    assert runs_at_half[2] > runs_at_half[1] + 0.25
    assert runs_at_half[3] > runs_at_half[2] + 0.6

    # Below 50 % the draws, narrowed around 1/2, fall under P less often: 10 % loses ~1.75 % with
    # C = 25 % and ~0.11 % with C = 50 %; expected_loss (a convolution, not a simulation) agrees.
    n = 200_000
    for correlation in (0.0, 0.25, 0.5):
        profile = le.Profile(
            "m", 1, 0, 0, 0.1, random.Random(f"tenth:{correlation}"), loss_correlation=correlation
        )
        rate, mean_run = _runs(profile, n)
        expected = le.expected_loss(0.1, correlation)
        assert abs(rate - expected) <= _bound(expected, n, mean_run), (correlation, rate, expected)
    assert le.expected_loss(0.1, 0.0) == 0.1
    assert 0.0170 < le.expected_loss(0.1, 0.25) < 0.0180 and 0.0009 < le.expected_loss(0.1, 0.5) < 0.0013
    assert abs(le.expected_loss(0.5, 0.75) - 0.5) < 1e-4  # symmetric
    assert le.expected_loss(0.9, 0.5) == pytest.approx(1 - le.expected_loss(0.1, 0.5), abs=1e-4)


def test_the_summary_counts_loss_runs_and_a_bad_correlation_is_a_config_error(tmp_path: Path) -> None:
    profile = le.Profile("m", 1, 0, 0, 0.3, Scripted([0.125, 0.25, 0.0, 0.875, 0.875]), loss_correlation=0.5)
    # u = 0.1875, 0.09375 (lost twice), 0.484375, 0.6796875 (kept)
    assert [profile.lost() for _ in range(4)] == [True, True, False, False]
    summary = profile.summary()
    assert summary["loss_correlation_pct"] == 50.0
    assert (summary["loss_bursts"], summary["longest_loss_burst"]) == (1, 2)
    queues = [{"queue": 5, "loss_pct": 10, "loss_correlation_pct": 150}]
    with pytest.raises(le.ConfigError, match=r"queues\[0\]\.loss_correlation_pct: 150 is outside 0..100"):
        le._profiles({"queues": queues})
    (parsed,) = le._profiles({"queues": [{"queue": 5, "loss_pct": 10, "loss_correlation_pct": 25}]})
    assert (parsed.loss, parsed.loss_correlation) == (0.1, 0.25)


def test_histogram_buckets_and_quantiles() -> None:
    profile = _profile()
    profile.record(20_000_000, 20_000_000, 20_000_005)  # 5 µs late
    profile.record(20_000_000, 20_000_000, 20_150_000)  # 150 µs late
    summary = profile.summary()
    counts = [row["packets"] for row in summary["error_histogram"]]
    assert counts[le.bucket(5_000)] == 1 and counts[le.bucket(150_000)] == 1
    assert summary["max_error_us"] == 150.0
    assert le.quantile_upto_us(counts, 0.5) == 10 and le.quantile_upto_us(counts, 0.99) == 200


def test_a_control_socket_deeper_than_an_af_unix_address_still_binds_and_takes_changes(
    tmp_path: Path,
) -> None:
    from dit.device.netem_vary import _send_control

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "link-emulator.sock")
    assert len(path) > 108
    ctl = le._control_socket(path)
    assert ctl is not None
    try:
        assert _send_control(path, 12.5) == (True, "")
        main = _profile(delay_ms=1)
        changes: list[tuple[int, float]] = []
        select.select([ctl], [], [], 1)
        le._control(ctl, main, changes)
        assert main.delay_ns == 12_500_000 and [d for _, d in changes] == [12.5]
    finally:
        ctl.close()


CFG = {"seed": 7, "device": "device1"}


def test_a_hand_over_counts_afresh_and_draws_as_a_new_emulator_would() -> None:
    """A sweep's next variant keeps the emulator running: from its hand-over the counters start at zero
    and the loss draws repeat those of a new emulator seeded alike; the kernel's drops count from then."""
    fresh = le.Profile("main", 0, 5_000_000, 0, 0.3, le.profile_rng(CFG, "main"), loss_correlation=0.2)
    expected = [fresh.lost() for _ in range(200)]
    running = le.Profile("main", 0, 5_000_000, 0, 0.3, le.profile_rng(CFG, "main"), loss_correlation=0.2)
    for _ in range(77):  # the variant before
        running.packets += 1
        running.lost()
    running.record(5_000_000, 5_000_000, 5_100_000)
    running.begin_segment(le.profile_rng(CFG, "main"))
    summary = running.summary()
    assert (summary["packets"], summary["dropped_loss"], summary["released"], summary["max_error_us"]) == (
        0,
        0,
        0,
        None,
    )
    assert sum(row["packets"] for row in summary["error_histogram"]) == 0
    assert [running.lost() for _ in range(200)] == expected
    kernel = {"0": {"waiting": 3, "queue_dropped": 10, "user_dropped": 4}}
    base = {"0": {"waiting": 9, "queue_dropped": 7, "user_dropped": 4}}
    assert le.since(kernel, base) == {"0": {"waiting": 3, "queue_dropped": 3, "user_dropped": 0}}
    assert le.since({"error": "no file"}, {}) == {"error": "no file"}
