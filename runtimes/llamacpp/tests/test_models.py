"""GGUF models: the corpus tokenizer, the checksummed catalogue, conversion of a reduced decoder.

Fast tests need only the ``tokenizers`` package; conversion needs torch, transformers and the unpacked
llama-cpp-python sdist (the vendored converter) and is marked slow (a 2-layer, hidden-64 decoder:
a few seconds of CPU per conversion).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from dit_llamacpp import models
from dit_llamacpp import tokenizer as tok
from dit_llamacpp.equivalence import read_session_tokens

# The tokenizers package comes with the `llm` extra (transformers), not with the dev lock CI lints and
# runs the default phase with: without it the tokenizer tests are skipped there and run in ./dev slow.
try:
    import tokenizers  # noqa: F401

    HAVE_TOKENIZERS = True
except ImportError:
    HAVE_TOKENIZERS = False
needs_tokenizers = pytest.mark.skipif(not HAVE_TOKENIZERS, reason="the tokenizers package is not installed")


def _converter_missing() -> str | None:
    """Why the vendored converter cannot run here (``$DIT_LLAMACPP_SRC`` or the default tree), or None."""
    try:
        models.vendored()
    except models.GGUFError as exc:
        return (
            f"{exc}; unpack it with: python -m dit_llamacpp.source --mirror <mirror> (or --archive <sdist>)"
        )
    return None


CONVERTER_MISSING = _converter_missing()
needs_source = pytest.mark.skipif(CONVERTER_MISSING is not None, reason=CONVERTER_MISSING or "")


# ------------------------------------------------------------------------------------ tokenizer


@needs_tokenizers
@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_tokenizer_is_deterministic_and_matches_the_catalogue(name: str) -> None:
    s = models.shape(name)
    a = tok.tokenizer_files(s.family, s.vocab_size(), s.max_positions())  # type: ignore[arg-type]
    b = tok.tokenizer_files(s.family, s.vocab_size(), s.max_positions())  # type: ignore[arg-type]
    assert a == b
    assert models.check_tokenizer(name) == models.load_catalogue()["models"][name]["tokenizer"]["sha256"]


@needs_tokenizers
def test_llama_tokenizer_layout() -> None:
    t = tok.build("llama", 512)
    vocab = t.get_vocab()
    assert [vocab[x] for x in ("<unk>", "<s>", "</s>", "<0x00>", "<0xFF>")] == [0, 1, 2, 3, 258]
    doc = json.loads(t.to_str())
    assert doc["model"]["byte_fallback"] is True and doc["decoder"]["type"] == "Sequence"
    ids = t.encode("The boards hummed").ids
    assert ids[0] == 1 and t.decode(ids) == "The boards hummed"


@needs_tokenizers
def test_gpt2_tokenizer_is_byte_level_with_eot_zero() -> None:
    t = tok.build("gpt2", 512)
    assert t.get_vocab()["<|endoftext|>"] == 0
    text = "Nobody remembered — 42 fans."  # non-ASCII survives through the byte alphabet
    assert t.decode(t.encode(text).ids) == text


@needs_tokenizers
def test_tokenizer_pads_to_the_model_vocabulary() -> None:
    t = tok.build("llama", 4096)  # far more than the corpus has merges for
    assert t.get_vocab_size() == 4096 and "<unused0>" in t.get_vocab()


@needs_tokenizers
def test_tokenizer_rejects_a_vocabulary_too_small() -> None:
    with pytest.raises(tok.TokenizerError, match="vocab_size"):
        tok.build("llama", 200)
    with pytest.raises(tok.TokenizerError, match=r"tokenizer\.kind"):
        tok.build("bert", 512)  # type: ignore[arg-type]


@needs_tokenizers
def test_tokenizer_mismatch_is_refused(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(tok.CORPUS.read_text(encoding="utf-8") + "\nAn extra line changes the merges.\n")
    with pytest.raises(models.GGUFChecksumMismatch, match=r"tokenizer\.json"):
        models.check_tokenizer("llama-tiny", corpus=corpus)


# ------------------------------------------------------------------------------------ catalogue


def test_catalogue_records_every_quant_of_the_reduced_shapes() -> None:
    doc = models.load_catalogue()
    for name in ("gpt2-tiny", "llama-tiny"):
        files = doc["models"][name]["files"]
        # the converter's three; Q4_0 (llama-quantize) is recorded once the build is there
        assert set(models.CONVERTER_OUTTYPE) <= set(files) <= set(models.QUANTS)
        for quant, rec in files.items():
            assert rec["file"] == models.gguf_name(name, quant)
            assert len(rec["sha256"]) == 64 and rec["bytes"] > 0
    # quantised files are smaller than F32
    f = doc["models"]["llama-tiny"]["files"]
    assert f["F32"]["bytes"] > f["F16"]["bytes"] > f["Q8_0"]["bytes"] > f.get("Q4_0", {"bytes": 0})["bytes"]
    assert doc["source"]["sha256"] == models.SDIST_SHA256


def test_tampered_file_is_refused_naming_file_and_both_hashes(tmp_path: Path) -> None:
    path = tmp_path / models.gguf_name("llama-tiny", "F32")
    path.write_bytes(b"GGUF not really")
    good = models.sha256_file(path)
    path.write_bytes(b"GGUF not really!")
    bad = models.sha256_file(path)
    cat = {
        "format": 1,
        "models": {"llama-tiny": {"files": {"F32": {"file": path.name, "bytes": 15, "sha256": good}}}},
    }
    with pytest.raises(models.GGUFChecksumMismatch) as err:
        models.ensure_gguf("llama-tiny", "F32", tmp_path, catalogue=cat)
    msg = str(err.value)
    assert str(path) in msg and good in msg and bad in msg


def test_file_without_any_recorded_checksum_is_refused(tmp_path: Path) -> None:
    (tmp_path / models.gguf_name("tinyllama", "F16")).write_bytes(b"x")
    with pytest.raises(models.GGUFError, match="no checksum recorded"):
        models.ensure_gguf("tinyllama", "F16", tmp_path, catalogue={"format": 1, "models": {}})


def test_bad_names_are_refused() -> None:
    with pytest.raises(models.GGUFError, match="model: 'bert'"):
        models.shape("bert")
    with pytest.raises(models.GGUFError, match="quant: 'Q5_K'"):
        models.check_quant("Q5_K")


def test_smollm2_has_its_own_weight_types_and_a_wrong_one_names_quant() -> None:
    assert models.quants_of("smollm2-135m") == ("F32", "Q8_0", "Q4_1")
    assert models.quants_of("llama-tiny") == models.QUANTS
    assert models.check_quant("Q4_1", "smollm2-135m") == "Q4_1"
    with pytest.raises(models.GGUFError, match=r"^quant: 'Q4_1' is not one of the weight types made for "
                       r"model llama-tiny: F32, F16, Q8_0, Q4_0$"):  # fmt: skip
        models.check_quant("Q4_1", "llama-tiny")
    with pytest.raises(models.GGUFError, match=r"^quant: 'Q4_0' .* model smollm2-135m: F32, Q8_0, Q4_1$"):
        models.check_quant("Q4_0", "smollm2-135m")
    with pytest.raises(models.GGUFError, match=r"^model: 'smollm3' is not one of .*smollm2-135m"):
        models.quants_of("smollm3")
    with pytest.raises(models.GGUFError, match=r"^quant: 'F16' .* model smollm2-135m"):
        models.ensure_gguf("smollm2-135m", "F16", Path("/nonexistent"))


def test_smollm2_files_are_pinned_and_the_wheel_s_file_is_the_model_catalogue_s() -> None:
    from dit.models.catalogue import BUILTIN

    entry = models.load_catalogue()["models"]["smollm2-135m"]
    assert set(entry["files"]) == {"F32", "Q8_0", "Q4_1"} and entry["trained"] is True
    for quant, rec in entry["files"].items():
        assert rec["file"] == models.gguf_name("smollm2-135m", quant) and len(rec["sha256"]) == 64
    packaged = BUILTIN["smollm2-135m"].packaged
    assert packaged is not None
    assert (entry["files"]["Q4_1"]["sha256"], entry["files"]["Q4_1"]["bytes"]) == (
        packaged.sha256,
        packaged.bytes,
    )
    f = entry["files"]
    assert f["F32"]["bytes"] > f["Q8_0"]["bytes"] > f["Q4_1"]["bytes"]


def _packaged_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes) -> str:
    """A stand-in for the wheel's GGUF (the real one is 98 MB): what packaged_gguf hands over."""
    src = tmp_path / "wheel" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    src.parent.mkdir()
    src.write_bytes(data)
    digest = models.sha256_file(src)
    monkeypatch.setattr(models, "packaged_gguf", lambda t: (src, digest))
    return digest


