"""The rpc-server's TCP bytes from the kernel's sock_diag counters: on real sockets of this machine, and
the netlink parsing on crafted answers (an error, a socket without tcp_info, no netlink at all)."""

from __future__ import annotations

import errno
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from dit_llamacpp import sockdiag  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag is Linux's")


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    yield server
    server.close()


def _exchange(server: socket.socket, upload: int, answer: int) -> tuple[socket.socket, socket.socket]:
    """A client of ``server`` sends ``upload`` bytes, the accepted socket reads them all and answers with
    ``answer`` bytes, which the client reads; both stay open."""
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    sender = threading.Thread(target=client.sendall, args=(b"u" * upload,))
    sender.start()
    got = 0
    while got < upload:
        got += len(accepted.recv(1 << 16))
    sender.join()
    accepted.sendall(b"a" * answer)
    got = 0
    while got < answer:
        got += len(client.recv(1 << 16))
    return client, accepted


def _until(traffic: sockdiag.PortTraffic, acked: int, received: int) -> dict[str, int | str]:
    """Sample until the counters reach the figures (a delayed ACK may lag the data by ~40 ms)."""
    deadline = time.monotonic() + 5
    while True:
        row = traffic.sample()
        reached = int(row.get("tcp_acked", 0)) >= acked and int(row.get("tcp_received", 0)) >= received
        if reached or time.monotonic() > deadline:
            return row
        time.sleep(0.02)


def test_the_server_port_s_bytes_are_counted_and_a_closed_connection_keeps_counting(
    listener: socket.socket,
) -> None:
    port = listener.getsockname()[1]
    traffic = sockdiag.PortTraffic(port, "127.0.0.1")
    assert traffic.sample() == {
        "tcp_acked": 0, "tcp_received": 0, "tcp_sockets": 0, "tcp_final": 0, "tcp_sent": 0
    }  # fmt: skip
    upload, answer = 3_000_000, 70_000
    client, accepted = _exchange(listener, upload, answer)
    row = _until(traffic, answer, upload)
    # the server socket received the upload and sent the answer; the listener itself is not counted
    assert int(row["tcp_received"]) >= upload and int(row["tcp_acked"]) >= answer
    assert int(row["tcp_received"]) < upload + 100 and int(row["tcp_acked"]) < answer + 100
    assert row["tcp_sockets"] == 1 and int(row["tcp_sent"]) >= answer
    # a second connection adds to the first; once both are closed their last counters still count
    second, second_accepted = _exchange(listener, 5000, 0)
    row = _until(traffic, answer, upload + 5000)
    assert int(row["tcp_received"]) >= upload + 5000 and row["tcp_sockets"] == 2
    # bytes moved after the last sample, just before the close, count too (the kernel's destroy notice)
    client.sendall(b"l" * 7000)
    got = 0
    while got < 7000:
        got += len(accepted.recv(1 << 16))
    for s in (client, accepted, second, second_accepted):
        s.close()
    deadline = time.monotonic() + 5
    after = traffic.sample()
    while after["tcp_final"] != 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        after = traffic.sample()
    assert after["tcp_sockets"] == 2 and after["tcp_final"] == 2 and "tcp_final_error" not in after
    # every payload byte, each once (+ at most the two FINs, which take a sequence number)
    assert upload + 5000 + 7000 <= int(after["tcp_received"]) <= upload + 5000 + 7000 + 2
    assert answer <= int(after["tcp_acked"]) <= answer + 2  # + the FINs the peers acknowledged
    traffic.close()


def test_only_the_server_port_is_counted_not_its_clients_or_other_ports(listener: socket.socket) -> None:
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    with other:
        sockets = [*_exchange(other, 200_000, 10), *_exchange(listener, 1000, 10)]
        port = listener.getsockname()[1]
        row = _until(sockdiag.PortTraffic(port, "127.0.0.1"), 10, 1000)
        assert row["tcp_sockets"] == 1 and int(row["tcp_received"]) < 200_000  # not the other port's
        # the client's socket (remote port = the server's) is not the server's: nothing for its own port
        client_port = sockets[2].getsockname()[1]
        assert sockdiag.PortTraffic(client_port, "127.0.0.1").sample()["tcp_sockets"] == 1  # its own only
        assert sockdiag.PortTraffic(port, "127.0.0.2").sample()["tcp_sockets"] == 0  # another address
        for s in sockets:
            s.close()


