"""llama.cpp (F32 GGUF, greedy) generates the same 8 token ids as the Hugging Face model, same seeded weights.

Slow: converts the reduced decoders and runs the built ``llama-completion``; skipped with the reason
when the binary is not built or the vendored converter is not unpacked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dit_llamacpp import models
from dit_llamacpp.equivalence import compare

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