def test_the_wheel_s_gguf_is_copied_and_verified_nothing_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = _packaged_stand_in(tmp_path, monkeypatch, b"GGUF the wheel's Q4_1")
    cat = {"format": 1, "models": {"smollm2-135m": {"files": {"Q4_1": {"sha256": digest}}}}}
    out = tmp_path / "gguf"
    f = models.ensure_gguf("smollm2-135m", "Q4_1", out, catalogue=cat)
    assert (f.path, f.sha256, f.source) == (out / "smollm2-135m-Q4_1.gguf", digest, "catalogue")
    assert f.path.read_bytes() == b"GGUF the wheel's Q4_1" and not (out / "smollm2-135m-hf").exists()


def test_a_tampered_smollm2_file_is_refused_naming_it_and_both_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = _packaged_stand_in(tmp_path, monkeypatch, b"GGUF the wheel's Q4_1")
    cat = {"format": 1, "models": {"smollm2-135m": {"files": {"Q4_1": {"sha256": digest},
                                                              "F32": {"sha256": "0" * 64}}}}}  # fmt: skip
    models.ensure_gguf("smollm2-135m", "Q4_1", tmp_path, catalogue=cat)
    path = tmp_path / "smollm2-135m-Q4_1.gguf"
    path.write_bytes(b"GGUF changed")
    with pytest.raises(models.GGUFChecksumMismatch) as err:
        models.ensure_gguf("smollm2-135m", "Q4_1", tmp_path, catalogue=cat)
    assert (
        str(path) in str(err.value)
        and digest in str(err.value)
        and models.sha256_file(path) in str(err.value)
    )
    # a made file that is there is checked, never converted again
    (tmp_path / "smollm2-135m-F32.gguf").write_bytes(b"GGUF not the converter's")
    with pytest.raises(models.GGUFChecksumMismatch, match=r"smollm2-135m-F32\.gguf"):
        models.ensure_gguf("smollm2-135m", "F32", tmp_path, catalogue=cat)