def _nlmsg(kind: int, payload: bytes, seq: int = 1) -> bytes:
    padded = payload + bytes(-len(payload) % 4)
    return struct.pack("=IHHII", 16 + len(payload), kind, 2, seq, 0) + padded


def _diag(state: int, sport: int, info: bytes | None, cookie: int = 7) -> bytes:
    msg = bytes([socket.AF_INET, state, 0, 0]) + struct.pack(">HH", sport, 40000)
    msg += socket.inet_aton("127.0.0.3") + bytes(12) + socket.inet_aton("127.0.0.1") + bytes(12)
    msg += struct.pack("=III", 0, cookie & 0xFFFFFFFF, cookie >> 32) + struct.pack(
        "=IIIII", 0, 0, 0, 1000, 99
    )
    if info is not None:
        msg += struct.pack("=HH", 4 + len(info), sockdiag.INET_DIAG_INFO) + info
    return msg


def _tcp_info(acked: int, received: int, sent: int | None) -> bytes:
    info = bytearray(232 if sent is not None else 160)
    struct.pack_into("=QQ", info, sockdiag.BYTES_ACKED, acked, received)
    if sent is not None:
        struct.pack_into("=Q", info, sockdiag.BYTES_SENT, sent)
    return bytes(info)


def test_the_dump_is_parsed_field_by_field() -> None:
    data = _nlmsg(sockdiag.SOCK_DIAG_BY_FAMILY, _diag(1, 50052, _tcp_info(10, 20, 11), cookie=(5 << 32) | 9))
    data += _nlmsg(sockdiag.SOCK_DIAG_BY_FAMILY, _diag(1, 50053, _tcp_info(1, 2, None)), seq=2)  # not ours
    sockets, done = sockdiag.parse_messages(data, 1)
    assert not done
    (s,) = sockets
    assert (s.local, s.remote, s.state, s.cookie, s.inode) == (
        ("127.0.0.3", 50052),
        ("127.0.0.1", 40000),
        1,
        (5 << 32) | 9,
        99,
    )
    assert (s.bytes_acked, s.bytes_received, s.bytes_sent) == (10, 20, 11)
    old = sockdiag.parse_socket(_diag(1, 50052, _tcp_info(3, 4, None)))  # a kernel before 4.19
    assert (old.bytes_acked, old.bytes_received, old.bytes_sent) == (3, 4, None)
    assert sockdiag.parse_messages(_nlmsg(sockdiag.NLMSG_DONE, bytes(4)), 1) == ([], True)
    req = sockdiag.request(socket.AF_INET6, 3)
    assert len(req) == 16 + 56 and struct.unpack_from("=IHHI", req) == (72, 20, 0x301, 3)
    assert req[16:20] == bytes([socket.AF_INET6, socket.IPPROTO_TCP, 2, 0])


def test_a_kernel_error_is_raised_with_its_errno() -> None:
    with pytest.raises(sockdiag.SockDiagError, match="refused the dump") as caught:
        sockdiag.parse_messages(_nlmsg(sockdiag.NLMSG_ERROR, struct.pack("=i", -errno.ENOENT) + bytes(16)), 1)
    assert caught.value.errno == errno.ENOENT


def test_no_sock_diag_is_said_in_the_sample_never_a_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_a: object) -> socket.socket:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    monkeypatch.setattr(sockdiag.socket, "socket", refused)
    row = sockdiag.PortTraffic(50052).sample()
    assert row == {"tcp_error": "sock_diag: no NETLINK_SOCK_DIAG socket: [Errno 93] Protocol not supported"}
    monkeypatch.delattr(sockdiag.socket, "AF_NETLINK")
    assert sockdiag.PortTraffic(50052).sample() == {
        "tcp_error": "sock_diag: no netlink sockets on this platform"
    }


