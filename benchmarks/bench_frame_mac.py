"""Cost of the edge channel's per-frame MAC (issue 46): signing and verifying one frame, by body size.

    .venv/bin/python benchmarks/bench_frame_mac.py [--frames 2000] [--rounds 5]

For a SKIP / ACK (a few bytes) and REQUESTs of 1 KiB, 64 KiB and 1 MiB of activation, times
``encode_parts`` without a session (the frame as before), the tag a device adds (``Session.sign``) and
the check the edge makes before it ACKs (``Session.verify``), ``--frames`` frames per round, and prints
the median per frame over ``--rounds`` rounds. Signing and verifying are both on the timed path of an
inference (in ``transmission_ns``: the device signs after its local stages, the edge verifies before the
ACK; the ACK itself is signed and verified too, a few bytes). The MAC is HMAC-SHA256 from a pre-keyed
copy, so its cost is a fixed few microseconds plus SHA-256 over the bytes (docs/protocol.md has the
figures of this machine).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from dit.device import protocol as P

KEY = bytes(range(32))


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])


def per_frame_ns(work: Callable[[], object], frames: int, rounds: int) -> float:
    """The median over ``rounds`` of the mean time of one call of ``work`` (``frames`` calls a round)."""
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(frames):
            work()
        means.append((time.perf_counter_ns() - t0) / frames)
    return statistics.median(means)


def measure(msg: P.Message, frames: int, rounds: int) -> tuple[int, float, float, float]:
    """The frame's size and, per frame, ``encode_parts`` alone, signing, and verifying (ns)."""
    nd, ne = b"d" * P.NONCE_BYTES, b"e" * P.NONCE_BYTES
    parts = P.encode_parts(msg)
    encode_ns = per_frame_ns(functools.partial(P.encode_parts, msg), frames, rounds)
    sign_ns = per_frame_ns(functools.partial(P.Session(KEY, nd, ne, edge=False).sign, parts), frames, rounds)
    # verified against tags made in the same order: the edge's counter must meet the device's
    signer, edge = P.Session(KEY, nd, ne, edge=False), P.Session(KEY, nd, ne, edge=True)
    tags = iter([signer.sign(parts) for _ in range(frames * rounds)])
    kind = P.MsgType(parts[0][5])

    def verify() -> None:
        edge.verify(kind, parts, next(tags))

    return sum(len(p) for p in parts), encode_ns, sign_ns, per_frame_ns(verify, frames, rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the same code path (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.frames, args.rounds = 20, 1
    messages: list[tuple[str, P.Message]] = [("SKIP", P.Skip("device1", 0, 0, 4))]
    messages += [
        (f"REQUEST {size // 1024:>4} KiB", P.Request("device1", 0, 0, 2, bytes(size)))
        for size in (1024, 64 * 1024, 1024 * 1024)
    ]
    print(f"load average before: {loadavg()}")
    print(f"{'frame':<18} {'encode':>10} {'sign':>10} {'verify':>10} {'MAC total':>10} {'MAC rate':>11}")
    for label, msg in messages:
        frames = max(1, args.frames // 20) if "1024 KiB" in label else args.frames
        size, encode_ns, sign_ns, verify_ns = measure(msg, frames, args.rounds)
        total = sign_ns + verify_ns
        rate = size / (total / 2) * 1e9 / 1e6  # MB/s of one side
        print(
            f"{label:<18} {encode_ns / 1e3:8.2f} µs {sign_ns / 1e3:8.2f} µs {verify_ns / 1e3:8.2f} µs "
            f"{total / 1e3:8.2f} µs {rate:8.0f} MB/s"
        )
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