def test_converter_and_quantizer_argv_are_lists() -> None:
    argv = models.converter_argv(
        Path("/m/x-hf"), Path("/o/x.gguf"), "Q8_0", "x", Path("/src"), {"ab" * 32: "gpt2"}
    )
    assert argv[1:3] == ["-m", "dit_llamacpp.convert_shim"]
    assert argv[argv.index("--outtype") + 1] == "q8_0" and f"{'ab' * 32}=gpt2" in argv
    assert models.quantize_argv(Path("/b/llama-quantize"), Path("a"), Path("b"), "Q4_0") == [
        "/b/llama-quantize", "a", "b", "Q4_0", "1"]  # fmt: skip


def test_session_file_token_ids(tmp_path: Path) -> None:
    p = tmp_path / "s.bin"
    p.write_bytes(struct.pack("<IIIiii", 0x6767736E, 10, 3, 1, 345, 7) + b"state")
    assert read_session_tokens(p) == [1, 345, 7]
    p.write_bytes(struct.pack("<III", 0x12345678, 10, 0))
    with pytest.raises(models.GGUFError, match="magic"):
        read_session_tokens(p)


# ------------------------------------------------------------------------------------ conversion


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights")


@pytest.mark.slow
@needs_source
def test_convert_reduced_llama_reproducibly_to_the_catalogued_bytes(tmp_path: Path, weights: Path) -> None:
    first = models.ensure_gguf("llama-tiny", "F32", tmp_path / "a", weights_dir=weights)
    assert first.source == "catalogue" and first.seconds > 0
    assert first.sha256 == models.expected("llama-tiny", "F32")["sha256"]  # type: ignore[index]
    # the tokenizer ships with the model, next to the weights it was converted with
    assert (tmp_path / "a" / "llama-tiny-hf" / "tokenizer.json").is_file()
    # a second conversion from scratch, elsewhere: the same bytes
    again = models.ensure_gguf("llama-tiny", "F32", tmp_path / "b", weights_dir=weights)
    assert again.path.read_bytes() == first.path.read_bytes()
    # a later use verifies without converting; a changed byte is refused
    assert models.ensure_gguf("llama-tiny", "F32", tmp_path / "a", weights_dir=weights).seconds == 0
    data = bytearray(first.path.read_bytes())
    data[-1] ^= 0xFF
    first.path.write_bytes(bytes(data))
    with pytest.raises(models.GGUFChecksumMismatch, match=first.sha256):
        models.ensure_gguf("llama-tiny", "F32", tmp_path / "a", weights_dir=weights)


@pytest.mark.slow
@needs_source
def test_convert_reduced_gpt2_with_the_registered_pre_tokenizer(tmp_path: Path, weights: Path) -> None:
    f = models.ensure_gguf("gpt2-tiny", "Q8_0", tmp_path, weights_dir=weights)
    assert f.sha256 == models.expected("gpt2-tiny", "Q8_0")["sha256"]  # type: ignore[index]
    hf = tmp_path / "gpt2-tiny-hf"
    recorded = models.load_catalogue()["models"]["gpt2-tiny"]["tokenizer"]["pre_tokenizer"]
    assert models.pre_hash(hf, models.vendored()) == recorded["hash"]
    # without the registration the vendored converter refuses our tokenizer
    with pytest.raises(models.GGUFError, match="pre-tokenizer was not recognized"):
        models.convert(
            models.shape("gpt2-tiny"), "F16", hf, tmp_path / "plain", tree=models.vendored(), pre={}
        )
    shutil.rmtree(tmp_path / "plain", ignore_errors=True)


@pytest.mark.slow
@needs_source
@pytest.mark.skipif(models.find_binary("llama-quantize") is None, reason="llama-quantize is not built")
def test_q4_0_by_llama_quantize_is_catalogued(tmp_path: Path, weights: Path) -> None:
    f = models.ensure_gguf("llama-tiny", "Q4_0", tmp_path, weights_dir=weights)
    rec = models.expected("llama-tiny", "Q4_0")
    assert rec is not None, f"data/gguf.json has no Q4_0 entry; this build gives {f.sha256} ({f.bytes} B)"
    assert f.sha256 == rec["sha256"] and f.source == "catalogue"
