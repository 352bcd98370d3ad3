"""Partitioned inference against the edge service, timed per phase (stdlib only).

For one inference at partition point ``p`` of an ``N``-stage model (all on this device's
monotonic clock, integers of ns)::

    local_ns        stages 1..p here, plus encoding the activation (input creation excluded)
    transmission_ns end of local -> ACK received (frame packing, sending, server reads last
                    byte), less ack_overlap_ns (below)
    barrier_ns      from RESULT: server ACK -> release to the scheduler (batch admission wait)
    queue_ns        from RESULT: time released but not computing (other requests' stages)
    remote_ns       from RESULT: the server's stage execution time for this request
    return_ns       (RESULT received - ACK received) - barrier - queue - remote when that is >= 0:
                    the result's trip back
    total_ns        local + transmission + barrier + queue + remote + return (= RESULT received
                    - start of local, exactly)

The interval between the server sending its ACK and this client reading it is counted twice
by the raw measurements: in the client's transmission (which ends when the ACK is read) and in
the server's residence (which starts when the ACK is sent). The residual
``(RESULT received - ACK received) - (barrier + queue + remote)`` equals the result's trip minus
the ACK's trip; when it is negative the ACK's trip was at least that long, so that much of it
is double-counted: it is taken off the transmission and recorded as ``ack_overlap_ns``, and
``return_ns`` is 0. Every phase is then >= 0 and the phases still add up to ``total_ns`` exactly
(the raw transmission is ``transmission_ns + ack_overlap_ns``).

At ``p = N`` everything runs locally, a SKIP is sent (and its ACK awaited, untimed) so that a
batch round on the server can complete, and every remote phase is 0.
"""

from __future__ import annotations

import csv
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dit.device.adapter import StageModel
from dit.device.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    Ack,
    Error,
    Message,
    MsgType,
    ProtocolError,
    Request,
    Result,
    Session,
    Skip,
    device_handshake,
    recv_message,
    send_message,
)

INFERENCE_COLUMNS = (
    "round",
    "repetition",
    "partition_point",
    "request_bytes",
    "local_ns",
    "transmission_ns",
    "barrier_ns",
    "queue_ns",
    "remote_ns",
    "return_ns",
    "ack_overlap_ns",
    "total_ns",
    "start_ns",
    "max_abs_diff",
)


class EdgeError(Exception):
    """The edge service answered with an ERROR frame or an unexpected message."""


class EquivalenceError(Exception):
    """The partitioned output differs from the unpartitioned reference beyond the tolerance."""


@dataclass(frozen=True)
class InferenceRecord:
    round: int
    repetition: int
    partition_point: int
    request_bytes: int
    local_ns: int
    transmission_ns: int
    barrier_ns: int
    queue_ns: int
    remote_ns: int
    return_ns: int
    ack_overlap_ns: int
    total_ns: int
    start_ns: int
    max_abs_diff: float | None  # None when the equivalence check is disabled

    def phase_sum(self) -> int:
        return (
            self.local_ns
            + self.transmission_ns
            + self.barrier_ns
            + self.queue_ns
            + self.remote_ns
            + self.return_ns
        )


