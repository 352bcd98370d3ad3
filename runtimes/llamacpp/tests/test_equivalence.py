"""llama.cpp (F32 GGUF, greedy) generates the same 8 token ids as the Hugging Face model, same seeded weights;
for SmolLM2-135M the same 32 ids as transformers' float32 greedy decoding, and its quantised files' first
difference and agreement.

Slow: converts the reduced decoders and runs the built ``llama-completion``; skipped with the reason
when the binary is not built or the vendored converter is not unpacked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dit_llamacpp import models
from dit_llamacpp.equivalence import compare, reference_model

BINARY = models.find_binary("llama-completion")
try:
    models.vendored()
    CONVERTER_MISSING: str | None = None
except models.GGUFError as exc:
    CONVERTER_MISSING = (
        f"{exc}; unpack it: python -m dit_llamacpp.source --mirror <mirror> (or --archive <sdist>)"
    )

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BINARY is None,
        reason="llama-completion is not built (dit_llamacpp.build into /var/cache/dit/llamacpp, "
        "or set DIT_LLAMACPP_BIN)",
    ),
    pytest.mark.skipif(CONVERTER_MISSING is not None, reason=CONVERTER_MISSING or ""),
]


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_f32_greedy_ids_equal_hugging_face(name: str, tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    f = models.ensure_gguf(name, "F32", tmp_path, weights_dir=weights)
    result = compare(name, f.path, n=8, weights_dir=weights, hf_dir=tmp_path / f"{name}-hf", binary=BINARY)
    assert len(result.hf_ids) == len(result.llama_ids) == 8
    assert result.equal, result.describe()


SMOLLM2 = "smollm2-135m"
FRANCE = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """SmolLM2's three GGUF files made from scratch here (the wheel's Q4_1 copied, F32 and Q8_0 converted from
    a Hugging Face directory written anew), each checked against its pin in data/gguf.json: the conversion is
    reproducible or this fails. And the float32 reference, loaded once."""
    for package in ("torch", "transformers", "gguf"):
        pytest.importorskip(package)
    try:
        models.packaged_gguf(models.TRAINED[SMOLLM2])
    except models.GGUFError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("smollm2")
    for quant in models.quants_of(SMOLLM2):
        assert models.ensure_gguf(SMOLLM2, quant, out).source == "catalogue"
    return out, reference_model(SMOLLM2)


def test_smollm2_f32_ids_equal_transformers_float32_greedy_ids(smollm2: tuple[Path, Any]) -> None:
    out, reference = smollm2
    result = compare(
        SMOLLM2, out / "smollm2-135m-F32.gguf", prompt=FRANCE, n=32, binary=BINARY, reference=reference
    )
    assert len(result.llama_ids) == 32 and result.equal, result.describe()
    assert result.hf_ids[0] == 7042  # " Paris"
    assert set(result.suppressed) == {0, 2}  # <|endoftext|> and <|im_end|>, as llama.cpp's --ignore-eos


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1"])
def test_smollm2_quantised_ids_follow_the_reference_with_the_difference_said(
    smollm2: tuple[Path, Any], quant: str
) -> None:
    out, reference = smollm2
    result = compare(SMOLLM2, out / f"smollm2-135m-{quant}.gguf", prompt=FRANCE, n=16, binary=BINARY,
                     reference=reference)  # fmt: skip
    assert result.llama_ids[:2] == result.hf_ids[:2] == [7042, 30]  # " Paris", "."
    same = sum(a == b for a, b in zip(result.hf_ids, result.llama_ids, strict=True))
    assert result.agreement == same / 16
    if result.first_divergence is not None:
        i = result.first_divergence
        assert result.hf_ids[:i] == result.llama_ids[:i] and result.hf_ids[i] != result.llama_ids[i]
        assert (
            result.logit_difference is not None and result.logit_difference > 0
        )  # the reference preferred its own
