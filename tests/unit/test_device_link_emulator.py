"""The userspace link emulator's pure parts: nfnetlink_queue messages, the release schedule, verdicts."""

from __future__ import annotations

import random
import select
import socket
import struct
from pathlib import Path

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