class EdgeConnection:
    """One persistent TCP connection to the edge service (blocking, TCP_NODELAY).

    With the run's ``key`` the connection starts with the HELLO exchange (in :meth:`connect`, before
    the start instant) and every frame after it is signed and verified (:class:`~dit.device.protocol.Session`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = 30.0,
        timeout_s: float | None = 600.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        source: str | None = None,
        key: bytes | None = None,
    ) -> None:
        self.host, self.port = host, int(port)
        self.key = key
        self._session: Session | None = None
        # local mode: the device's own loopback address, which its network condition's rules select
        self.source = source or None
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._sock: socket.socket | None = None

    def _socket(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        deadline = time.monotonic() + self.connect_timeout_s
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection(
                    (self.host, self.port),
                    timeout=self.connect_timeout_s,
                    source_address=(self.source, 0) if self.source else None,
                )
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise ConnectionError(
                        f"cannot connect to the edge service at {self.host}:{self.port}: {exc}"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout_s)
        if self.key is not None:
            try:
                self._session = device_handshake(sock, self.key)
            except (OSError, ProtocolError):
                sock.close()
                raise
        self._sock = sock
        return sock

    def connect(self) -> None:
        self._socket()

    def send(self, msg: Message) -> None:
        send_message(self._socket(), msg, self.max_frame_bytes, self._session)

    def receive(self) -> Message:
        sock = self._socket()
        try:
            msg = recv_message(sock, self.max_frame_bytes, self._session)
        except ConnectionError as exc:
            if self._session is None:
                raise
            # The service drops a connection whose frame does not verify, without an answer.
            raise ConnectionError(
                f"edge service {self.host}:{self.port} closed the connection ({exc}): it refuses frames "
                "that its key does not verify; is this device's key file the run's?"
            ) from exc
        if isinstance(msg, Error):
            raise EdgeError(f"edge service {self.host}:{self.port}: {msg.message}")
        return msg

    def expect_ack(self, round_: int, repetition: int, acked: MsgType) -> None:
        msg = self.receive()
        if not (
            isinstance(msg, Ack)
            and msg.round == round_
            and msg.repetition == repetition
            and msg.acked is acked
        ):
            raise EdgeError(f"expected ACK of {acked.name} ({round_}, {repetition}), got {msg!r:.200}")

    def expect_result(self, round_: int, repetition: int) -> Result:
        msg = self.receive()
        if not (isinstance(msg, Result) and msg.round == round_ and msg.repetition == repetition):
            raise EdgeError(f"expected RESULT ({round_}, {repetition}), got {msg!r:.200}")
        return msg

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._session = None

    def __enter__(self) -> EdgeConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reference_output(model: StageModel) -> Any:
    """The unpartitioned final output, computed once per run outside the timed phases."""
    x = model.make_input()
    for stage in range(1, model.num_stages + 1):
        x = model.run_stage(stage, x)
    return x


def check_equivalence(model: StageModel, output: Any, reference: Any, point: int, tolerance: float) -> float:
    diff = float(model.max_abs_diff(output, reference))
    if not diff <= tolerance:
        raise EquivalenceError(
            f"partition equivalence failed: model {model.name!r} at partition point {point}: "
            f"max abs difference {diff} exceeds tolerance {tolerance}"
        )
    return diff


def infer_once(
    model: StageModel,
    conn: EdgeConnection | None,
    *,
    device: str,
    round_: int,
    repetition: int,
    point: int,
    origin_mono_ns: int,
    reference: Any = None,
    tolerance: float | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
) -> InferenceRecord:
    """One timed inference at partition point ``point``; ``tolerance`` None = no equivalence check."""
    n = model.num_stages
    if not 0 <= point <= n:
        raise ValueError(f"partition point {point} is outside 0..{n} for model {model.name!r}")
    x = model.make_input()
    t0 = clock()
    for stage in range(1, point + 1):
        x = model.run_stage(stage, x)
    if point == n:
        t1 = clock()
        local = t1 - t0
        if conn is not None:
            conn.send(Skip(device, round_, repetition, point))
            conn.expect_ack(round_, repetition, MsgType.SKIP)
        final = x
        request_bytes = 0
        transmission = barrier = queue = remote = ret = overlap = 0
    else:
        if conn is None:
            raise ValueError(f"partition point {point} < {n} needs an edge service connection")
        payload = model.encode(x)
        t1 = clock()
        conn.send(Request(device, round_, repetition, point, payload))
        conn.expect_ack(round_, repetition, MsgType.REQUEST)
        t_ack = clock()
        result = conn.expect_result(round_, repetition)
        t_res = clock()
        if result.stages != n - point:
            raise EdgeError(
                f"edge ran {result.stages} stages for partition point {point}, expected {n - point}"
            )
        local = t1 - t0
        transmission = t_ack - t1
        barrier, queue, remote = result.barrier_ns, result.queue_ns, result.remote_ns
        ret = (t_res - t_ack) - barrier - queue - remote
        overlap = max(0, -ret)
        transmission -= overlap
        ret += overlap
        request_bytes = len(payload)
        final = model.decode(result.payload, n)
    total = local + transmission + barrier + queue + remote + ret
    diff = None
    if tolerance is not None:
        diff = check_equivalence(model, final, reference, point, tolerance)
    return InferenceRecord(
        round=round_,
        repetition=repetition,
        partition_point=point,
        request_bytes=request_bytes,
        local_ns=local,
        transmission_ns=transmission,
        barrier_ns=barrier,
        queue_ns=queue,
        remote_ns=remote,
        return_ns=ret,
        ack_overlap_ns=overlap,
        total_ns=total,
        start_ns=t0 - origin_mono_ns,
        max_abs_diff=diff,
    )


def run_inference(
    model: StageModel,
    conn: EdgeConnection | None,
    *,
    device: str,
    vectors: Sequence[Sequence[int]],
    device_index: int,
    repetitions: int,
    origin_mono_ns: int,
    reference: Any = None,
    tolerance: float | None = None,
    on_record: Callable[[InferenceRecord], None] | None = None,
) -> list[InferenceRecord]:
    """Every vector in order (round = vector index), ``repetitions`` inferences each."""
    for r, vector in enumerate(vectors):
        if not 0 <= device_index < len(vector):
            raise ValueError(f"inference.vectors[{r}]: has no position {device_index} (device_index)")
    records: list[InferenceRecord] = []
    for r, vector in enumerate(vectors):
        for k in range(repetitions):
            rec = infer_once(
                model,
                conn,
                device=device,
                round_=r,
                repetition=k,
                point=int(vector[device_index]),
                origin_mono_ns=origin_mono_ns,
                reference=reference,
                tolerance=tolerance,
            )
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    return records


def write_inference_csv(path: Path, records: Sequence[InferenceRecord]) -> None:
    """Write ``inference.csv`` (columns :data:`INFERENCE_COLUMNS`) atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=INFERENCE_COLUMNS)
        writer.writeheader()
        for rec in records:
            row = asdict(rec)
            row["max_abs_diff"] = "" if rec.max_abs_diff is None else repr(rec.max_abs_diff)
            writer.writerow(row)
    os.replace(tmp, path)


__all__ = [
    "INFERENCE_COLUMNS",
    "EdgeConnection",
    "EdgeError",
    "EquivalenceError",
    "InferenceRecord",
    "ProtocolError",
    "check_equivalence",
    "infer_once",
    "reference_output",
    "run_inference",
    "write_inference_csv",
]