def test_an_established_socket_without_the_byte_counters_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    short = sockdiag.parse_socket(_diag(1, 50052, bytes(104)))  # tcp_info of a kernel before 4.2
    waiting = sockdiag.parse_socket(_diag(sockdiag.TCP_TIME_WAIT, 50052, None, cookie=8))
    monkeypatch.setattr(sockdiag, "dump", lambda family: [waiting])
    assert sockdiag.PortTraffic(50052, "127.0.0.3").sample()["tcp_sockets"] == 0  # time-wait: no tcp_info
    monkeypatch.setattr(sockdiag, "dump", lambda family: [waiting, short])
    assert "need Linux 4.2" in str(sockdiag.PortTraffic(50052, "127.0.0.3").sample()["tcp_error"])


FAKE_SERVER = """\
import socket, sys
host, port = sys.argv[sys.argv.index("-H") + 1], int(sys.argv[sys.argv.index("-p") + 1])
server = socket.socket()
server.bind((host, port))
server.listen(1)
while True:  # as rpc-server: one client after another until it is stopped
    conn, _ = server.accept()
    while True:  # rpc-server's way: recv/send on the socket, nothing /proc/<pid>/io's rchar/wchar counts
        data = conn.recv(1 << 16)
        if not data:
            break
        if data.endswith(b"?"):
            conn.send(b"r" * 1000)
    conn.close()
"""


def _rows(path: Path) -> list[dict[str, object]]:
    import json

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.endswith("}")]


def test_the_worker_program_samples_the_server_s_tcp_bytes(tmp_path: Path) -> None:
    """node.py as the testbed ships it (with launch.py and sockdiag.py beside it) around a server that
    moves its bytes with recv/send: the samples carry them, and keep them after the connection closed."""
    import signal
    import subprocess

    from dit_llamacpp import dit_runtime

    for name, text in dit_runtime._node_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    binary = tmp_path / "fake-rpc-server"
    binary.write_text(f"#!{sys.executable}\n{FAKE_SERVER}", encoding="utf-8")
    binary.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    samples, ready = tmp_path / "samples.jsonl", tmp_path / "ready.json"
    argv = [sys.executable, str(tmp_path / "llamacpp" / "node.py"), "worker", "--binary", str(binary),
            "--bind", "127.0.0.1", "--inference-address", "127.0.0.1", "--local", "--port", str(port),
            "--ready", str(ready), "--samples", str(samples), "--interval", "0.05"]  # fmt: skip
    worker = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), f"the worker did not get ready (exit {worker.poll()})"
        upload = 2_000_000
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"u" * (upload - 1) + b"?")
        got = 0
        while got < 1000:
            got += len(client.recv(4096))

        def seen() -> dict[str, object]:
            rows = _rows(samples)
            return rows[-1] if rows else {}

        while time.monotonic() < deadline and int(str(seen().get("tcp_received", 0))) < upload:
            time.sleep(0.05)
        client.close()
        time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(15)
    rows = _rows(samples)
    assert all("tcp_error" not in r for r in rows), rows[-1]
    assert rows[0]["tcp_received"] == 0 and rows[0]["tcp_sockets"] == 0
    last = rows[-1]  # the last sample, after the connection closed
    assert int(str(last["tcp_received"])) >= upload and int(str(last["tcp_acked"])) >= 1000
    assert last["tcp_sockets"] == 1 and "rchar" not in last
    assert (
        last["tcp_final"] == 1 and upload <= int(str(last["tcp_received"])) <= upload + 1
    )  # to the last byte


def test_without_destroy_notices_a_closed_connection_keeps_its_last_sample_and_says_so(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused() -> socket.socket:
        raise sockdiag.SockDiagError(errno.EPERM, "sock_diag: cannot join the destroy notices: not permitted")

    monkeypatch.setattr(sockdiag, "destroy_notices", refused)
    traffic = sockdiag.PortTraffic(listener.getsockname()[1], "127.0.0.1")
    client, accepted = _exchange(listener, 40_000, 0)
    sampled = _until(traffic, 0, 40_000)
    client.sendall(b"l" * 7000)  # after the last sample: lost without the notice
    got = 0
    while got < 7000:
        got += len(accepted.recv(1 << 16))
    client.close()
    accepted.close()
    time.sleep(0.1)
    row = traffic.sample()
    assert row["tcp_received"] == sampled["tcp_received"] == 40_000 and row["tcp_final"] == 0
    assert row["tcp_final_error"] == "sock_diag: cannot join the destroy notices: not permitted"
