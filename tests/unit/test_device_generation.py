"""The agent profiles a decoder's generation through the profiler the model names, importing no framework."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dit.device.adapter import GeneratesTokens, load_ref
from dit.device.agent import generate_tokens
from dit.models.hf_decoder import HFDecoderModel

CALLS: list[dict[str, Any]] = []


def fake_profiler(model: object, **kwargs: Any) -> dict[str, Any]:
    CALLS.append({"model": model, **kwargs})
    return {"tokens": kwargs["tokens"], "records": 0}


class _Decoder:
    generation_profiler = f"{__name__}:fake_profiler"

    def generate(self, prompt: Any, max_new_tokens: int, stage_hook: Any = None) -> list[int]:
        return []


def test_the_agent_calls_the_profiler_the_model_names(tmp_path: Path) -> None:
    model = _Decoder()
    assert isinstance(model, GeneratesTokens)
    record = generate_tokens(model, 4, 2, 1, 123, tmp_path)
    assert record == {"tokens": 4, "records": 0}
    (call,) = CALLS
    assert call["model"] is model and call["results"] == tmp_path and call["origin_mono_ns"] == 123
    assert (call["repetitions"], call["warmup"]) == (2, 1) and callable(call["say"])


def test_the_decoders_name_their_profiler() -> None:
    assert HFDecoderModel.generation_profiler == "dit.models.decoder_profile:profile_generation"
    assert callable(load_ref(HFDecoderModel.generation_profiler))
