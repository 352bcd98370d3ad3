"""The fake model: a chain of stages that do real, deterministic CPU work (stdlib only).

It stands in for a real network in local mode and in tests. Activations are ``bytes`` of
exactly ``output_bytes`` of their stage, so cut sizes are those of the real model, and the output
of every stage is a pure function of its input, the stage index and the spec's seed, so the
partition-equivalence check is meaningful.

Work unit
---------
One *work unit* is one BLAKE2b-512 pass over ``64 + 65536`` bytes: the previous 64-byte digest
followed by a fixed 64 KiB block derived from the stage input. Stage ``s`` with ``work = W`` on
input ``x`` computes::

    d0  = BLAKE2b-512(pack("!QI", seed, s) || x)          # reads the whole input once
    B   = d0 repeated 1024 times                          # the 64 KiB block (64 x 1024 bytes)
    d_i = BLAKE2b-512(d_{i-1} || B)   for i = 1..W        # W chained work units
    out = SHAKE-256(d_W) tiled to output_bytes bytes      # a 4 KiB SHAKE block, repeated

so the stage time is ``W`` units plus a small overhead proportional to the input size (the
``d0`` pass, about one unit per 64 KiB of input). ``ops(s)`` is ``W``. BLAKE2b runs in software
on every CPU (no SHA extensions skew the ratio between a laptop and a Raspberry Pi), it is slowed
by a CPU load or a frequency cap like any computation, and ``hashlib`` releases the GIL while
hashing large buffers, so an edge service keeps answering the network while a stage runs.
On the development machine one unit takes about 65 us; the default ``alexnet`` profile is
about 22 ms per forward pass (see ``docs/raw-results.md``).
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK_BYTES = 65536
_DIGEST_BYTES = 64
_TILE_BYTES = 4096
_PERSON = b"dit-fake"

#: Stage profiles: ``work`` in work units, ``output_bytes`` the activation size after the stage.
PROFILES: dict[str, list[dict[str, int]]] = {
    # AlexNet on CIFAR-10, the eleven partition stages of the DNN chapter (float32 activations).
    "alexnet": [
        {"work": 44, "output_bytes": 393216},  # 1 conv1 96x32x32
        {"work": 10, "output_bytes": 98304},  # 2 pool1 96x16x16
        {"work": 60, "output_bytes": 262144},  # 3 conv2 256x16x16
        {"work": 8, "output_bytes": 65536},  # 4 pool2 256x8x8
        {"work": 52, "output_bytes": 98304},  # 5 conv3 384x8x8
        {"work": 52, "output_bytes": 98304},  # 6 conv4 384x8x8
        {"work": 44, "output_bytes": 65536},  # 7 conv5 256x8x8
        {"work": 7, "output_bytes": 16384},  # 8 pool3 256x4x4
        {"work": 36, "output_bytes": 16384},  # 9 fc1 4096
        {"work": 17, "output_bytes": 16384},  # 10 fc2 4096
        {"work": 6, "output_bytes": 40},  # 11 fc3 (10 classes x float32)
    ],
    # Four small stages for fast tests.
    "tiny": [
        {"work": 2, "output_bytes": 1024},
        {"work": 3, "output_bytes": 512},
        {"work": 2, "output_bytes": 256},
        {"work": 1, "output_bytes": 16},
    ],
}

#: Input (stage 0) size per profile; AlexNet: one 3x32x32 float32 image.
PROFILE_INPUT_BYTES: dict[str, int] = {"alexnet": 12288, "tiny": 256}

DEFAULT_PROFILE = "alexnet"
MAX_BUILD_DELAY_S = 600
DEFAULT_INPUT_BYTES = 1024


@dataclass(frozen=True)
class FakeStage:
    work: int
    output_bytes: int


def _tile(seed: bytes, size: int) -> bytes:
    """``size`` bytes: a SHAKE-256 block of ``seed``, repeated."""
    if size <= _TILE_BYTES:
        return hashlib.shake_256(seed).digest(size)
    tile = hashlib.shake_256(seed).digest(_TILE_BYTES)
    reps, rest = divmod(size, _TILE_BYTES)
    return tile * reps + tile[:rest]


class FakeModel:
    """A :class:`dit.device.adapter.StageModel` whose stages hash instead of multiplying."""

    def __init__(
        self, stages: Sequence[FakeStage], input_bytes: int, seed: int = 0, name: str = "fake"
    ) -> None:
        if not stages:
            raise ValueError("fake model: at least one stage is required")
        if input_bytes <= 0:
            raise ValueError(f"fake model: input bytes {input_bytes} must be positive")
        for i, st in enumerate(stages, start=1):
            if st.work < 0:
                raise ValueError(f"fake model: stages[{i}].work {st.work} is less than 0")
            if st.output_bytes <= 0:
                raise ValueError(f"fake model: stages[{i}].output_bytes {st.output_bytes} must be positive")
        self.name = name
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.stages: tuple[FakeStage, ...] = tuple(stages)
        self.input_bytes = int(input_bytes)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def make_input(self) -> bytes:
        return _tile(b"dit-fake-input" + struct.pack("!Q", self.seed), self.input_bytes)

    def _check_stage(self, stage: int, low: int) -> None:
        if not low <= stage <= len(self.stages):
            raise ValueError(f"fake model: stage {stage} is outside {low}..{len(self.stages)}")

    def run_stage(self, stage: int, x: Any) -> bytes:
        self._check_stage(stage, 1)
        data = bytes(x) if not isinstance(x, bytes) else x
        expected = self.output_bytes(stage - 1)
        if len(data) != expected:
            raise ValueError(f"fake model: stage {stage} expects {expected} input bytes, got {len(data)}")
        h = hashlib.blake2b(struct.pack("!QI", self.seed, stage), digest_size=_DIGEST_BYTES, person=_PERSON)
        h.update(data)
        digest = h.digest()
        block = digest * (BLOCK_BYTES // _DIGEST_BYTES)
        for _ in range(self.stages[stage - 1].work):
            h = hashlib.blake2b(digest, digest_size=_DIGEST_BYTES, person=_PERSON)
            h.update(block)
            digest = h.digest()
        return _tile(digest, self.stages[stage - 1].output_bytes)

    def encode(self, x: Any) -> bytes:
        return bytes(x)

    def decode(self, data: bytes, stage: int) -> bytes:
        self._check_stage(stage, 0)
        expected = self.output_bytes(stage)
        if len(data) != expected:
            raise ValueError(f"fake model: output of stage {stage} is {expected} bytes, got {len(data)}")
        return bytes(data)

    def output_bytes(self, stage: int) -> int:
        self._check_stage(stage, 0)
        return self.input_bytes if stage == 0 else self.stages[stage - 1].output_bytes

    def ops(self, stage: int) -> int:
        """Work units of ``stage`` (0 for stage 0, the input)."""
        self._check_stage(stage, 0)
        return 0 if stage == 0 else self.stages[stage - 1].work

    def max_abs_diff(self, a: Any, b: Any) -> float:
        """0.0 when equal, else the largest absolute byte-value difference (inf if lengths differ)."""
        x, y = bytes(a), bytes(b)
        if x == y:
            return 0.0
        if len(x) != len(y):
            return float("inf")
        return float(max(abs(p - q) for p, q in zip(x, y, strict=True)))


def _int_field(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {value!r} is not an integer")
    return value


def build(spec: Mapping[str, Any]) -> FakeModel:
    """Build a :class:`FakeModel` from a spec.

    ``spec = {"name": "fake", "params": {...}, "input": {...}, "seed": int}`` where params is
    ``{"profile": "alexnet" | "tiny"}`` (default ``alexnet``) or ``{"stages": [{"work",
    "output_bytes"}, ...], "input_bytes": int}``, optionally with ``"scale": float`` multiplying
    every ``work`` (rounded to the nearest integer). ``input`` may set ``{"bytes": int}``.
    ``"build_delay_s": float`` (default 0, at most 600) makes building take that long, as a real
    framework's import and model construction do (tests of the timed start use it).
    """
    params: Mapping[str, Any] = spec.get("params") or {}
    delay = params.get("build_delay_s", 0)
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= MAX_BUILD_DELAY_S:
        raise ValueError(f"model.params.build_delay_s: {delay!r} is not a number in 0..{MAX_BUILD_DELAY_S}")
    raw_stages: Any = params.get("stages")
    if raw_stages is not None:
        if not isinstance(raw_stages, list) or not raw_stages:
            raise ValueError("model.params.stages: must be a non-empty list of {work, output_bytes}")
        source = raw_stages
        input_bytes = params.get("input_bytes", DEFAULT_INPUT_BYTES)
    else:
        profile = str(params.get("profile", DEFAULT_PROFILE))
        if profile not in PROFILES:
            raise ValueError(f"model.params.profile: {profile!r} is not one of {sorted(PROFILES)}")
        source = PROFILES[profile]
        input_bytes = PROFILE_INPUT_BYTES[profile]
    scale = params.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or scale < 0:
        raise ValueError(f"model.params.scale: {scale!r} is not a number >= 0")
    stages: list[FakeStage] = []
    for i, item in enumerate(source):
        where = f"model.params.stages[{i}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}: must be a mapping with work and output_bytes")
        work = _int_field(item.get("work"), f"{where}.work")
        out = _int_field(item.get("output_bytes"), f"{where}.output_bytes")
        stages.append(FakeStage(work=round(work * float(scale)), output_bytes=out))
    inp: Mapping[str, Any] = spec.get("input") or {}
    if "bytes" in inp:
        input_bytes = inp["bytes"]
    input_bytes = _int_field(input_bytes, "model.input.bytes")
    seed = _int_field(spec.get("seed", 0), "model.seed")
    if delay:
        time.sleep(float(delay))
    return FakeModel(stages, input_bytes=input_bytes, seed=seed, name=str(spec.get("name", "fake")))
