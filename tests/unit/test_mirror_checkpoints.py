"""Real checkpoints carried by the mirror (issue 13, item 2): pinned in the sources file, copied by
mirror/build with their hash, re-hashed by mirror/verify; the pin is HeadSplit's definition."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dit.mirror import build, checkpoints, manifest
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "runtimes" / "headsplit" / "src"))
from headsplit import checkpoint as hs_checkpoint  # torch-free


def _hf_dir(root: Path) -> Path:
    d = root / "tiny-llama"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "model-00001-of-00002.safetensors").write_bytes(b"one" * 100)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"two" * 100)
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (d / "README.md").write_text("not part of the pin")
    return d


def test_the_pin_is_headsplits_definition(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path)
    assert checkpoints.pin_of(d) == hs_checkpoint.checkpoint_sha256(d)
    f = d / "model-00001-of-00002.safetensors"
    assert checkpoints.pin_of(f) == hs_checkpoint.checkpoint_sha256(f)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "path": "p", "sha256": "abc"}, r"checkpoints\[0\]\.sha256: 'abc' is not a SHA-256"),
        ({"name": "../x", "path": "p", "sha256": "a" * 64}, r"checkpoints\[0\]\.name"),
        ({"name": "x", "sha256": "a" * 64}, r"checkpoints\[0\]\.path"),
        ({"name": "x", "path": "p", "sha256": "a" * 64, "url": "u"}, r"unknown field\(s\) url"),
    ],
)
def test_declarations_are_refused_naming_the_field(entry: dict[str, object], message: str) -> None:
    with pytest.raises(checkpoints.CheckpointMirrorError, match=message):
        checkpoints.parse_checkpoints([entry], Path("/base"))


def _options(out: Path, sources_file: Path) -> build.BuildOptions:
    return build.BuildOptions(out=out, repo=REPO, skip_wheels=True, skip_debs=True, skip_sources=True,
                              skip_weights=True, skip_runtimes=True, sources_file=sources_file)  # fmt: skip


def test_mirror_build_carries_checkpoints_and_verify_checks_them(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path / "models")
    single = tmp_path / "models" / "gpt2.safetensors"
    single.write_bytes(b"weights" * 50)
    pin, single_pin = checkpoints.pin_of(d), checkpoints.pin_of(single)
    sources_file = tmp_path / "mirror" / "sources.yaml"
    sources_file.parent.mkdir()
    sources_file.write_text(json.dumps({"checkpoints": [
        {"name": "tiny-llama", "path": "../models/tiny-llama", "sha256": pin},
        {"name": "gpt2", "path": str(single), "sha256": single_pin},
    ]}))  # fmt: skip
    out = tmp_path / "m"
    doc = build.build_mirror(_options(out, sources_file), log=lambda _: None)
    copy = out / "checkpoints" / pin / "tiny-llama"
    assert sorted(p.name for p in copy.iterdir()) == [
        "SHA256SUMS", "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]  # fmt: skip
    hs_checkpoint.verify(copy, pin)  # HeadSplit accepts the mirror's copy as the pinned checkpoint
    assert (out / "checkpoints" / single_pin / "gpt2.safetensors").read_bytes() == single.read_bytes()
    origins = {f["path"]: f for f in doc["files"]}
    rel = f"checkpoints/{pin}/tiny-llama/config.json"
    assert origins[rel]["kind"] == "checkpoint" and origins[rel]["pin"] == pin
    assert manifest.verify_mirror(out)[0] == []
    # tampered in the mirror: mirror/verify names the file; HeadSplit names it with both hashes
    victim = copy / "model-00002-of-00002.safetensors"
    good = manifest.sha256_file(victim)
    victim.write_bytes(b"TWO" * 100)
    problems = manifest.verify_mirror(out)[0]
    assert len(problems) == 1 and "model-00002-of-00002.safetensors" in problems[0]
    with pytest.raises(hs_checkpoint.CheckpointError, match=f"{victim}: pinned {good}, file has"):
        hs_checkpoint.verify(copy, pin)


def test_a_source_that_is_not_the_pinned_one_stops_the_build(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path / "models")
    sources_file = tmp_path / "sources.yaml"
    sources_file.write_text(json.dumps({"checkpoints": [{"name": "t", "path": str(d), "sha256": "0" * 64}]}))
    with pytest.raises(
        build.BuildError, match=f"has pin {checkpoints.pin_of(d)}, mirror/sources.yaml pins 0000"
    ):
        build.build_mirror(_options(tmp_path / "m", sources_file), log=lambda _: None)
