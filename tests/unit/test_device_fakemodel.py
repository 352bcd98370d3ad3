"""The fake model: real work, determinism, exact cut sizes and partition equivalence."""

from __future__ import annotations

import pytest

from dit.device.adapter import StageModel
from dit.device.fakemodel import PROFILE_INPUT_BYTES, PROFILES, FakeModel, build

ALEXNET_CUTS = [12288, 393216, 98304, 262144, 65536, 98304, 98304, 65536, 16384, 16384, 16384, 40]


def spec(**params: object) -> dict[str, object]:
    return {"name": "fake", "params": params, "input": {}, "seed": 2024}


def run_all(model: FakeModel, start: int, stop: int, x: bytes) -> bytes:
    for s in range(start, stop + 1):
        x = model.run_stage(s, x)
    return x


def test_alexnet_profile_is_the_default_with_the_dnn_chapter_cut_sizes() -> None:
    model = build(spec())
    assert isinstance(model, StageModel)
    assert model.num_stages == 11 == len(PROFILES["alexnet"])
    assert [model.output_bytes(s) for s in range(12)] == ALEXNET_CUTS
    assert len(PROFILES["tiny"]) == 4
    assert PROFILE_INPUT_BYTES["alexnet"] == 3 * 32 * 32 * 4
    x = model.make_input()
    assert len(x) == 12288
    for s in range(1, 12):
        x = model.run_stage(s, x)
        assert isinstance(x, bytes) and len(x) == ALEXNET_CUTS[s]


def test_conv_stages_do_more_work_than_pools() -> None:
    model = build(spec())
    conv = [model.ops(s) for s in (1, 3, 5, 6, 7)]
    pool = [model.ops(s) for s in (2, 4, 8)]
    assert min(conv) > max(pool)
    assert model.ops(0) == 0


@pytest.mark.parametrize("profile", ["alexnet", "tiny"])
def test_partition_equivalence_for_every_point(profile: str) -> None:
    model = build(spec(profile=profile))
    n = model.num_stages
    reference = run_all(model, 1, n, model.make_input())
    for p in range(n + 1):
        device_side = build(spec(profile=profile))  # a different process, same spec
        edge_side = build(spec(profile=profile))
        cut = device_side.encode(run_all(device_side, 1, p, device_side.make_input()))
        assert len(cut) == model.output_bytes(p)
        out = run_all(edge_side, p + 1, n, edge_side.decode(cut, p))
        assert out == reference
        assert model.max_abs_diff(out, reference) == 0.0


def test_output_depends_on_input_stage_and_seed() -> None:
    a = build(spec(profile="tiny"))
    b = build({**spec(profile="tiny"), "seed": 1})
    x = a.make_input()
    assert a.run_stage(1, x) == a.run_stage(1, x)
    assert a.make_input() != b.make_input()
    assert a.run_stage(1, x) != b.run_stage(1, x)
    flipped = bytes([x[0] ^ 1]) + x[1:]
    assert a.run_stage(1, x) != a.run_stage(1, flipped)


def test_scale_and_custom_stages() -> None:
    model = build(spec(profile="alexnet", scale=0.5))
    assert [model.ops(s) for s in range(1, 12)] == [round(st["work"] * 0.5) for st in PROFILES["alexnet"]]
    custom = build(
        {
            "name": "fake",
            "params": {
                "stages": [{"work": 1, "output_bytes": 8}, {"work": 0, "output_bytes": 3}],
                "scale": 3,
            },
            "input": {"bytes": 5},
            "seed": 0,
        }
    )
    assert custom.num_stages == 2
    assert [custom.output_bytes(s) for s in range(3)] == [5, 8, 3]
    assert [custom.ops(s) for s in range(3)] == [0, 3, 0]
    assert len(run_all(custom, 1, 2, custom.make_input())) == 3


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"profile": "vgg"}, "is not one of"),
        ({"stages": []}, "non-empty list"),
        ({"stages": [{"work": -1, "output_bytes": 4}]}, r"stages\[1\].work -1 is less than 0"),
        ({"stages": [{"work": 1, "output_bytes": "4"}]}, r"stages\[0\].output_bytes: '4' is not an integer"),
        ({"scale": -2}, "scale"),
        ({"build_delay_s": -1}, r"model.params.build_delay_s: -1 is not a number in 0..600"),
        ({"build_delay_s": "4"}, "build_delay_s: '4'"),
    ],
)
def test_bad_specs_name_the_field(params: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build(spec(**params))


def test_a_build_delay_stands_in_for_a_frameworks_import(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("dit.device.fakemodel.time.sleep", slept.append)
    assert build(spec(profile="tiny", build_delay_s=4)).num_stages == 4
    assert slept == [4.0]
    build(spec(profile="tiny"))
    assert slept == [4.0]  # no delay unless asked


def test_activation_size_is_checked() -> None:
    model = build(spec(profile="tiny"))
    with pytest.raises(ValueError, match="expects 256 input bytes, got 3"):
        model.run_stage(1, b"abc")
    with pytest.raises(ValueError, match="output of stage 2 is 512 bytes"):
        model.decode(b"x", 2)
    with pytest.raises(ValueError, match=r"outside 1\.\.4"):
        model.run_stage(5, b"")


def test_max_abs_diff_on_bytes() -> None:
    model = build(spec(profile="tiny"))
    assert model.max_abs_diff(b"\x00\x10\xff", b"\x00\x10\xff") == 0.0
    assert model.max_abs_diff(b"\x00\x10\xff", b"\x05\x10\x00") == 255.0
    assert model.max_abs_diff(b"\x01", b"\x01\x02") == float("inf")
